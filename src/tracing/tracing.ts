import type * as Api from '@opentelemetry/api';
import type { Logger } from 'pino';

/**
 * OpenTelemetry tracing, on only where an OTLP endpoint is named (OTEL_EXPORTER_OTLP_ENDPOINT,
 * OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, or --otlp-traces-endpoint, which sets the latter). Off, nothing
 * of OpenTelemetry is loaded, not even its API: every span helper in src/tracing/ starts with
 * `tracing()` and returns at once when it is undefined, so a request pays one check per place
 * where a span would start and allocates nothing. On, the SDK (sdk-trace-base, the OTLP exporter)
 * is loaded once at start, and contexts are passed explicitly (no AsyncLocalStorage context
 * manager: it would cost every promise of every request).
 *
 * The standard variables apply: OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL (http/protobuf, the default,
 * or http/json), _HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE..., OTEL_SERVICE_NAME,
 * OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER[_ARG] (default parentbased_always_on: a client's
 * sampled traceparent is followed), OTEL_BSP_* (the batch processor), OTEL_SDK_DISABLED.
 */

/** What a process traces with, once started. */
export interface Tracing {
  api: typeof Api;
  tracer: Api.Tracer;
  /** Writes W3C traceparent (and tracestate) headers of a context into a carrier, and reads them back. */
  propagator: Api.TextMapPropagator;
  /** Flushes the spans not yet exported (bounded), then stops exporting. */
  shutdown(timeoutMs: number): Promise<void>;
}

let current: Tracing | undefined;

/** The process's tracing, or undefined when it is off: the one check on every hot path. */
export function tracing(): Tracing | undefined {
  return current;
}

export type OtlpProtocol = 'http/protobuf' | 'http/json';

export interface TracingConfig {
  protocol: OtlpProtocol;
  /** Where spans go, as the exporter will resolve it (for the start log line). */
  endpoint: string;
}

/** The OTLP protocols the exporters speak; gRPC is not one of them (the collector's 4318 speaks both of these). */
function protocolOf(env: NodeJS.ProcessEnv): OtlpProtocol {
  const p = (env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL ?? env.OTEL_EXPORTER_OTLP_PROTOCOL ?? 'http/protobuf').trim();
  if (p === 'http/protobuf' || p === 'http/json') return p;
  throw new Error(`OTLP protocol "${p}" is not supported: ebb exports traces over OTLP/HTTP, http/protobuf (the default) or http/json (a collector's port 4318)`);
}

/**
 * Whether tracing is asked for, and how: undefined when no OTLP endpoint is named, or
 * OTEL_SDK_DISABLED=true, or OTEL_TRACES_EXPORTER=none. Throws on a protocol it cannot speak.
 */
export function tracingConfig(env: NodeJS.ProcessEnv = process.env): TracingConfig | undefined {
  if (env.OTEL_SDK_DISABLED?.trim().toLowerCase() === 'true') return undefined;
  const exporter = env.OTEL_TRACES_EXPORTER?.trim();
  if (exporter === 'none') return undefined;
  if (exporter !== undefined && exporter !== '' && exporter !== 'otlp') throw new Error(`OTEL_TRACES_EXPORTER "${exporter}" is not supported: ebb exports traces over OTLP (otlp) or not at all (none)`);
  const specific = env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT?.trim();
  const generic = env.OTEL_EXPORTER_OTLP_ENDPOINT?.trim();
  if (!specific && !generic) return undefined;
  return { protocol: protocolOf(env), endpoint: specific || `${generic!.replace(/\/+$/, '')}/v1/traces` };
}

/** --otlp-traces-endpoint: a collector's traces URL; one without a path gets OTLP/HTTP's /v1/traces. */
export function tracesEndpointUrl(value: string): string {
  const url = new URL(value);
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new Error(`expected an http:// or https:// URL (OTLP/HTTP), got "${value}"`);
  if (url.pathname === '/' || url.pathname === '') url.pathname = '/v1/traces';
  return url.toString();
}

/**
 * Starts tracing for this process when it is asked for (see tracingConfig), as `service`
 * (OTEL_SERVICE_NAME overrides it) with `instance` as its service.instance.id. Loads the SDK only
 * then. Resolves with the config it started with, or undefined when tracing stays off.
 */
export async function startTracing(service: string, instance: string, log: Logger, env: NodeJS.ProcessEnv = process.env): Promise<TracingConfig | undefined> {
  const config = tracingConfig(env);
  if (config === undefined || current !== undefined) return config;
  const [api, core, resources, base, exporterModule] = await Promise.all([
    exportsOf(import('@opentelemetry/api'), 'ROOT_CONTEXT'),
    exportsOf(import('@opentelemetry/core'), 'W3CTraceContextPropagator'),
    exportsOf(import('@opentelemetry/resources'), 'resourceFromAttributes'),
    exportsOf(import('@opentelemetry/sdk-trace-base'), 'BasicTracerProvider'),
    config.protocol === 'http/json' ? exportsOf(import('@opentelemetry/exporter-trace-otlp-http'), 'OTLPTraceExporter') : exportsOf(import('@opentelemetry/exporter-trace-otlp-proto'), 'OTLPTraceExporter'),
  ]);
  // The SDK's own complaints (an export that failed, a bad variable) go to the log, not to nowhere.
  api.diag.setLogger(
    {
      error: (message, ...args) => log.warn({ event: 'otel_error', detail: args.map(String).join(' ') }, `OpenTelemetry: ${message}`),
      warn: (message, ...args) => log.warn({ event: 'otel_warning', detail: args.map(String).join(' ') }, `OpenTelemetry: ${message}`),
      info: () => undefined,
      debug: () => undefined,
      verbose: () => undefined,
    },
    api.DiagLogLevel.WARN,
  );
  // Ours first; OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME (the env detector) over them.
  const resource = resources
    .defaultResource()
    .merge(resources.resourceFromAttributes({ 'service.name': service, 'service.instance.id': instance, 'service.namespace': 'ebb' }))
    .merge(resources.detectResources({ detectors: [resources.envDetector] }));
  const exporter = new exporterModule.OTLPTraceExporter();
  const provider = new base.BasicTracerProvider({ resource, spanProcessors: [new base.BatchSpanProcessor(exporter)] });
  const tracer = provider.getTracer('ebb');
  current = {
    api,
    tracer,
    propagator: new core.W3CTraceContextPropagator(),
    async shutdown(timeoutMs) {
      current = undefined;
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([provider.shutdown().catch(() => undefined), new Promise<void>((resolve) => (timer = setTimeout(resolve, timeoutMs)))]);
      clearTimeout(timer);
    },
  };
  log.info({ event: 'tracing_started', otlp_endpoint: config.endpoint, otlp_protocol: config.protocol, service_name: env.OTEL_SERVICE_NAME ?? service, sampler: env.OTEL_TRACES_SAMPLER ?? 'parentbased_always_on' }, `tracing: spans to ${config.endpoint} (${config.protocol})`);
  return config;
}

/**
 * A CommonJS package's exports, however it was imported: Node gives its named exports on the
 * namespace, the bundle (esbuild) only as `default`. `key`: one export it must have.
 */
async function exportsOf<T extends object>(loading: Promise<T>, key: keyof T): Promise<T> {
  const m = (await loading) as T & { default?: T };
  return m.default !== undefined && typeof m.default === 'object' && key in m.default ? m.default : m;
}

/** Exports what is left (at most `timeoutMs`) and stops; a no-op when tracing is off. Call before the process exits. */
export async function stopTracing(timeoutMs = 2000): Promise<void> {
  await current?.shutdown(timeoutMs);
}
