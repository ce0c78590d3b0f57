#!/usr/bin/env node
import { Command } from 'commander';
import { CliError } from './cli-error.js';
import { drainCommand } from './drain-command.js';
import { frontendCommand } from './frontend-command.js';
import { prestopCommand } from './prestop-command.js';
import { resumeCommand } from './resume-command.js';
import { rolloutCommand } from './rollout-command.js';
import { statusCommand } from './status-command.js';
import { upCommand } from './up-command.js';
import { workerCommand } from './worker-command.js';
import { workersCommand } from './workers-command.js';

const program = new Command('ebb')
  .description('LLM-inference serving whose workers own their lifecycle')
  .version('0.1.0')
  .showHelpAfterError();

program.addCommand(workerCommand());
program.addCommand(frontendCommand());
program.addCommand(upCommand());
program.commandsGroup('Operator commands:');
program.addCommand(workersCommand());
program.addCommand(statusCommand());
program.addCommand(drainCommand());
program.addCommand(resumeCommand());
program.addCommand(rolloutCommand());
program.addCommand(prestopCommand());

program.parseAsync(process.argv).catch((err: unknown) => {
  // Operators get one clear line, not a stack trace; timeouts exit 2 (see CliError).
  process.stderr.write(`ebb: ${(err as Error).message}\n`);
  process.exit(err instanceof CliError ? err.exitCode : 1);
});
