import { createServer, connect, type Server, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';

/**
 * A TCP proxy in front of one server whose link can be stalled: while stalled, every byte in
 * either direction (and every new connection's) is held, not dropped; released, it all flows in
 * order. A network partition that heals, made to order: the client on the far side sees nothing
 * change for as long as the test says, and then everything that happened meanwhile.
 */
export class StallProxy {
  private server: Server | undefined;
  private stalled = false;
  private readonly held: Array<{ to: Socket; chunk: Buffer }> = [];
  private readonly sockets = new Set<Socket>();
  /** host:port clients connect to. */
  address = '';

  constructor(
    private readonly targetHost: string,
    private readonly targetPort: number,
  ) {}

  async start(): Promise<string> {
    this.server = createServer((client) => {
      const upstream = connect(this.targetPort, this.targetHost);
      for (const s of [client, upstream]) {
        this.sockets.add(s);
        s.on('close', () => this.sockets.delete(s));
        s.on('error', () => undefined);
      }
      const forward = (to: Socket) => (chunk: Buffer) => {
        if (this.stalled) this.held.push({ to, chunk });
        else to.write(chunk);
      };
      client.on('data', forward(upstream));
      upstream.on('data', forward(client));
      client.on('close', () => upstream.destroy());
      upstream.on('close', () => client.destroy());
    });
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    this.address = `127.0.0.1:${(this.server.address() as AddressInfo).port}`;
    return this.address;
  }

  stall(): void {
    this.stalled = true;
  }

  release(): void {
    this.stalled = false;
    for (const { to, chunk } of this.held.splice(0)) if (!to.destroyed) to.write(chunk);
  }

  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }
}
