import type { Logger } from 'pino';
import type { Discovery, LoadingRecord, WorkerRecord } from '../discovery/discovery.js';

/**
 * What discovery last confirmed under the worker's key (as far as this process wrote it); `given_up`:
 * nothing, and the loading is over without serving, so no loading record is written any more.
 */
type KeyState = { kind: 'none' } | { kind: 'loading' } | { kind: 'serving' } | { kind: 'given_up' };

/**
 * The worker's one key in discovery, and its one writer: the loading record while the engine loads
 * (announce: the frontends then hold its model's requests for it instead of refusing them), the
 * serving record once the lifecycle registers, nothing once it unregisters or the loading is given
 * up (withdraw). Writes run one at a time, in the order asked, so a loading record written late never
 * replaces the serving one and a withdrawal never races a registration.
 */
export class WorkerRegistration {
  private state: KeyState = { kind: 'none' };
  private chain: Promise<unknown> = Promise.resolve();

  constructor(
    private readonly discovery: Discovery,
    private readonly log: Logger,
  ) {}

  /** The one setter. */
  private set(next: KeyState): void {
    this.state = next;
  }

  /** Runs `op` after every write asked before it; its result is the caller's, the chain goes on either way. */
  private queue<T>(op: () => Promise<T>): Promise<T> {
    const run = this.chain.then(op, op);
    this.chain = run.catch(() => undefined);
    return run;
  }

  /**
   * Registers `record` as loading, unless its loading is over already (it serves: the engine was
   * quicker; or it was given up): `superseded`. Never rejects: a worker that could not say it is loading still loads (its
   * model's requests then find no worker until it serves, as before).
   */
  announce(record: LoadingRecord): Promise<'registered' | 'superseded' | 'failed'> {
    return this.queue(async () => {
      if (this.state.kind !== 'none') return 'superseded';
      try {
        await this.discovery.register(record);
        this.set({ kind: 'loading' });
        return 'registered';
      } catch (err) {
        this.log.warn({ event: 'discovery_loading_register_failed', err: (err as Error).message }, `could not register as loading in ${this.discovery.url}: ${(err as Error).message}`);
        return 'failed';
      }
    });
  }

  /** The serving record, replacing the loading one (the lifecycle's registration). */
  register(record: WorkerRecord): Promise<void> {
    return this.queue(async () => {
      await this.discovery.register(record);
      this.set({ kind: 'serving' });
    });
  }

  /** Removes whatever the key holds; throws when discovery did not confirm (the lifecycle retries). */
  unregister(workerId: string): Promise<void> {
    return this.queue(async () => {
      await this.discovery.unregister(workerId);
      this.set({ kind: 'none' });
    });
  }

  /**
   * The loading is over without serving (the engine failed or its load was stopped, the worker
   * starts drained, it shuts down first): its loading record goes, so no request waits for it. A
   * serving record is the lifecycle's to remove. Never rejects: one that cannot be removed goes with
   * the worker's lease.
   */
  withdraw(workerId: string): Promise<void> {
    return this.queue(async () => {
      if (this.state.kind === 'none') this.set({ kind: 'given_up' });
      if (this.state.kind !== 'loading') return;
      try {
        await this.discovery.unregister(workerId);
        this.set({ kind: 'given_up' });
      } catch (err) {
        this.log.warn({ event: 'discovery_loading_unregister_failed', err: (err as Error).message }, `could not remove the loading record from ${this.discovery.url}: ${(err as Error).message}`);
      }
    });
  }
}
