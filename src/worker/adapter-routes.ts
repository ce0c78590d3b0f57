import type { FastifyInstance } from 'fastify';
import { AdapterDrainBodySchema, AdapterLoadBodySchema, isAdapterName, type AdapterDrainBody, type AdapterLoadBody } from '../protocol/adapters.js';
import { EbbError } from '../protocol/errors.js';
import type { WorkerAdapters } from './adapters.js';
import type { WorkerRuntime } from './phase.js';

type Params = { name: string };

/**
 * The Admin API's adapter routes (behind the same admin guard as /engine/drain: `actor` checks the
 * token and names the caller). drain and unload close admission for the adapter at once and answer
 * 202 with its state (`draining`; 200 when it is `unloaded` already); its unload follows once its
 * in-flight reaches 0, watched on GET /engine/status. load answers once it is resident.
 */
export function addAdapterRoutes(app: FastifyInstance, runtime: () => WorkerRuntime, actor: (authorization: string | undefined, ip: string) => string): void {
  const adaptersOf = (name: string): WorkerAdapters => {
    const adapters = runtime().adapters;
    if (adapters === undefined) throw new EbbError('adapter_not_found', `this worker's engine (${runtime().engine.kind}) serves no adapters`);
    if (!isAdapterName(name)) throw new EbbError('invalid_request', `"${name}" is not an adapter name`, { param: 'name' });
    return adapters;
  };
  const drain = async (req: { params: Params; body: AdapterDrainBody | undefined; headers: { authorization?: string | undefined }; ip: string }, reply: { code(n: number): { send(b: unknown): unknown } }) => {
    const who = actor(req.headers.authorization, req.ip);
    const adapters = adaptersOf(req.params.name);
    const status = adapters.drain(req.params.name, `${req.body?.reason ?? 'admin'} (by ${who})`);
    return reply.code(status.state === 'unloaded' ? 200 : 202).send(status);
  };
  app.post<{ Params: Params; Body: AdapterDrainBody | undefined }>('/engine/adapters/:name/drain', { schema: { body: AdapterDrainBodySchema } }, drain);
  app.post<{ Params: Params; Body: AdapterDrainBody | undefined }>('/engine/adapters/:name/unload', { schema: { body: AdapterDrainBodySchema } }, drain);
  app.post<{ Params: Params; Body: AdapterLoadBody | undefined }>('/engine/adapters/:name/load', { schema: { body: AdapterLoadBodySchema } }, async (req) => {
    actor(req.headers.authorization, req.ip);
    const adapters = adaptersOf(req.params.name);
    return adapters.load({ name: req.params.name, path: req.body?.path });
  });
}
