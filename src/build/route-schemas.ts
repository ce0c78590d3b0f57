import * as admin from '../protocol/admin.js';
import * as requestPlane from '../protocol/request-plane.js';
import * as openai from '../frontend/api/openai-schema.js';
import * as embeddings from '../frontend/api/embeddings-schema.js';

/** A JSON Schema some route validates bodies with: where it is exported, and under which name. */
export interface RouteSchema {
  module: string;
  name: string;
  schema: object;
}

/**
 * Every schema the routes' bodies are validated with: what the modules holding them export under a
 * name ending in "schema". The build precompiles these; a test checks them against the meta-schema.
 */
export function routeSchemas(): RouteSchema[] {
  const modules: Record<string, Record<string, unknown>> = { admin, 'request-plane': requestPlane, 'openai-schema': openai, 'embeddings-schema': embeddings };
  return Object.entries(modules).flatMap(([module, exports]) =>
    Object.entries(exports)
      .filter((e): e is [string, object] => /schema$/i.test(e[0]) && typeof e[1] === 'object' && e[1] !== null)
      .map(([name, schema]) => ({ module, name, schema })),
  );
}
