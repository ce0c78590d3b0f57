import { parseToolSyntax } from '../engine/openai-engine-tools.js';
import type { ToolCallSyntax } from '../protocol/tools.js';
import { Command, InvalidArgumentError, Option } from 'commander';
import {
  ADMIN_TOKEN_ENV,
  assertAdminBindAllowed,
  assertRequestBindAllowed,
  createAdminGuard,
  loadAdminTokens,
  loadRequestToken,
  REQUEST_TOKEN_ENV,
} from '../common/admin-auth.js';
import { createLogger } from '../common/logger.js';
import type { EngineSpec } from '../engine/create-engine.js';
import { ENGINE_KINDS, OPENAI_ENGINE_DEFAULTS, QUIESCENCE_MODES, type EngineKind, type QuiescenceMode } from '../engine/openai-engine-options.js';
import { MOCKER_DEFAULTS } from '../engine/mocker.js';
import { DEFAULT_BLOCK_SIZE } from '../protocol/block-hash.js';
import { newWorkerId, startWorker, type RunningWorker } from '../worker/worker.js';
import { CliError } from './cli-error.js';
import type { WorkerMode } from '../protocol/worker-mode.js';
import { discoveryFlag, intOption, msOption, portOption, workerIdOption } from './options.js';
import { llamaCppOptions, llamaCppSpec, servedModelName, type LlamaCppFlags } from './llama-cpp-flags.js';
import { collectAdapterName, loraOption } from './lora-flag.js';
import { apiKeyFileOption, loadApiGuard } from './api-key-flag.js';
import type { AdapterSource } from '../engine/engine-adapters.js';
import type { SelfPodSetup } from '../k8s/self-pod-setup.js';
import { DEFAULT_MAX_EMBEDDING_TOKENS } from '../worker/embedding-tokens.js';
import { exitTraced, startTracingOr } from './tracing-start.js';
import { DISRUPTION_SOURCES, type DisruptionSourceName } from '../disruption/notice.js';
import { AWS_ENDPOINT_ENV } from '../disruption/aws.js';
import { GCE_HOST_ENV } from '../disruption/gcp.js';
import { AZURE_ENDPOINT_ENV } from '../disruption/azure.js';

interface WorkerFlags extends LlamaCppFlags {
  engine: string;
  model?: string;
  mode: WorkerMode;
  host: string;
  port: number;
  systemHost: string;
  advertiseHost?: string;
  adminTokenFile?: string;
  requestTokenFile?: string;
  openaiPort?: number;
  apiKeyFile?: string;
  systemPort: number;
  discovery: string;
  workerId?: string;
  leaseTtlMs?: number;
  shutdownGraceMs: number;
  drainTimeoutMs: number;
  priorityReserveSlots?: number;
  maxEmbeddingTokens: number;
  loraDir: string[];
  mockerTtftMs: number;
  mockerItlMs: number;
  mockerBatchSlots: number;
  mockerMaxQueue: number;
  mockerIdleness: 'exact' | 'unknown';
  mockerKvReporting: 'exact' | 'unsupported';
  mockerLoadMs: number;
  mockerFailOnPrompt: string;
  registerTimeoutMs: number;
  drainIntentTtlMs: number;
  mockerMaxContext: number;
  mockerKvCache: 'on' | 'off';
  mockerKvBlocks: number;
  mockerKvBlockSize: number;
  mockerPrefillTokensPerS: number;
  mockerEmbeddingDim: number;
  mockerLora: string[];
  lora: AdapterSource[];
  engineMaxLoras: number;
  mockerLoraSlots: number;
  mockerLoraLoadMs: number;
  kvTransferTtlMs: number;
  engineUrl?: string;
  engineKind: EngineKind;
  engineCmd?: string;
  engineQuiescence: QuiescenceMode;
  engineStopTimeoutMs: number;
  engineLoadTimeoutMs: number;
  engineModel?: string;
  engineKvEvents?: string;
  engineKvEventsTopic: string;
  engineKvEventsReplay?: string;
  engineKvBlockSize: number;
  engineToolSyntax?: ToolCallSyntax;
  engineEmbeddings?: boolean;
  k8sSelfPod?: string | boolean;
  kubeconfig?: string;
  disruptionSource: DisruptionSourceName[];
  disruptionMarginMs: number;
  disruptionLeadMs: number;
  disruptionPollMs: number;
  disruptionOnCordon?: boolean;
}

export function workerCommand(): Command {
  const command = new Command('worker')
    .description('run one worker: an engine, its request plane and its system-status server (Admin API)')
    .addOption(new Option('--engine <name>', 'inference engine: the simulated mocker, llama-cpp (a GGUF model in this process), or openai (an OpenAI-compatible engine server)').choices(['mocker', 'llama-cpp', 'openai']).default('mocker'))
    .option('--model <name>', 'model name served (default: ebb-mock; with llama-cpp the GGUF file name)')
    .addOption(new Option('--mode <mode>', 'serving mode').choices(['aggregated', 'prefill', 'decode']).default('aggregated'))
    .option('--host <addr>', 'request-plane bind address', '127.0.0.1')
    .option('--port <n>', 'request-plane port (0 = any free port)', portOption, 0)
    .option('--system-host <addr>', 'system-status server bind address', '127.0.0.1')
    .option('--advertise-host <host>', 'host name or address peers use to reach this worker (default: the bound address; the hostname when bound to 0.0.0.0 or ::)')
    .option('--system-port <n>', 'system-status server port (0 = any free port)', portOption, 0)
    .option('--admin-token-file <path>', `file holding the admin bearer token for the Admin API: drain, resume and every read but /live, /health and /metrics (env ${ADMIN_TOKEN_ENV}); required when --system-host is not loopback`)
    .option('--request-token-file <path>', `file holding the request-plane bearer token, shared with the fleet's frontends and workers (env ${REQUEST_TOKEN_ENV}); required when --host is not loopback`)
    .option('--openai-port <n>', "also serve the OpenAI API for this worker alone on this port, bound to --host (for an InferencePool's endpoint picker; 0 = any free port); its requests go through the worker's admission", portOption)
    .addOption(apiKeyFileOption(' of --openai-port'))
    .addOption(discoveryFlag())
    .option('--worker-id <id>', 'worker id (default: random w-xxxxxxxx; at most 253 bytes, no "/", controls or whitespace, not . or ..)', workerIdOption)
    .option('--register-timeout-ms <n>', 'at start, how long to keep retrying discovery registration before giving up', msOption(0), 30_000)
    .addOption(new Option('--drain-intent-ttl-ms <n>', 'etcd discovery: how long a drain outlives this process (a restart with the same --worker-id comes back drained; resume clears it)').argParser(msOption(1000)).default(24 * 3600_000, '24h'))
    .option('--lease-ttl-ms <n>', 'discovery lease TTL (file default 3000, etcd default 10000)', msOption(1))
    .option('--shutdown-grace-ms <n>', 'after SIGTERM, keep refusing while routers converge', msOption(0), 1000)
    .option('--priority-reserve-slots <n>', 'batch slots flex requests leave free for priority and default ones: flex is refused (worker_overloaded, it waits in the frontend\'s queue) unless a slot beyond them is free (default: 1 where the engine has >= 4 batch slots, else 0)', intOption(0))
    .option('--max-embedding-tokens <n>', 'the most tokens one /v1/embeddings request may carry, all its inputs together (OpenAI\'s bound); past it the request is refused 400 naming input, before any work. Texts are counted by the engine\'s tokenizer when their bytes could pass it', intOption(1), DEFAULT_MAX_EMBEDDING_TOKENS)
    .option('--drain-timeout-ms <n>', 'after the grace, how long streams may run before they are handed off to other workers (cut only where that fails)', msOption(0), 30_000)
    .option('--mocker-ttft-ms <n>', 'mocker base time to first token (with the KV cache off it grows with prompt length; on, prefill adds the uncached tokens\' time)', msOption(0), MOCKER_DEFAULTS.ttftMs)
    .option('--mocker-itl-ms <n>', 'mocker inter-token latency', msOption(0), MOCKER_DEFAULTS.itlMs)
    .option('--mocker-batch-slots <n>', 'mocker concurrent sequences; more queue', intOption(1), MOCKER_DEFAULTS.batchSlots)
    .option('--mocker-max-queue <n>', 'queued sequences past which the worker answers worker_overloaded', intOption(0), MOCKER_DEFAULTS.maxQueue)
    .addOption(
      new Option('--mocker-idleness <mode>', 'idleness probe: exact, or unknown to simulate an engine that cannot tell (never drains)')
        .choices(['exact', 'unknown'])
        .default('exact'),
    )
    .addOption(
      new Option('--mocker-kv-reporting <mode>', 'prefill workers: exact, or unsupported to simulate an engine that cannot report KV transfers')
        .choices(['exact', 'unsupported'])
        .default('exact'),
    )
    .option('--mocker-max-context <n>', 'mocker model length in tokens: a request without max_tokens generates until prompt + completion fill it', intOption(1), MOCKER_DEFAULTS.maxContext)
    .addOption(
      new Option('--mocker-kv-cache <mode>', 'mocker prefix KV cache: on (prefill costs time per uncached prompt token; KV events on GET /kv/events), or off (the plain timing model)')
        .choices(['on', 'off'])
        .default(MOCKER_DEFAULTS.kvCache),
    )
    .option('--mocker-kv-blocks <n>', 'mocker prefix cache capacity in blocks (LRU eviction of blocks no running sequence holds)', intOption(1), MOCKER_DEFAULTS.kvBlocks)
    .option('--mocker-kv-block-size <n>', 'mocker prefix cache tokens per block', intOption(1), MOCKER_DEFAULTS.kvBlockSize)
    .option('--mocker-prefill-tokens-per-s <n>', 'mocker prefill compute with the KV cache on: uncached prompt tokens per second, shared by concurrent prefills', intOption(1), MOCKER_DEFAULTS.prefillTokensPerS)
    .option('--mocker-embedding-dim <n>', 'mocker embedding size: /v1/embeddings vectors have this many dimensions (fewer with `dimensions`)', intOption(1), MOCKER_DEFAULTS.embeddingDim)
    .addOption(new Option('--mocker-lora <name>', 'mocker LoRA adapter it can load, named by clients as their `model` (repeatable)').argParser(collectAdapterName).default([] as string[], 'none'))
    .option('--mocker-lora-slots <n>', 'mocker LoRA adapters resident at once (the least recently used idle one is evicted for another)', intOption(1), MOCKER_DEFAULTS.lora.slots)
    .option('--mocker-lora-load-ms <n>', 'mocker time to load a LoRA adapter', msOption(0), MOCKER_DEFAULTS.lora.loadMs)
    .option('--mocker-load-ms <n>', 'mocker simulated model loading before the worker registers', msOption(0), MOCKER_DEFAULTS.loadMs)
    .addOption(new Option('--mocker-fail-on-prompt <text>', 'mocker simulates its engine dying when a prompt contains this text (tests)').default(MOCKER_DEFAULTS.failOnPrompt, 'never'))
    .option('--kv-transfer-ttl-ms <n>', 'prefill workers: how long computed KV waits for its decode peer (llama-cpp: also a hand-off KV state for the next worker)', msOption(1), MOCKER_DEFAULTS.kvTransferTtlMs)
    .option('--k8s-self-pod [namespace/name]', 'follow the ebb.dev/drain annotation of this pod and write the state back (default: env POD_NAMESPACE / POD_NAME from the downward API)')
    .option('--kubeconfig <path>', 'with --k8s-self-pod outside a cluster: the kubeconfig to use (default: in-cluster credentials, else KUBECONFIG or ~/.kube/config)')
    .addOption(
      new Option(
        '--disruption-source <name>',
        `drain ahead of the platform's notices (repeatable): aws (EC2 spot instance-action and scheduled maintenance, IMDSv2; env ${AWS_ENDPOINT_ENV}), ` +
          `gcp (instance/preempted and maintenance-event; env ${GCE_HOST_ENV}), azure (Scheduled Events Preempt/Terminate/Reboot/Redeploy; env ${AZURE_ENDPOINT_ENV}), ` +
          'k8s (this pod\'s DisruptionTarget condition and its node\'s removal taints; needs --k8s-self-pod). A notice drains with a deadline at its time less --disruption-margin-ms; a withdrawn one resumes the drain it started',
      )
        .argParser(collectDisruptionSource)
        .default([] as DisruptionSourceName[], 'none'),
    )
    .option('--disruption-margin-ms <n>', 'streams still running this long before a notice\'s time are handed off to other workers', msOption(0), 10_000)
    .option('--disruption-lead-ms <n>', 'a notice further ahead than this (plus the margin) starts its drain only then (scheduled maintenance days ahead)', msOption(0), 600_000)
    .option('--disruption-poll-ms <n>', 'aws, azure: how often their metadata endpoint is read (gcp and k8s are told of changes)', msOption(100), 5000)
    .option('--disruption-on-cordon', 'k8s: a cordoned node (unschedulable) drains too (default: a hint, logged)')
    .option('--engine-url <url>', '--engine openai: the OpenAI-compatible engine server (default with --engine-cmd: http://127.0.0.1:{port})')
    .addOption(new Option('--engine-kind <kind>', '--engine openai: which server it is, for its idleness signal').choices([...ENGINE_KINDS]).default('generic'))
    .option('--engine-cmd <command>', '--engine openai: start the engine as this worker\'s child, {port} replaced by a free port; stopped after the worker drained')
    .addOption(
      new Option('--engine-quiescence <mode>', '--engine openai: probe (the engine\'s own pending-work signal, fail-closed) or trust-inflight (ebb\'s own count only: weaker)')
        .choices([...QUIESCENCE_MODES])
        .default('probe'),
    )
    .option('--engine-stop-timeout-ms <n>', '--engine-cmd: after SIGTERM, how long the engine may take before SIGKILL', msOption(0), OPENAI_ENGINE_DEFAULTS.stopTimeoutMs)
    .option('--engine-load-timeout-ms <n>', '--engine openai: how long the engine may take to become healthy at start-up (0 = no bound)', msOption(0), OPENAI_ENGINE_DEFAULTS.loadTimeoutMs)
    .option('--engine-model <name>', '--engine openai: the model name the engine serves (default: the first its /v1/models lists)')
    .option('--engine-kv-events <endpoint>', '--engine openai: the engine\'s KV event publisher (vLLM --kv-events-config endpoint, SGLang\'s), e.g. tcp://127.0.0.1:5557: its cached blocks are published on GET /kv/events for the frontend\'s router')
    .addOption(new Option('--engine-kv-events-topic <topic>', '--engine-kv-events: the ZMQ topic to subscribe to').default('', 'every topic'))
    .option('--engine-kv-events-replay <endpoint>', '--engine-kv-events: the publisher\'s replay socket (vLLM replay_endpoint), asked for batches lost in a gap instead of clearing the index')
    .option('--engine-embeddings', '--engine openai: the engine\'s model serves /v1/embeddings (vLLM/SGLang pooling models, llama-server --embeddings): the worker declares embeddings')
    .addOption(
      new Option('--lora-dir <dir>', 'where an admin load (POST /engine/adapters/NAME/load) may read an adapter the worker was not started with (repeatable; llama-cpp: on this machine, symlinks followed; --engine openai: on the engine server). Without it a load reads only the paths --lora gave')
        .argParser((dir: string, previous: string[]) => [...previous, dir])
        .default([] as string[], 'none'),
    )
    .option('--engine-max-loras <n>', '--engine openai with --lora: adapters the engine holds at once, as it is configured (vLLM --max-loras, SGLang --max-loras-per-batch)', intOption(1), 1)
    .option('--engine-kv-block-size <n>', '--engine openai: tokens per KV block, as the engine is configured (vLLM --block-size)', intOption(1), DEFAULT_BLOCK_SIZE)
    .option('--engine-tool-syntax <syntax>', '--engine openai: how the served model writes a tool call, which ebb parses from its raw text: hermes (Qwen 2.5/3, Hermes) or JSON {"prefix","params_prefix","suffix"}; unset: no tools', toolSyntaxOption)
    .action(async (flags: WorkerFlags) => {
      // Before anything binds: an Admin API on the network without a token is refused outright.
      const adminToken = await loadAdminTokens(flags.adminTokenFile);
      assertAdminBindAllowed(flags.systemHost, adminToken, '--system-host');
      const requestToken = await loadRequestToken(flags.requestTokenFile);
      assertRequestBindAllowed(flags.host, requestToken, '--host');
      // Its one worker must answer a whole request: a prefill or decode worker alone does not.
      if (flags.openaiPort !== undefined && flags.mode !== 'aggregated') throw new CliError(`--openai-port serves a whole request on this worker: it needs --mode aggregated, not ${flags.mode}`);
      if (flags.apiKeyFile !== undefined && flags.openaiPort === undefined) throw new CliError('--api-key-file guards the --openai-port listener: pass --openai-port too');
      // Clients name an adapter as their model: one named as the model would shadow it.
      const shadowing = [...flags.mockerLora, ...flags.lora.map((s) => s.name)].find((name) => name === servedModelName(flags, 'ebb-mock'));
      if (shadowing !== undefined) throw new CliError(`adapter "${shadowing}" has the name of the model: give it a name of its own`);
      const apiGuard = await loadApiGuard(flags.apiKeyFile);
      const workerId = flags.workerId ?? newWorkerId();
      const log = createLogger('worker', { worker_id: workerId });
      await startTracingOr(log, 'ebb-worker', workerId);
      // Before the engine loads: a pod annotated for drain starts the worker drained, not registered.
      // Loaded only with --k8s-self-pod: the Kubernetes client is heavy, and most workers never use it.
      if (flags.disruptionSource.includes('k8s') && flags.k8sSelfPod === undefined) throw new CliError('--disruption-source k8s follows this pod and its node: pass --k8s-self-pod too');
      const k8s = flags.k8sSelfPod === undefined ? undefined : await import('../k8s/self-pod-setup.js');
      const selfPod: SelfPodSetup | undefined = k8s === undefined || flags.k8sSelfPod === undefined ? undefined : await k8s.resolveSelfPod(flags.k8sSelfPod, flags.kubeconfig);
      let exiting = false;
      const exit = (code: number) => {
        exiting = true;
        exitTraced(code);
      };
      // Signals count from the start: one that arrives while the engine loads stops the load.
      const loading = new AbortController();
      let worker: RunningWorker | undefined;
      let signals = 0;
      const onSignal = (signal: NodeJS.Signals) => {
        signals++;
        if (signals > 2 || exiting) {
          log.warn({ event: 'shutdown_forced', signal }, 'third signal: exiting now');
          exit(130);
          return;
        }
        if (worker === undefined) {
          log.info({ event: 'shutdown_during_loading', signal }, `${signal} while the engine loads: stopping the load`);
          loading.abort(new Error(`${signal} during loading`));
          return;
        }
        if (signals === 2) {
          // Streams still running get an explicit worker_shut_down line instead of a silent cut.
          log.warn({ event: 'shutdown_cancelled', signal }, 'second signal: cutting what is in flight and exiting');
          worker.cancelShutdown();
          return;
        }
        shutdown(worker, signal);
      };
      const shutdown = (w: RunningWorker, signal: NodeJS.Signals) =>
        void w.shutdown(signal).then(exit, (err: unknown) => {
          log.fatal({ err }, 'shutdown failed');
          exit(1);
        });
      process.on('SIGTERM', onSignal);
      process.on('SIGINT', onSignal);
      // Started by `ebb up`: if it goes away, drain as on SIGTERM rather than linger or die abruptly.
      process.once('disconnect', () => onSignal('SIGTERM'));
      // It may have gone before this listener existed ('disconnect' fires once): then drain now.
      if (process.send !== undefined && !process.connected) onSignal('SIGTERM');
      try {
        worker = await startWorker(
          {
            workerId,
            model: servedModelName(flags, 'ebb-mock'),
            mode: flags.mode,
            host: flags.host,
            port: flags.port,
            systemHost: flags.systemHost,
            advertiseHost: flags.advertiseHost,
            systemPort: flags.systemPort,
            guardAdmin: createAdminGuard(adminToken),
            requestToken,
            discoveryUrl: flags.discovery,
            leaseTtlMs: flags.leaseTtlMs,
            registerTimeoutMs: flags.registerTimeoutMs,
            drainIntentTtlMs: flags.drainIntentTtlMs,
            shutdown: {
              graceMs: flags.shutdownGraceMs,
              drainTimeoutMs: flags.drainTimeoutMs,
              // The engine child is stopped in the cleanup stage: its stop bound is part of the watchdog's margin.
              ...(flags.engine === 'openai' && flags.engineCmd !== undefined ? { watchdogMarginMs: 5000 + flags.engineStopTimeoutMs } : {}),
            },
            engine: flags.engine === 'openai' ? openaiEngineSpec(flags) : engineSpec(flags),
            startDrained: selfPod?.intent ?? undefined,
            openai: flags.openaiPort === undefined ? undefined : { host: flags.host, port: flags.openaiPort, apiGuard },
            priorityReserveSlots: flags.priorityReserveSlots,
            maxEmbeddingTokens: flags.maxEmbeddingTokens,
            loraDirs: flags.loraDir,
          },
          log,
          exit,
          loading.signal,
        );
      } catch (err) {
        // Nothing was registered or admitted: a stop during loading is a clean exit.
        if (loading.signal.aborted) {
          log.info({ event: 'shutdown_complete', exit_code: 0, during: 'loading' }, 'stopped while loading');
          return exit(0);
        }
        log.fatal({ event: 'worker_start_failed', err: (err as Error).message }, `worker could not start: ${(err as Error).message}`);
        throw new CliError(`worker could not start: ${(err as Error).message}`);
      }
      const { record } = worker;
      const { openaiUrl } = worker;
      log.info(
        { event: 'worker_ready', ...record, discovery: worker.discovery.url, ...(openaiUrl === undefined ? {} : { openai_url: openaiUrl }) },
        `worker ${record.worker_id} ready: request plane ${record.request_url}, system ${record.system_url}${openaiUrl === undefined ? '' : `, OpenAI API ${openaiUrl}/v1`}`,
      );
      if (selfPod && k8s) {
        try {
          await k8s.attachSelfPod(selfPod, worker.lifecycle, log);
        } catch (err) {
          // Without its pod's watch the worker would miss a drain asked of it: it goes, drained.
          log.fatal({ event: 'k8s_self_pod_failed', err: (err as Error).message }, `--k8s-self-pod: cannot watch own pod: ${(err as Error).message}`);
          shutdown(worker, 'SIGTERM');
          return;
        }
      }
      if (flags.disruptionSource.length > 0 && !worker.lifecycle.isShuttingDown) {
        const { watchDisruptions } = await import('../disruption/watch-disruptions.js');
        await watchDisruptions(
          worker.lifecycle,
          {
            sources: flags.disruptionSource,
            marginMs: flags.disruptionMarginMs,
            leadMs: flags.disruptionLeadMs,
            pollMs: flags.disruptionPollMs,
            onCordon: flags.disruptionOnCordon === true,
            k8s: selfPod && k8s ? { pods: selfPod.api, nodes: k8s.nodeApiOf(selfPod), ref: selfPod.ref, nodeName: process.env.NODE_NAME || undefined } : undefined,
          },
          log,
        );
      }
      // A signal that came while startWorker was finishing (after the load) is honoured now.
      if (loading.signal.aborted) shutdown(worker, 'SIGTERM');
    });
  for (const option of llamaCppOptions()) command.addOption(option);
  command.addOption(loraOption());
  return command;
}

/** --engine openai: a worker in front of an OpenAI-compatible engine server. */
function openaiEngineSpec(flags: WorkerFlags): EngineSpec {
  return {
    kind: 'openai',
    options: {
      url: flags.engineUrl,
      kind: flags.engineKind,
      command: flags.engineCmd,
      quiescence: flags.engineQuiescence,
      stopTimeoutMs: flags.engineStopTimeoutMs,
      loadTimeoutMs: flags.engineLoadTimeoutMs,
      engineModel: flags.engineModel,
      kvEvents: flags.engineKvEvents,
      kvEventsTopic: flags.engineKvEventsTopic,
      kvEventsReplay: flags.engineKvEventsReplay,
      kvBlockSize: flags.engineKvBlockSize,
      toolSyntax: flags.engineToolSyntax,
      embeddings: flags.engineEmbeddings,
      loras: flags.lora,
      maxLoras: flags.engineMaxLoras,
    },
  };
}

/** --engine mocker (the embedded simulated engine) or llama-cpp. */
function engineSpec(flags: WorkerFlags): EngineSpec {
  if (flags.engine === 'llama-cpp') return llamaCppSpec(flags);
  return {
    kind: 'mocker',
    options: {
      ttftMs: flags.mockerTtftMs,
      itlMs: flags.mockerItlMs,
      batchSlots: flags.mockerBatchSlots,
      maxQueue: flags.mockerMaxQueue,
      idleness: flags.mockerIdleness,
      kvReporting: flags.mockerKvReporting,
      kvTransferTtlMs: flags.kvTransferTtlMs,
      loadMs: flags.mockerLoadMs,
      failOnPrompt: flags.mockerFailOnPrompt,
      maxContext: flags.mockerMaxContext,
      kvCache: flags.mockerKvCache,
      kvBlocks: flags.mockerKvBlocks,
      kvBlockSize: flags.mockerKvBlockSize,
      prefillTokensPerS: flags.mockerPrefillTokensPerS,
      embeddingDim: flags.mockerEmbeddingDim,
      lora: { names: flags.mockerLora, slots: flags.mockerLoraSlots, loadMs: flags.mockerLoraLoadMs },
    },
  };
}


/** --disruption-source, repeatable: each name once, checked against the sources there are. */
function collectDisruptionSource(value: string, previous: DisruptionSourceName[]): DisruptionSourceName[] {
  if (!(DISRUPTION_SOURCES as readonly string[]).includes(value)) throw new InvalidArgumentError(`not a disruption source: ${value} (one of ${DISRUPTION_SOURCES.join(', ')})`);
  return previous.includes(value as DisruptionSourceName) ? previous : [...previous, value as DisruptionSourceName];
}

/** --engine-tool-syntax, refused as commander refuses a bad value. */
function toolSyntaxOption(value: string): ToolCallSyntax {
  try {
    return parseToolSyntax(value);
  } catch (err) {
    throw new InvalidArgumentError((err as Error).message);
  }
}
