import type { DiscoveryEvent, FleetEvent } from './discovery.js';

/**
 * A listener of serving records, fed by a watch that reports loading ones too: to it a loading
 * record is no record (a worker it knew serving that now loads, a restart under its id, has left).
 */
export function servingOnly(listener: (event: DiscoveryEvent) => void): (event: FleetEvent) => void {
  /** The workers it was last told are serving. */
  const serving = new Set<string>();
  return (event) => {
    if (event.type === 'reset') {
      serving.clear();
      for (const r of event.records) serving.add(r.worker_id);
      listener({ type: 'reset', records: event.records });
    } else if (event.type === 'put') {
      serving.add(event.record.worker_id);
      listener(event);
    } else {
      const id = event.type === 'loading' ? event.record.worker_id : event.worker_id;
      if (serving.delete(id)) listener({ type: 'delete', worker_id: id });
    }
  };
}
