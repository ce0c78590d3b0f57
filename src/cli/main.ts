#!/usr/bin/env node
import { printable } from '../common/terminal-text.js';
import { CliError } from './cli-error.js';
import { COMMANDS, OPERATOR_COMMANDS, rootProgram } from './program.js';

/** The command named on the command line (past the global options and their values), if any. */
function commandNamed(argv: string[]): string | undefined {
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === '--log-format' || arg === '--log-level' || arg === '--otlp-traces-endpoint') i++;
    else if (!arg.startsWith('-')) return Object.hasOwn(COMMANDS, arg) ? arg : undefined;
  }
  return undefined;
}

const program = rootProgram();

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
