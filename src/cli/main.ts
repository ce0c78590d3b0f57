#!/usr/bin/env node
import { Command } from 'commander';
import { frontendCommand } from './frontend-command.js';
import { upCommand } from './up-command.js';
import { workerCommand } from './worker-command.js';

const program = new Command('ebb')
  .description('LLM-inference serving whose workers own their lifecycle')
  .version('0.1.0')
  .showHelpAfterError();

program.addCommand(workerCommand());
program.addCommand(frontendCommand());
program.addCommand(upCommand());

program.parseAsync(process.argv).catch((err: unknown) => {
  // Operators get one clear line, not a stack trace.
  process.stderr.write(`ebb: ${(err as Error).message}\n`);
  process.exit(1);
});
