#!/usr/bin/env node
import { Command, Option } from 'commander';
import { LOG_FORMATS, LOG_LEVELS } from '../common/logger.js';
import { printable } from '../common/terminal-text.js';
import { CliError } from './cli-error.js';
import { drainCommand } from './drain-command.js';
import { frontendCommand } from './frontend-command.js';
import { prestopCommand } from './prestop-command.js';
import { resumeCommand } from './resume-command.js';
import { rolloutCommand } from './rollout-command.js';
import { intentsCommand } from './intents-command.js';
import { statusCommand } from './status-command.js';
import { upCommand } from './up-command.js';
import { workerCommand } from './worker-command.js';
import { workersCommand } from './workers-command.js';

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

program.addCommand(workerCommand());
program.addCommand(frontendCommand());
program.addCommand(upCommand());
program.commandsGroup('Operator commands:');
program.addCommand(workersCommand());
program.addCommand(statusCommand());
program.addCommand(drainCommand());
program.addCommand(resumeCommand());
program.addCommand(rolloutCommand());
program.addCommand(intentsCommand());
program.addCommand(prestopCommand());

program.parseAsync(process.argv).catch((err: unknown) => {
  // Operators get one clear line, not a stack trace; timeouts exit 2 (see CliError).
  // The message may quote a worker's answer: shown escaped, one line.
  process.stderr.write(`ebb: ${printable((err as Error).message)}\n`);
  process.exit(err instanceof CliError ? err.exitCode : 1);
});
