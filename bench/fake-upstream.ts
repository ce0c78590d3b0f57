/**
 * A worker that costs nothing, for benches where the frontend must be the bottleneck: POST
 * /generate answers `max_tokens` NDJSON token lines and the done line, built once per length and
 * written in one piece. It speaks just enough of the request plane for the frontend's relay (no
 * admission, no lifecycle); the bench puts its record into file discovery itself.
 *
 *   node dist/bench/fake-upstream.js [port]     (prints "listening <port>")
 */
import { createServer } from 'node:http';

const bodies = new Map<number, Buffer>();
function answer(maxTokens: number): Buffer {
  let b = bodies.get(maxTokens);
  if (!b) {
    const lines = Array.from({ length: maxTokens }, (_, i) => `{"text":"${i === 0 ? '' : ' '}tok${i}"}\n`);
    lines.push(`${JSON.stringify({ done: true, finish_reason: 'length', usage: { prompt_tokens: 5, completion_tokens: maxTokens, total_tokens: 5 + maxTokens } })}\n`);
    bodies.set(maxTokens, (b = Buffer.from(lines.join(''))));
  }
  return b;
}

const server = createServer({ keepAliveTimeout: 65_000 }, (req, res) => {
  let body = '';
  req.setEncoding('utf8');
  req.on('data', (c: string) => (body += c));
  req.on('end', () => {
    if (req.method !== 'POST' || req.url !== '/generate') {
      res.writeHead(req.url === '/live' || req.url === '/health' ? 200 : 404, { 'content-type': 'application/json' });
      res.end('{"status":"ok"}');
      return;
    }
    const maxTokens = Math.max(1, Number((JSON.parse(body) as { max_tokens?: number }).max_tokens ?? 16));
    const out = answer(maxTokens);
    res.writeHead(200, { 'content-type': 'application/x-ndjson', 'content-length': out.length });
    res.end(out);
  });
});
server.listen(Number(process.argv[2] ?? 0), '127.0.0.1', () => console.log(`listening ${(server.address() as { port: number }).port}`));
for (const sig of ['SIGINT', 'SIGTERM'] as const) process.on(sig, () => process.exit(0));
