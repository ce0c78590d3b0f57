#!/usr/bin/env node
import { Command, Option } from 'commander';
import { LOG_FORMATS, LOG_LEVELS } from '../common/logger.js';
import { printable } from '../common/terminal-text.js';
import { CliError } from './cli-error.js';

/**
 * Each command's module, loaded only when that command runs (or for the full help): an operator
 * command (status, drain) must not pay for loading the worker's and the frontend's servers.
 */
const COMMANDS: Record<string, () => Promise<Command>> = {
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
  prestop: async () => (await import('./prestop-command.js')).prestopCommand(),
  'eviction-guard': async () => (await import('./eviction-guard-command.js')).evictionGuardCommand(),
};
const OPERATOR_COMMANDS = new Set(['workers', 'status', 'drain', 'resume', 'rollout', 'scale-down', 'intents', 'prestop', 'eviction-guard']);

/** The command named on the command line (past the global options and their values), if any. */
function commandNamed(argv: string[]): string | undefined {
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === '--log-format' || arg === '--log-level') i++;
    else if (!arg.startsWith('-')) return Object.hasOwn(COMMANDS, arg) ? arg : undefined;
  }
  return undefined;
}

const program = new Command('ebb')
  .description('LLM-inference serving whose workers own their lifecycle')
  .version('0.1.0')
  .showHelpAfterError()
  .addOption(new Option('--log-format <format>', 'auto: readable lines on a terminal, JSON otherwise (env EBB_LOG_FORMAT)').choices(LOG_FORMATS))
  .addOption(new Option('--log-level <level>', 'log level (env EBB_LOG_LEVEL; default info)').choices(LOG_LEVELS))
  // Through the environment, so the components `ebb up` starts log the same way.
  .hook('preAction', (root) => {
    const { logFormat, logLevel } = root.opts<{ logFormat?: string; logLevel?: string }>();
    if (logFormat !== undefined) process.env.EBB_LOG_FORMAT = logFormat;
    if (logLevel !== undefined) process.env.EBB_LOG_LEVEL = logLevel;
  });

// One command named: only it is loaded. Otherwise (help, a typo) all are, for the help and suggestions.
const named = commandNamed(process.argv.slice(2));
for (const [name, load] of Object.entries(COMMANDS)) {
  if (named !== undefined && name !== named) continue;
  if (OPERATOR_COMMANDS.has(name)) program.commandsGroup('Operator commands:');
  program.addCommand(await load());
}

program.parseAsync(process.argv).catch((err: unknown) => {
  // Operators get one clear line, not a stack trace; timeouts exit 2 (see CliError).
  // The message may quote a worker's answer: shown escaped, one line.
  process.stderr.write(`ebb: ${printable((err as Error).message)}\n`);
  process.exit(err instanceof CliError ? err.exitCode : 1);
});
