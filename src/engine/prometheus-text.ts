/**
 * A small reader for the Prometheus text exposition format, for the few gauges an idleness probe
 * needs. It is strict where it matters: a sample line of a wanted metric that does not parse, or a
 * value that is not a finite non-negative number, is an error, never a silent 0 — the probe then
 * answers `unknown` (fail-closed). Lines of other metrics are not looked at, so an engine page with
 * exotic lines elsewhere (OpenMetrics exemplars, info metrics) still yields the gauges it has.
 */

export class MetricsFormatError extends Error {}

export interface Sample {
  labels: Record<string, string>;
  value: number;
}

const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*/;
const VALUE = /^(?:[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-]?Inf|NaN)$/;

/** Parses `{a="x",b="y"}` starting at `i` (at the `{`); returns the labels and the index after `}`. */
function parseLabels(line: string, i: number): { labels: Record<string, string>; end: number } {
  const labels: Record<string, string> = {};
  i++; // '{'
  for (;;) {
    while (line[i] === ' ') i++;
    if (line[i] === '}') return { labels, end: i + 1 };
    const name = LABEL_NAME.exec(line.slice(i))?.[0];
    if (name === undefined) throw new MetricsFormatError(`bad label name at column ${i + 1}`);
    i += name.length;
    while (line[i] === ' ') i++;
    if (line[i] !== '=' || line[i + 1] !== '"') throw new MetricsFormatError(`expected ="..." after label ${name}`);
    i += 2;
    let value = '';
    for (;;) {
      const c = line[i];
      if (c === undefined) throw new MetricsFormatError(`unterminated value of label ${name}`);
      if (c === '"') break;
      if (c === '\\') {
        const next = line[i + 1];
        if (next === 'n') value += '\n';
        else if (next === '\\' || next === '"') value += next;
        else throw new MetricsFormatError(`bad escape in label ${name}`);
        i += 2;
      } else {
        value += c;
        i++;
      }
    }
    labels[name] = value;
    i++; // closing quote
    while (line[i] === ' ') i++;
    if (line[i] === ',') i++;
    else if (line[i] !== '}') throw new MetricsFormatError(`expected , or } after label ${name}`);
  }
}

/** One sample line: `name{labels} value [timestamp]`. */
export function parseSampleLine(line: string): { name: string } & Sample {
  const name = NAME.exec(line)?.[0];
  if (name === undefined) throw new MetricsFormatError('line does not start with a metric name');
  let i = name.length;
  let labels: Record<string, string> = {};
  if (line[i] === '{') ({ labels, end: i } = parseLabels(line, i));
  const rest = line.slice(i).trim().split(/[ \t]+/);
  if (rest.length < 1 || rest.length > 2 || rest[0] === '' || !VALUE.test(rest[0] as string))
    throw new MetricsFormatError(`${name}: expected a number, got "${line.slice(i).trim().slice(0, 40)}"`);
  if (rest.length === 2 && !/^-?\d+$/.test(rest[1] as string)) throw new MetricsFormatError(`${name}: bad timestamp`);
  return { name, labels, value: Number((rest[0] as string).replace(/^\+?Inf$/, 'Infinity').replace(/^-Inf$/, '-Infinity')) };
}

/**
 * The samples of each metric in `names` found in `text` (a name absent from the page is absent from
 * the map). Throws MetricsFormatError when a line of one of them does not parse.
 */
export function readSamples(text: string, names: readonly string[]): Map<string, Sample[]> {
  const wanted = new Set(names);
  const found = new Map<string, Sample[]>();
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) continue;
    const name = NAME.exec(line)?.[0];
    if (name === undefined || !wanted.has(name)) continue;
    const next = line[name.length];
    if (next !== '{' && next !== ' ' && next !== '\t') continue; // a longer name sharing the prefix
    const sample = parseSampleLine(line);
    const list = found.get(name) ?? [];
    list.push({ labels: sample.labels, value: sample.value });
    found.set(name, list);
  }
  return found;
}

/**
 * The sum of a gauge over its label sets (vLLM labels by model and engine index, SGLang by model
 * and rank). Throws when the gauge is missing or a value is not a finite count.
 */
export function sumGauge(samples: Map<string, Sample[]>, name: string): number {
  const list = samples.get(name);
  if (list === undefined || list.length === 0) throw new MetricsFormatError(`metric ${name} is missing`);
  let sum = 0;
  for (const s of list) {
    if (!Number.isFinite(s.value) || s.value < 0) throw new MetricsFormatError(`metric ${name} has value ${s.value}`);
    sum += s.value;
  }
  return sum;
}
