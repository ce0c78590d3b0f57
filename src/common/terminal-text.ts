/**
 * Text from elsewhere (worker ids, models, drain reasons, error messages: whatever a discovery record
 * or a worker's answer holds) shown to a person on a terminal. Raw, an OSC 52 sequence writes the
 * operator's clipboard, `ESC[2J` clears the screen, a newline forges a table row, a bidi override
 * reverses what is read. Every control character (C0, DEL, C1), line and paragraph separator and
 * bidi control is shown escaped instead (`\n`, `\x1b`, `\u202e`), so the text stays one visible line.
 * JSON output (--json, JSON logs) needs none of this: JSON escapes controls itself.
 */

const UNSAFE = /[\p{Cc}\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/gu;

const NAMED: Record<string, string> = { '\n': '\\n', '\r': '\\r', '\t': '\\t' };

function escape(ch: string): string {
  const named = NAMED[ch];
  if (named !== undefined) return named;
  const code = ch.codePointAt(0) as number;
  return code <= 0xff ? `\\x${code.toString(16).padStart(2, '0')}` : `\\u${code.toString(16).padStart(4, '0')}`;
}

/** `text` with every character that could drive a terminal shown as an escape. */
export function printable(text: string): string {
  return text.replace(UNSAFE, escape);
}
