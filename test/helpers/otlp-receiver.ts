/**
 * A test OTLP/HTTP trace receiver: POST /v1/traces on a loopback port, in either encoding the
 * exporters speak (http/protobuf, decoded by the small protobuf reader below; http/json), gzipped
 * or not. It keeps every span it receives, with its resource's attributes, and lets a test wait for
 * the spans it expects. Nothing is stubbed on ebb's side: its processes export with the real SDK.
 */
import { once } from 'node:events';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { gunzipSync } from 'node:zlib';
import { bounded } from './processes.js';

export type AttrValue = string | number | boolean | AttrValue[] | null;

export interface ReceivedSpan {
  traceId: string;
  spanId: string;
  /** '' for a span without a parent. */
  parentSpanId: string;
  name: string;
  /** OTLP's: 1 internal, 2 server, 3 client. */
  kind: number;
  startNs: bigint;
  endNs: bigint;
  attributes: Record<string, AttrValue>;
  events: Array<{ name: string; attributes: Record<string, AttrValue> }>;
  links: Array<{ traceId: string; spanId: string }>;
  /** OTLP's status code: 0 unset, 1 ok, 2 error. */
  status: { code: number; message: string };
  /** The resource of the process that exported it (service.name, service.instance.id, ...). */
  resource: Record<string, AttrValue>;
}

// ---- a protobuf reader, just enough for ExportTraceServiceRequest -----------------------------

class Reader {
  pos = 0;
  constructor(readonly buf: Buffer) {}
  get done(): boolean {
    return this.pos >= this.buf.length;
  }
  varint(): bigint {
    let result = 0n;
    let shift = 0n;
    for (;;) {
      const b = this.buf[this.pos++]!;
      result |= BigInt(b & 0x7f) << shift;
      if ((b & 0x80) === 0) return result;
      shift += 7n;
    }
  }
  /** The next field: its number, its wire type, and its value (a sub-buffer for length-delimited ones). */
  field(): { no: number; wire: number; value: bigint | Buffer } {
    const key = Number(this.varint());
    const no = key >>> 3;
    const wire = key & 7;
    if (wire === 0) return { no, wire, value: this.varint() };
    if (wire === 1) {
      const v = this.buf.readBigUInt64LE(this.pos);
      this.pos += 8;
      return { no, wire, value: v };
    }
    if (wire === 5) {
      const v = BigInt(this.buf.readUInt32LE(this.pos));
      this.pos += 4;
      return { no, wire, value: v };
    }
    if (wire === 2) {
      const len = Number(this.varint());
      const v = this.buf.subarray(this.pos, this.pos + len);
      this.pos += len;
      return { no, wire, value: v };
    }
    throw new Error(`protobuf wire type ${wire} not expected`);
  }
}

function* fields(buf: Buffer): Generator<{ no: number; wire: number; value: bigint | Buffer }> {
  const r = new Reader(buf);
  while (!r.done) yield r.field();
}

function anyValue(buf: Buffer): AttrValue {
  for (const f of fields(buf)) {
    const v = f.value;
    switch (f.no) {
      case 1:
        return (v as Buffer).toString('utf8');
      case 2:
        return (v as bigint) !== 0n;
      case 3:
        return Number(BigInt.asIntN(64, v as bigint));
      case 4: {
        const b = Buffer.alloc(8);
        b.writeBigUInt64LE(v as bigint);
        return b.readDoubleLE(0);
      }
      case 5:
        return [...fields(v as Buffer)].filter((x) => x.no === 1).map((x) => anyValue(x.value as Buffer));
      default:
        return null;
    }
  }
  return null;
}

function keyValues(list: Buffer[]): Record<string, AttrValue> {
  const out: Record<string, AttrValue> = {};
  for (const kv of list) {
    let key = '';
    let value: AttrValue = null;
    for (const f of fields(kv)) {
      if (f.no === 1) key = (f.value as Buffer).toString('utf8');
      else if (f.no === 2) value = anyValue(f.value as Buffer);
    }
    out[key] = value;
  }
  return out;
}

const hex = (b: Buffer) => b.toString('hex');

function protoSpan(buf: Buffer, resource: Record<string, AttrValue>): ReceivedSpan {
  const s: ReceivedSpan = { traceId: '', spanId: '', parentSpanId: '', name: '', kind: 0, startNs: 0n, endNs: 0n, attributes: {}, events: [], links: [], status: { code: 0, message: '' }, resource };
  const attrs: Buffer[] = [];
  for (const f of fields(buf)) {
    const v = f.value;
    if (f.no === 1) s.traceId = hex(v as Buffer);
    else if (f.no === 2) s.spanId = hex(v as Buffer);
    else if (f.no === 4) s.parentSpanId = hex(v as Buffer);
    else if (f.no === 5) s.name = (v as Buffer).toString('utf8');
    else if (f.no === 6) s.kind = Number(v);
    else if (f.no === 7) s.startNs = v as bigint;
    else if (f.no === 8) s.endNs = v as bigint;
    else if (f.no === 9) attrs.push(v as Buffer);
    else if (f.no === 11) {
      let name = '';
      const ea: Buffer[] = [];
      for (const e of fields(v as Buffer)) {
        if (e.no === 2) name = (e.value as Buffer).toString('utf8');
        else if (e.no === 3) ea.push(e.value as Buffer);
      }
      s.events.push({ name, attributes: keyValues(ea) });
    } else if (f.no === 13) {
      const link = { traceId: '', spanId: '' };
      for (const l of fields(v as Buffer)) {
        if (l.no === 1) link.traceId = hex(l.value as Buffer);
        else if (l.no === 2) link.spanId = hex(l.value as Buffer);
      }
      s.links.push(link);
    } else if (f.no === 15) {
      for (const st of fields(v as Buffer)) {
        if (st.no === 2) s.status.message = (st.value as Buffer).toString('utf8');
        else if (st.no === 3) s.status.code = Number(st.value);
      }
    }
  }
  s.attributes = keyValues(attrs);
  return s;
}

function decodeProtobuf(body: Buffer): ReceivedSpan[] {
  const out: ReceivedSpan[] = [];
  for (const rs of fields(body)) {
    if (rs.no !== 1) continue;
    let resource: Record<string, AttrValue> = {};
    const scopes: Buffer[] = [];
    for (const f of fields(rs.value as Buffer)) {
      if (f.no === 1) resource = keyValues([...fields(f.value as Buffer)].filter((x) => x.no === 1).map((x) => x.value as Buffer));
      else if (f.no === 2) scopes.push(f.value as Buffer);
    }
    for (const scope of scopes) for (const f of fields(scope)) if (f.no === 2) out.push(protoSpan(f.value as Buffer, resource));
  }
  return out;
}

// ---- http/json ---------------------------------------------------------------------------------

type JsonAny = { stringValue?: string; boolValue?: boolean; intValue?: number | string; doubleValue?: number; arrayValue?: { values?: JsonAny[] } };
type JsonKv = { key: string; value?: JsonAny };

function jsonValue(v: JsonAny | undefined): AttrValue {
  if (v === undefined) return null;
  if (v.stringValue !== undefined) return v.stringValue;
  if (v.boolValue !== undefined) return v.boolValue;
  if (v.intValue !== undefined) return Number(v.intValue);
  if (v.doubleValue !== undefined) return v.doubleValue;
  if (v.arrayValue !== undefined) return (v.arrayValue.values ?? []).map(jsonValue);
  return null;
}

const jsonKvs = (list: JsonKv[] | undefined) => Object.fromEntries((list ?? []).map((kv) => [kv.key, jsonValue(kv.value)]));

/** OTLP/JSON ids are hex (the spec's exception to protobuf JSON's base64); base64 is read too, for safety. */
const jsonId = (id: string | undefined, bytes: number) => (id === undefined || id === '' ? '' : /^[0-9a-f]+$/i.test(id) && id.length === bytes * 2 ? id.toLowerCase() : Buffer.from(id, 'base64').toString('hex'));

function decodeJson(body: Buffer): ReceivedSpan[] {
  const req = JSON.parse(body.toString('utf8')) as {
    resourceSpans?: Array<{
      resource?: { attributes?: JsonKv[] };
      scopeSpans?: Array<{
        spans?: Array<{
          traceId: string;
          spanId: string;
          parentSpanId?: string;
          name: string;
          kind: number;
          startTimeUnixNano: string | number;
          endTimeUnixNano: string | number;
          attributes?: JsonKv[];
          events?: Array<{ name: string; attributes?: JsonKv[] }>;
          links?: Array<{ traceId: string; spanId: string }>;
          status?: { code?: number; message?: string };
        }>;
      }>;
    }>;
  };
  const out: ReceivedSpan[] = [];
  for (const rs of req.resourceSpans ?? []) {
    const resource = jsonKvs(rs.resource?.attributes);
    for (const ss of rs.scopeSpans ?? [])
      for (const s of ss.spans ?? [])
        out.push({
          traceId: jsonId(s.traceId, 16),
          spanId: jsonId(s.spanId, 8),
          parentSpanId: jsonId(s.parentSpanId, 8),
          name: s.name,
          kind: s.kind,
          startNs: BigInt(s.startTimeUnixNano),
          endNs: BigInt(s.endTimeUnixNano),
          attributes: jsonKvs(s.attributes),
          events: (s.events ?? []).map((e) => ({ name: e.name, attributes: jsonKvs(e.attributes) })),
          links: (s.links ?? []).map((l) => ({ traceId: jsonId(l.traceId, 16), spanId: jsonId(l.spanId, 8) })),
          status: { code: s.status?.code ?? 0, message: s.status?.message ?? '' },
          resource,
        });
  }
  return out;
}

// ---- the receiver ------------------------------------------------------------------------------

export class OtlpReceiver {
  readonly spans: ReceivedSpan[] = [];
  /** The content types of the exports received (application/x-protobuf, application/json). */
  readonly contentTypes = new Set<string>();
  url = '';
  private waiters: Array<{ pred: () => boolean; resolve: () => void }> = [];

  private constructor(private readonly server: Server) {}

  static async start(): Promise<OtlpReceiver> {
    const server = createServer();
    const r = new OtlpReceiver(server);
    server.on('request', (req, res) => void r.handle(req).then(
      (type) => {
        res.writeHead(200, { 'content-type': type });
        res.end(type === 'application/json' ? '{}' : '');
      },
      (err: unknown) => {
        res.writeHead(400, { 'content-type': 'text/plain' });
        res.end((err as Error).message);
      },
    ));
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    r.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    return r;
  }

  /** The variables that make an ebb process export here, over `protocol`, batches at most 100 ms old. */
  env(protocol: 'http/protobuf' | 'http/json' = 'http/protobuf'): Record<string, string> {
    return { OTEL_EXPORTER_OTLP_ENDPOINT: this.url, OTEL_EXPORTER_OTLP_PROTOCOL: protocol, OTEL_BSP_SCHEDULE_DELAY: '100' };
  }

  private async handle(req: IncomingMessage): Promise<string> {
    if (req.method !== 'POST' || req.url !== '/v1/traces') throw new Error(`unexpected ${req.method} ${req.url}`);
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    let body = Buffer.concat(chunks);
    if (req.headers['content-encoding'] === 'gzip') body = gunzipSync(body);
    const type = String(req.headers['content-type'] ?? '').split(';')[0]!.trim();
    this.contentTypes.add(type);
    const spans = type === 'application/json' ? decodeJson(body) : decodeProtobuf(body);
    this.spans.push(...spans);
    this.waiters = this.waiters.filter((w) => {
      if (!w.pred()) return true;
      w.resolve();
      return false;
    });
    return type;
  }

  /** The spans of `traceId`. */
  trace(traceId: string): ReceivedSpan[] {
    return this.spans.filter((s) => s.traceId === traceId);
  }

  /** Resolves once `pred` holds over the spans received (bounded: a failing wait names `what`). */
  async waitFor(pred: (spans: ReceivedSpan[]) => boolean, what: string): Promise<void> {
    if (pred(this.spans)) return;
    await bounded(new Promise<void>((resolve) => this.waiters.push({ pred: () => pred(this.spans), resolve })), `the OTLP receiver to get ${what} (got ${this.spans.length} spans: ${[...new Set(this.spans.map((s) => s.name))].join(', ')})`);
  }

  async stop(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
