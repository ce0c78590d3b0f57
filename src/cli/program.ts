import { Command, InvalidArgumentError, Option } from 'commander';
import { LOG_FORMATS, LOG_LEVELS } from '../common/logger.js';
import { tracesEndpointUrl } from '../tracing/tracing.js';

/**
 * The `ebb` program's definition: its global options and its commands. main.ts runs it; the flag
 * reference (docs/configuration.md, src/build/configuration-doc.ts) is generated from the same
 * definitions, so neither can say what the other does not.
 *
 * Each command's module is loaded only when that command runs (or for the full help): an operator
 * command (status, drain) must not pay for loading the worker's and the frontend's servers.
 */
export const COMMANDS: Record<string, () => Promise<Command>> = {
  worker: async () => (await import('./worker-command.js')).workerCommand(),
  frontend: async () => (await import('./frontend-command.js')).frontendCommand(),
  up: async () => (await import('./up-command.js')).upCommand(),
  workers: async () => (await import('./workers-command.js')).workersCommand(),
  status: async () => (await import('./status-command.js')).statusCommand(),
  drain: async () => (await import('./drain-command.js')).drainCommand(),
  resume: async () => (await import('./resume-command.js')).resumeCommand(),
  rollout: async () => (await import('./rollout-command.js')).rolloutCommand(),
  'scale-down': async () => (await import('./scale-down-command.js')).scaleDownCommand(),
  intents: async () => (await import('./intents-command.js')).intentsCommand(),
  tenants: async () => (await import('./tenants-command.js')).tenantsCommand(),
  prestop: async () => (await import('./prestop-command.js')).prestopCommand(),
  'eviction-guard': async () => (await import('./eviction-guard-command.js')).evictionGuardCommand(),
};
export const OPERATOR_COMMANDS = new Set(['workers', 'status', 'drain', 'resume', 'rollout', 'scale-down', 'intents', 'tenants', 'prestop', 'eviction-guard']);

/** The root command with its global options, no command added yet. */
export function rootProgram(): Command {
  return (
    new Command('ebb')
      .description('LLM-inference serving whose workers own their lifecycle')
      .version('0.1.0')
      .showHelpAfterError()
      .addOption(new Option('--log-format <format>', 'auto: readable lines on a terminal, JSON otherwise (env EBB_LOG_FORMAT)').choices(LOG_FORMATS))
      .addOption(new Option('--log-level <level>', 'log level (env EBB_LOG_LEVEL; default info)').choices(LOG_LEVELS))
      .addOption(
        new Option(
          '--otlp-traces-endpoint <url>',
          'export OpenTelemetry traces (OTLP/HTTP) to this collector URL, e.g. http://collector:4318/v1/traces (a URL without a path gets /v1/traces); env OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, or OTEL_EXPORTER_OTLP_ENDPOINT, the same; off when none is named (docs/observability.md)',
        ).argParser(endpointOption),
      )
      // Through the environment, so the components `ebb up` starts log (and trace) the same way.
      .hook('preAction', (root) => {
        const { logFormat, logLevel, otlpTracesEndpoint } = root.opts<{ logFormat?: string; logLevel?: string; otlpTracesEndpoint?: string }>();
        if (logFormat !== undefined) process.env.EBB_LOG_FORMAT = logFormat;
        if (logLevel !== undefined) process.env.EBB_LOG_LEVEL = logLevel;
        if (otlpTracesEndpoint !== undefined) process.env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = otlpTracesEndpoint;
      })
  );
}

/** --otlp-traces-endpoint: an OTLP/HTTP URL, refused as commander refuses a bad value. */
function endpointOption(value: string): string {
  try {
    return tracesEndpointUrl(value);
  } catch (err) {
    throw new InvalidArgumentError((err as Error).message);
  }
}

/** The whole program, every command loaded (help, the flag reference). */
export async function fullProgram(): Promise<Command> {
  const program = rootProgram();
  for (const [name, load] of Object.entries(COMMANDS)) {
    if (OPERATOR_COMMANDS.has(name)) program.commandsGroup('Operator commands:');
    program.addCommand(await load());
  }
  return program;
}
