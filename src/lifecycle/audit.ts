import { EventEmitter } from 'node:events';
import type { Logger } from 'pino';

/**
 * The audit trail of a worker: every drain, resume, shutdown and hand-off, with who asked, why, in
 * which generation, how it ended and how long it took. Kept in memory (the last AUDIT_CAPACITY,
 * served as GET /engine/events), logged as one JSON line each (event "audit"), and emitted for the
 * system server's status stream.
 */

/** `drained`: a drain reached drained; dated then, its duration is the whole drain (from the call). */
/** `preempt`: a flex stream paused for a priority request that found no free batch slot (its caller continues it). */
export type AuditWhat = 'drain' | 'drained' | 'resume' | 'shutdown' | 'handoff' | 'preempt';

export interface AuditEvent {
  what: AuditWhat;
  /** When the operation started (ISO 8601); for `drained`, when the worker reached it. */
  at: string;
  reason: string | null;
  /** An admin token's name, "signal", "engine", or the caller's address on an open (loopback) listener. */
  actor: string;
  /** The generation the operation ran in (after its bump, for drain and resume). */
  generation: number;
  /** How it ended: the state it left the worker in, `refused: <code>`, `failed: <message>`, or a shutdown's outcome. */
  result: string;
  duration_ms: number;
  /** Operation-specific figures (streams handed off, a shutdown's exit code). */
  detail?: Record<string, unknown> | undefined;
}

export const AUDIT_CAPACITY = 500;

/** Who acts when nobody named did: a signal, or the engine failing under the worker. */
export const SIGNAL_ACTOR = 'signal';
export const ENGINE_ACTOR = 'engine';

export class AuditTrail extends EventEmitter {
  private readonly events: AuditEvent[] = [];

  constructor(
    private readonly log: Logger,
    private readonly capacity = AUDIT_CAPACITY,
  ) {
    super();
  }

  /**
   * Records one finished operation; `startedAt` (and `endedAt`, default now) are performance.now()
   * values. `atWall` (ms epoch) dates it when that is not its start.
   */
  record(e: Omit<AuditEvent, 'at' | 'duration_ms'> & { startedAt: number; endedAt?: number; atWall?: number }): AuditEvent {
    const { startedAt, endedAt, atWall, ...rest } = e;
    const duration = Math.max(0, Math.round((endedAt ?? performance.now()) - startedAt));
    const event: AuditEvent = { ...rest, at: new Date(atWall ?? Date.now() - duration).toISOString(), duration_ms: duration };
    if (event.detail === undefined) delete event.detail;
    this.events.push(event);
    if (this.events.length > this.capacity) this.events.splice(0, this.events.length - this.capacity);
    this.log.info({ event: 'audit', ...event }, `audit: ${event.what} by ${event.actor}: ${event.result}${event.reason ? ` (${event.reason})` : ''}`);
    this.emit('event', event);
    return event;
  }

  /** Oldest first. */
  list(): AuditEvent[] {
    return [...this.events];
  }
}
