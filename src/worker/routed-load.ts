import type { KvLoad } from '../protocol/kv-events.js';

/** A routing frontend names itself in at most this many characters, of these (anything else is not counted). */
const FRONTEND_ID = /^[\w.:@/+=-]{1,128}$/;
/** Frontends counted at once; the requests of any past these are not (a fleet has a few, not thousands). */
const MAX_FRONTENDS = 256;
/** A prediction past this is no prompt (the largest contexts are about a million tokens). */
const MAX_PREFILL_TOKENS = 10_000_000;

/** Where a routed request stands in its worker's count: its prompt queued for prefill, prefilled (its first token came), or released. */
export type RoutedState = 'queued' | 'prefilled' | 'released';

interface Entry {
  inflight: number;
  prefill: number[];
}

/** One admitted request in its frontend's count here, from admission to its scope's close. */
export class RoutedHold {
  private state: RoutedState = 'queued';

  constructor(
    private readonly load: RoutedLoad,
    private readonly entry: Entry,
    private readonly tokens: number,
  ) {}

  get current(): RoutedState {
    return this.state;
  }

  /** Its first token came: its prompt no longer waits for prefill. */
  prefilled(): void {
    if (this.state === 'queued') this.set('prefilled');
  }

  /** Its scope closed: it is no longer in flight here. */
  release(): void {
    if (this.state !== 'released') this.set('released');
  }

  /** The one setter: the entry's counts follow each change. */
  private set(next: RoutedState): void {
    if (this.state === 'queued' && this.tokens > 0) {
      const at = this.entry.prefill.indexOf(this.tokens);
      if (at >= 0) this.entry.prefill.splice(at, 1);
    }
    if (next === 'released') this.entry.inflight--;
    this.state = next;
    this.load.changed();
  }
}

/**
 * The requests each routing frontend has in flight on this worker, and the prompts among them not yet
 * prefilled (protocol/kv-events.ts KvLoad): what the worker's KV event stream tells every frontend,
 * so one frontend's choice counts what the others sent here before the KV events can say it.
 * Requests that name no frontend are not counted (their sender routes alone).
 */
export class RoutedLoad {
  private readonly frontends = new Map<string, Entry>();
  /** Told after every change (the KV event stream coalesces them). */
  onChange: (() => void) | undefined;

  /** A /generate admitted: counted for the frontend its headers name; undefined when they name none (or not a sane one). */
  admit(routedBy: string | string[] | undefined, prefillTokens: string | string[] | undefined): RoutedHold | undefined {
    if (typeof routedBy !== 'string' || !FRONTEND_ID.test(routedBy)) return undefined;
    let entry = this.frontends.get(routedBy);
    if (entry === undefined) {
      if (this.frontends.size >= MAX_FRONTENDS) return undefined;
      this.frontends.set(routedBy, (entry = { inflight: 0, prefill: [] }));
    }
    const n = typeof prefillTokens === 'string' ? Number(prefillTokens) : 0;
    const tokens = Number.isSafeInteger(n) && n > 0 && n <= MAX_PREFILL_TOKENS ? n : 0;
    entry.inflight++;
    if (tokens > 0) entry.prefill.push(tokens);
    this.changed();
    return new RoutedHold(this, entry, tokens);
  }

  /** @internal A hold changed its entry: an idle frontend's entry goes. */
  changed(): void {
    for (const [id, e] of this.frontends) if (e.inflight <= 0) this.frontends.delete(id);
    this.onChange?.();
  }

  /** The `load` event's body. */
  snapshot(workerId: string): KvLoad {
    const frontends: KvLoad['frontends'] = {};
    for (const [id, e] of this.frontends) frontends[id] = [e.inflight, [...e.prefill]];
    return { worker_id: workerId, frontends };
  }
}
