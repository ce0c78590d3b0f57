import { EventEmitter } from 'node:events';
import type { Logger } from 'pino';
import { Backoff, pause } from '../common/backoff.js';
import { KubeError, type KubeObject, type ListWatchApi, type V1Pod, type WatchEvent } from './client.js';

export interface PodWatcherOptions {
  namespace: string;
  labelSelector?: string | undefined;
  fieldSelector?: string | undefined;
  /** Asked of the server; it ends the watch after this long and we re-watch from where we were. */
  watchTimeoutSeconds?: number;
}

/** After a failed list or watch; every pod's watcher may fail at once when the API server does. */
const RETRY = { minMs: 250, maxMs: 5000, jitter: true };
/** Past the server's own timeout, silence means a half-open connection: abort it and re-watch. */
const SILENCE_MARGIN_MS = 30_000;

/**
 * List, then watch from the list's resourceVersion with bookmarks (pods by default; any kind with
 * a list and a watch, e.g. nodes); what the watcher holds is the
 * API server's view, and it only ever reports what the server said. A watch that ends is resumed
 * from the last resourceVersion seen (an event or a bookmark); one the server answers 410 Gone
 * (the version was compacted away) is replaced by a fresh list, diffed against what was held, so
 * only real changes are reported. Errors and outages report nothing but the error: they never
 * stand in for a pod's state.
 *
 * Emits 'pod' (pod) for an added or changed pod, 'deleted' (pod), 'relisted' after a 410 or
 * outage re-list, and 'api_error' (err) for each failed attempt (retried with back-off).
 */
export class PodWatcher<T extends KubeObject = V1Pod> extends EventEmitter {
  readonly pods = new Map<string, T>();
  private resourceVersion = '';
  private readonly stop = new AbortController();
  private current: { abort(): void } | undefined;
  private running: Promise<void> | undefined;

  constructor(
    private readonly api: ListWatchApi<T>,
    private readonly opts: PodWatcherOptions,
    private readonly log: Logger,
  ) {
    super();
  }

  /** The first list: resolves once the watcher holds the current pods; throws if the API cannot be read. */
  async start(): Promise<void> {
    await this.list(false);
    this.running = this.loop();
  }

  async close(): Promise<void> {
    this.stop.abort();
    this.current?.abort();
    await this.running;
  }

  private async list(relist: boolean): Promise<void> {
    const { items, resourceVersion } = await this.api.list(this.opts.namespace, { labelSelector: this.opts.labelSelector, fieldSelector: this.opts.fieldSelector });
    const seen = new Set<string>();
    for (const pod of items) {
      const name = pod.metadata?.name ?? '';
      seen.add(name);
      const held = this.pods.get(name);
      this.pods.set(name, pod);
      if (held?.metadata?.resourceVersion !== pod.metadata?.resourceVersion) this.emit('pod', pod);
    }
    for (const [name, pod] of this.pods) {
      if (seen.has(name)) continue;
      this.pods.delete(name);
      this.emit('deleted', pod);
    }
    this.resourceVersion = resourceVersion;
    if (relist) {
      this.log.info({ event: 'k8s_relisted', namespace: this.opts.namespace, resource_version: resourceVersion, pods: items.length }, 'pods re-listed');
      this.emit('relisted');
    }
  }

  private async loop(): Promise<void> {
    let needList = false;
    const backoff = new Backoff(RETRY);
    while (!this.stop.signal.aborted) {
      let err: Error | null = null;
      try {
        if (needList) await this.list(true);
        needList = false;
        const ended = await this.watchOnce();
        if (ended === 'gone') {
          this.log.info({ event: 'k8s_watch_expired', resource_version: this.resourceVersion }, 'watch resourceVersion is too old (410 Gone): re-listing');
          needList = true;
        } else if (ended !== 'closed') err = ended;
      } catch (e) {
        err = e as Error; // only the list throws; it is retried as a list
      }
      if (this.stop.signal.aborted) return;
      if (err === null) {
        backoff.reset();
        continue;
      }
      const delay = backoff.next();
      this.log.warn({ event: 'k8s_api_error', err: err.message, retry_in_ms: delay }, `Kubernetes API: ${err.message}; retrying`);
      this.emit('api_error', err);
      if (!(await pause(delay, this.stop.signal))) return;
    }
  }

  /** One watch connection: 'closed' when it ended cleanly, 'gone' on 410, else the error. */
  private watchOnce(): Promise<'closed' | 'gone' | Error> {
    const timeoutSeconds = this.opts.watchTimeoutSeconds ?? 300;
    return new Promise((resolve) => {
      let outcome: 'closed' | 'gone' | Error | undefined;
      let done = false;
      let silence: NodeJS.Timeout | undefined;
      // The only way to notice a half-open connection is that nothing, not even a bookmark, arrives.
      const heard = () => {
        clearTimeout(silence);
        silence = setTimeout(() => {
          outcome ??= new Error(`watch silent for ${timeoutSeconds * 1000 + SILENCE_MARGIN_MS} ms`);
          this.current?.abort();
        }, timeoutSeconds * 1000 + SILENCE_MARGIN_MS);
      };
      const onEvent = (e: WatchEvent<T>) => {
        heard();
        const rv = e.object.metadata?.resourceVersion;
        if (e.type === 'ERROR') {
          outcome ??= e.object.code === 410 ? 'gone' : new KubeError(e.object.code, `watch error: ${e.object.message ?? e.object.reason ?? 'unknown'}`);
          this.current?.abort();
          return;
        }
        if (rv) this.resourceVersion = rv;
        if (e.type === 'BOOKMARK') return;
        const name = e.object.metadata?.name ?? '';
        if (e.type === 'DELETED') {
          this.pods.delete(name);
          this.emit('deleted', e.object);
        } else {
          this.pods.set(name, e.object);
          this.emit('pod', e.object);
        }
      };
      const onDone = (err: Error | null) => {
        if (done) return;
        done = true;
        clearTimeout(silence);
        this.current = undefined;
        if (err instanceof KubeError && err.code === 410) outcome ??= 'gone';
        resolve(outcome ?? err ?? 'closed');
      };
      heard();
      this.api
        .watch(this.opts.namespace, { resourceVersion: this.resourceVersion, labelSelector: this.opts.labelSelector, fieldSelector: this.opts.fieldSelector, timeoutSeconds }, onEvent, onDone)
        .then(
          (handle) => {
            if (done) return;
            this.current = handle;
            if (this.stop.signal.aborted || outcome !== undefined) handle.abort();
          },
          (err: unknown) => onDone(err as Error),
        );
    });
  }
}
