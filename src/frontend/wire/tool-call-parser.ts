import { createHash } from 'node:crypto';
import type { ToolCallSyntax } from '../../protocol/tools.js';

/** What the parser finds in a model's raw text: plain content, a call's start, a piece of its arguments. */
export type ToolEvent =
  | { kind: 'content'; text: string }
  | { kind: 'call'; index: number; id: string; name: string }
  | { kind: 'args'; index: number; text: string };

/** A call's name longer than this is not a name: the text was not a call after all. */
const MAX_NAME = 256;
const LEADING_SPACE = /^\s+/;
const TRAILING_SPACE = /\s*$/;

/** What may continue a bare JSON scalar (a number, true, false, null): it ends at the first other character. */
const SCALAR_CHAR = /[\w.+-]/;
const SIMPLE_ESCAPES: Readonly<Record<string, string>> = { '"': '"', '\\': '\\', '/': '/', b: '\b', f: '\f', n: '\n', r: '\r', t: '\t' };

/**
 * Tool calls out of a model's raw text, as it streams: `prefix` name `params_prefix` arguments
 * `suffix` (ToolCallSyntax), the arguments a JSON value whose end is found by its brackets. A
 * model that writes the arguments as a JSON string (`"arguments": "{\"a\": 1}"`) is read as
 * meaning the string's text: that is delivered, unescaped, as the call's arguments. What it emits
 * depends only on the text so far, never on how the text was cut into pieces: a stream that moved
 * to another worker mid-call (its continuation is the same raw text) parses to the same calls.
 * Text that might be a prefix's start is held until it is told apart; whitespace around calls
 * (and before the arguments) is not content.
 */
export class ToolCallParser {
  /** `args`: an object, array or bare scalar, its end found by its brackets; `string_args`: a string, unescaped as it comes. */
  private state: 'text' | 'name' | 'args' | 'string_args' | 'suffix' = 'text';
  private buf = '';
  private heldSpace = '';
  private afterCall = false;
  private calls = 0;
  private depth = 0;
  private inString = false;
  private escaped = false;
  private started = false;
  /** The arguments are a bare scalar (a number, true, false, null). */
  private scalar = false;
  /** In string arguments: an escape not complete yet (`\`, `\u00`). */
  private escape = '';
  /** In string arguments: a high surrogate waiting for its low half (never sent alone: UTF-8 cannot carry it). */
  private high = '';
  private readonly suffix: string;

  constructor(
    private readonly syntax: ToolCallSyntax,
    private readonly idFor: (index: number) => string,
  ) {
    this.suffix = syntax.suffix.replace(/\s+/g, '');
  }

  /** Calls begun so far (a call cut by max_tokens counts: its arguments were sent). */
  get called(): number {
    return this.state === 'args' || this.state === 'string_args' || this.state === 'suffix' ? this.calls + 1 : this.calls;
  }

  feed(text: string, out: ToolEvent[]): void {
    let rest = text;
    while (rest !== '') {
      if (this.state === 'text') rest = this.inText(rest, out);
      else if (this.state === 'name') rest = this.inName(rest, out);
      else if (this.state === 'args') rest = this.inArgs(rest, out);
      else if (this.state === 'string_args') rest = this.inStringArgs(rest, out);
      else rest = this.inSuffix(rest);
    }
  }

  /** The text is over: what was held is content, unless it was only space between calls. */
  end(out: ToolEvent[]): void {
    if (this.state === 'text') this.content(this.buf, out);
    else if (this.state === 'name') this.content(this.syntax.prefix + this.buf, out);
    this.buf = '';
    if (this.state === 'text') this.flushSpace(out);
  }

  private inText(text: string, out: ToolEvent[]): string {
    const buf = this.buf + text;
    const at = buf.indexOf(this.syntax.prefix);
    if (at >= 0) {
      this.content(buf.slice(0, at), out);
      this.heldSpace = ''; // space before a call is not content
      this.buf = '';
      this.state = 'name';
      return buf.slice(at + this.syntax.prefix.length);
    }
    const keep = partialPrefix(buf, this.syntax.prefix);
    this.content(buf.slice(0, buf.length - keep), out);
    this.buf = buf.slice(buf.length - keep);
    return '';
  }

  private inName(text: string, out: ToolEvent[]): string {
    const buf = this.buf + text;
    const at = buf.indexOf(this.syntax.params_prefix);
    if (at < 0) {
      if (buf.length > MAX_NAME + this.syntax.params_prefix.length) {
        this.buf = '';
        this.state = 'text';
        this.content(this.syntax.prefix, out);
        return buf;
      }
      this.buf = buf;
      return '';
    }
    const index = this.calls;
    out.push({ kind: 'call', index, id: this.idFor(index), name: buf.slice(0, at) });
    this.buf = '';
    this.state = 'args';
    this.depth = 0;
    this.started = false;
    this.scalar = false;
    this.inString = false;
    this.escaped = false;
    this.escape = '';
    this.high = '';
    return buf.slice(at + this.syntax.params_prefix.length);
  }

  private inArgs(text: string, out: ToolEvent[]): string {
    let from = 0;
    if (!this.started) {
      from = text.search(/\S/);
      if (from < 0) return ''; // space before the value is not part of it
      this.started = true;
      if (text[from] === '"') {
        this.state = 'string_args';
        return text.slice(from + 1);
      }
      this.scalar = text[from] !== '{' && text[from] !== '[';
    }
    for (let i = from; i < text.length; i++) {
      const c = text[i]!;
      if (this.scalar) {
        if (!SCALAR_CHAR.test(c)) return this.argsDone(text.slice(from, i), text.slice(i), out);
        continue;
      }
      if (this.inString) {
        if (this.escaped) this.escaped = false;
        else if (c === '\\') this.escaped = true;
        else if (c === '"') this.inString = false;
        continue;
      }
      if (c === '"') this.inString = true;
      else if (c === '{' || c === '[') this.depth++;
      else if (c === '}' || c === ']') this.depth--;
      if (this.depth <= 0) return this.argsDone(text.slice(from, i + 1), text.slice(i + 1), out);
    }
    if (from < text.length) out.push({ kind: 'args', index: this.calls, text: text.slice(from) });
    return '';
  }

  /** Arguments written as a JSON string: its text, unescaped, up to its closing quote. */
  private inStringArgs(text: string, out: ToolEvent[]): string {
    let decoded = '';
    for (let i = 0; i < text.length; i++) {
      const c = text[i]!;
      if (this.escape !== '') {
        this.escape += c;
        const char = unescape(this.escape);
        if (char === undefined) continue;
        decoded += char;
        this.escape = '';
      } else if (c === '\\') this.escape = c;
      else if (c === '"') return this.argsDone(this.whole(decoded), text.slice(i + 1), out);
      else decoded += c;
    }
    const whole = this.whole(decoded);
    // A high surrogate is held for its low half, in whichever piece that comes.
    const last = whole.charCodeAt(whole.length - 1);
    this.high = last >= 0xd800 && last <= 0xdbff ? whole.slice(-1) : '';
    const sent = this.high === '' ? whole : whole.slice(0, -1);
    if (sent !== '') out.push({ kind: 'args', index: this.calls, text: sent });
    return '';
  }

  /** What string arguments decoded, after a high surrogate held from the piece before. */
  private whole(decoded: string): string {
    const whole = this.high + decoded;
    this.high = '';
    return whole;
  }

  /** The arguments' last text; what follows is the suffix's. */
  private argsDone(last: string, rest: string, out: ToolEvent[]): string {
    if (last !== '') out.push({ kind: 'args', index: this.calls, text: last });
    this.state = 'suffix';
    this.buf = '';
    return rest;
  }

  /** The suffix, matched without regard to whitespace (models space it as they like). */
  private inSuffix(text: string): string {
    for (let i = 0; i < text.length; i++) {
      const c = text[i]!;
      if (/\s/.test(c)) continue;
      if (this.suffix[this.buf.length] === c) {
        this.buf += c;
        if (this.buf.length === this.suffix.length) return this.callDone(text.slice(i + 1));
        continue;
      }
      // Not the suffix: the call ended with its arguments; what follows is text again.
      const rest = this.buf + text.slice(i);
      this.callDone('');
      return rest;
    }
    if (this.suffix.length === 0) return this.callDone('');
    return '';
  }

  private callDone(rest: string): string {
    this.calls++;
    this.afterCall = true;
    this.state = 'text';
    this.buf = '';
    return rest;
  }

  /**
   * Text outside calls. Space next to a call is not content (a model puts newlines around its
   * calls): space after a call is dropped, space before one held until the next piece tells.
   */
  private content(text: string, out: ToolEvent[]): void {
    const body = this.afterCall ? text.replace(LEADING_SPACE, '') : text;
    if (body === '') return;
    this.afterCall = false;
    const trailing = TRAILING_SPACE.exec(body)![0];
    const visible = body.slice(0, body.length - trailing.length);
    if (visible !== '') {
      out.push({ kind: 'content', text: this.heldSpace + visible });
      this.heldSpace = '';
    }
    this.heldSpace += trailing;
  }

  private flushSpace(out: ToolEvent[]): void {
    if (this.heldSpace !== '') out.push({ kind: 'content', text: this.heldSpace });
    this.heldSpace = '';
  }
}

/** A JSON string escape's character: undefined while incomplete, the escape as written when it is not one JSON knows. */
function unescape(escape: string): string | undefined {
  if (escape.length < 2) return undefined;
  const c = escape[1]!;
  if (c !== 'u') return SIMPLE_ESCAPES[c] ?? escape;
  if (escape.length < 6) return undefined;
  const hex = escape.slice(2);
  return /^[0-9a-fA-F]{4}$/.test(hex) ? String.fromCharCode(parseInt(hex, 16)) : escape;
}

/** How many of text's last characters begin `prefix` (held back until the next piece tells). */
function partialPrefix(text: string, prefix: string): number {
  for (let k = Math.min(prefix.length - 1, text.length); k > 0; k--) if (prefix.startsWith(text.slice(text.length - k))) return k;
  return 0;
}

/**
 * Call ids from the request itself, not from chance: the same request at temperature 0 gets the
 * same ids however often its stream moved between workers (an id made up by the worker would
 * change with the worker). `requestKey` is the request's content; choices and calls are numbered.
 */
export function callIds(requestKey: string, lane: number): (index: number) => string {
  const base = createHash('sha256').update(requestKey).digest('hex').slice(0, 16);
  return (index) => `call_${createHash('sha256').update(`${base}:${lane}:${index}`).digest('hex').slice(0, 24)}`;
}

export interface ParsedCalls {
  content: string | null;
  calls: Array<{ id: string; type: 'function'; function: { name: string; arguments: string } }>;
}

/** A whole answer's text, parsed at once (non-streamed answers). */
export function parseToolCalls(text: string, syntax: ToolCallSyntax, idFor: (index: number) => string): ParsedCalls {
  const parser = new ToolCallParser(syntax, idFor);
  const events: ToolEvent[] = [];
  parser.feed(text, events);
  parser.end(events);
  let content = '';
  const calls: ParsedCalls['calls'] = [];
  for (const e of events) {
    if (e.kind === 'content') content += e.text;
    else if (e.kind === 'call') calls.push({ id: e.id, type: 'function', function: { name: e.name, arguments: '' } });
    else calls[e.index]!.function.arguments += e.text;
  }
  return { content: content === '' && calls.length > 0 ? null : content, calls };
}
