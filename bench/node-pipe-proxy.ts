/**
 * The floor of any Node.js proxy, for the peer benchmark: a TCP pipe (net.Socket to net.Socket,
 * no HTTP parsing, no framing, nothing per token), one upstream connection per client connection.
 * Whatever it spends per relayed token is what Node's socket read and write paths cost on this
 * machine; a frontend in Node cannot go below it.
 *
 *   node dist/bench/node-pipe-proxy.js <listen-port> <upstream-port>    (prints "listening <port>")
 */
import { connect, createServer } from 'node:net';

const [listenPort, upstreamPort] = process.argv.slice(2).map(Number);
if (!Number.isInteger(listenPort) || !Number.isInteger(upstreamPort)) {
  console.error('usage: node-pipe-proxy <listen-port> <upstream-port>');
  process.exit(2);
}

const server = createServer({ noDelay: true }, (client) => {
  const upstream = connect({ port: upstreamPort as number, host: '127.0.0.1', noDelay: true });
  client.pipe(upstream).pipe(client);
  const close = () => {
    client.destroy();
    upstream.destroy();
  };
  client.once('error', close).once('close', close);
  upstream.once('error', close).once('close', close);
});
server.listen(listenPort, '127.0.0.1', () => console.log(`listening ${(server.address() as { port: number }).port}`));
for (const sig of ['SIGINT', 'SIGTERM'] as const) process.on(sig, () => process.exit(0));
