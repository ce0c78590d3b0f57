/**
 * How an operator command fails: one line for the operator, and an exit code (1 for failures, 2 for
 * "did not happen within --timeout"). main.ts prints the message and exits with the code.
 */

export const EXIT_FAILURE = 1;
export const EXIT_TIMEOUT = 2;
/** Stopped by SIGINT/SIGTERM (128 + SIGINT, as a shell reports it). */
export const EXIT_INTERRUPTED = 130;

export class CliError extends Error {
  constructor(
    message: string,
    readonly exitCode = EXIT_FAILURE,
  ) {
    super(message);
  }
}
