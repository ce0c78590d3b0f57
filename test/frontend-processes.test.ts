/**
 * `ebb frontend --processes 2`: one public port served by two relaying processes (node:cluster).
 * One fleet (two mocker workers, one frontend) for every assertion: both processes serve the port,
 * /metrics counts every request once whichever process answers the scrape, each process routes by
 * the in-flight counts of both (no herding), a killed process is replaced, and SIGTERM drains both
 * with no stream cut. And the fd room a frontend process logs at start.
 */
import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { request } from 'node:http';
import { InflightTable } from '../src/frontend/cluster/inflight-table.js';
import { openEventStream } from './helpers/event-stream.js';
import { call } from './helpers/http.js';
import { bounded, CLI, EbbProcess, spawnEbb, startFrontend, startWorker, tempDiscoveryUrl, type LogLine } from './helpers/processes.js';

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

interface Answer {
  status: number;
  process: string | undefined;
  workerId: string | undefined;
  body: string;
}

/**
 * A request on a connection of its own (no keep-alive pool): node:cluster hands each new connection
 * to the next process, round robin. `first` resolves with the head once the body's first bytes came.
 */
function fresh(url: string, method: string, path: string, body?: unknown): { first: Promise<Answer>; done: Promise<Answer> } {
  let resolveFirst!: (a: Answer) => void;
  let rejectFirst!: (err: Error) => void;
  const first = new Promise<Answer>((res, rej) => ((resolveFirst = res), (rejectFirst = rej)));
  first.catch(() => undefined);
  const done = new Promise<Answer>((resolve, reject) => {
    const req = request(`${url}${path}`, { method, agent: false, headers: body === undefined ? {} : { 'content-type': 'application/json' } }, (res) => {
      const answer: Answer = { status: res.statusCode ?? 0, process: res.headers['x-ebb-frontend-process'] as string | undefined, workerId: res.headers['x-ebb-worker-id'] as string | undefined, body: '' };
      res.setEncoding('utf8');
      res.on('data', (d: string) => {
        if (answer.body === '') resolveFirst({ ...answer, body: d });
        answer.body += d;
      });
      res.once('end', () => (resolveFirst(answer), resolve(answer)));
      res.once('error', reject);
    });
    req.once('error', (err) => (rejectFirst(err), reject(err)));
    req.end(body === undefined ? undefined : JSON.stringify(body));
  });
  return { first, done };
}

/** Waits until the primary's admin view counts `n` streams open on `workerId` (all processes' sum). */
async function adminInflight(adminUrl: string, workerId: string, n: number, what: string): Promise<void> {
  await bounded(
    (async () => {
      for (;;) {
        const view = await call('GET', `${adminUrl}/workers`);
        const entry = (view.body.workers as Array<{ worker_id: string; routing: { inflight: number } | null }>).find((w) => w.worker_id === workerId);
        if (entry?.routing?.inflight === n) return;
        await new Promise((r) => setTimeout(r, 20));
      }
    })(),
    what,
  );
}

const requestsTotal = (page: string) => Number(/^ebb_frontend_requests_total\{endpoint="\/v1\/chat\/completions",status="200"\} (\d+)$/m.exec(page)?.[1] ?? NaN);
const tokensIn = (sse: string) => sse.split('\n').filter((l) => l.startsWith('data: {') && l.includes('"delta":{"content":"')).length;
const chat = (maxTokens: number) => ({ model: 'm1', messages: [{ role: 'user', content: 'tell me about tides' }], max_tokens: maxTokens, stream: true });

describe('frontend: --processes 2', () => {
  it('serves one port from two processes, counts metrics once, shares in-flight counts, replaces a dead process, drains both on SIGTERM', async () => {
    const discovery = tempDiscoveryUrl();
    const workers = [
      await startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '40']),
      await startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '40']),
    ];
    started.push(...workers);
    const frontend = await startFrontend(discovery, ['--processes', '2', '--shutdown-grace-ms', '0', '--shutdown-timeout-ms', '20000']);
    started.push(frontend);
    const ready = await frontend.waitForEvent('frontend_ready');
    assert.equal(ready.processes, 2);
    const adminUrl = ready.admin_url as string;
    const processReady = (slot: number, after = 0) => frontend.waitForLog((l) => l.event === 'frontend_process_ready' && l.slot === slot, `process ${slot} ready`, { after });
    const [p0, p1] = (await Promise.all([processReady(0), processReady(1)])) as [LogLine, LogLine];
    assert.notEqual(p0.pid, p1.pid);
    assert.ok(p0.pid !== frontend.pid && p1.pid !== frontend.pid, 'the children are processes of their own');
    // Each child has the fleet in its own routing view before requests are sent.
    for (const w of workers) await frontend.waitForLog((l) => (l.event === 'worker_added' && l.worker_id === w.workerId) || (l.event === 'discovery_reset' && (l.workers as string[]).includes(w.workerId)), 'worker seen');

    // Both processes serve the one port.
    const answers = await Promise.all(Array.from({ length: 6 }, () => fresh(frontend.url, 'POST', '/v1/chat/completions', chat(2)).done));
    for (const a of answers) {
      assert.equal(a.status, 200, a.body);
      assert.equal(tokensIn(a.body), 2);
    }
    assert.deepEqual(new Set(answers.map((a) => a.process)), new Set(['0', '1']), 'both processes answered');

    // One /metrics for all: whichever process answers the scrape, each request is counted once.
    const scrapes = await Promise.all(Array.from({ length: 4 }, () => fresh(frontend.url, 'GET', '/metrics').done));
    assert.deepEqual(new Set(scrapes.map((s) => s.process)), new Set(['0', '1']), 'both processes answered a scrape');
    for (const s of scrapes) {
      assert.match(s.body, /^ebb_frontend_requests_total\{endpoint="\/v1\/chat\/completions",status="200"\} 6$/m, 'six requests, counted once');
      assert.match(s.body, /^ebb_frontend_processes 2$/m);
      assert.match(s.body, /^ebb_frontend_workers\{model="m1",mode="aggregated",hold="none"\} 2$/m, 'the fleet, not the fleet twice');
    }

    // In-flight counts are shared: a stream open through one process steers the next one, opened
    // through the other process, to the other worker (each process alone would see both idle).
    const a = fresh(frontend.url, 'POST', '/v1/chat/completions', chat(150));
    const aHead = await bounded(a.first, 'stream a first token');
    // The primary knows once its admin view counts it; it told the other process in the same turn.
    await adminInflight(adminUrl, aHead.workerId!, 1, 'the admin view counting stream a');
    const b = fresh(frontend.url, 'POST', '/v1/chat/completions', chat(150));
    b.done.catch(() => undefined); // cut below, with the process that relays it
    const bHead = await bounded(b.first, 'stream b first token');
    assert.notEqual(bHead.process, aHead.process, 'round robin: the second connection went to the other process');
    assert.notEqual(bHead.workerId, aHead.workerId, "the other process counted the first process's stream");

    // A killed process is replaced (with a back-off, logged), and the port keeps serving meanwhile.
    const victim = bHead.process === '1' ? p1 : p0;
    const slot = victim.slot as number;
    const mark = frontend.mark();
    process.kill(victim.pid as number, 'SIGKILL');
    const exited = await frontend.waitForLog((l) => l.event === 'frontend_process_exited', 'the dead process logged', { after: mark });
    assert.equal(exited.slot, slot);
    assert.equal(exited.signal, 'SIGKILL');
    assert.equal(typeof exited.restart_in_ms, 'number');
    const replaced = await processReady(slot, mark);
    assert.notEqual(replaced.pid, victim.pid);
    // The dead process's open stream is no longer counted on its worker (the primary forgot it).
    await adminInflight(adminUrl, bHead.workerId!, 0, "the admin view dropping the dead process's stream b");
    assert.equal((await a.done).status, 200);
    assert.equal(tokensIn((await a.done).body), 150, 'the surviving process finished its stream');
    // What the dead process counted stays counted: the six requests (half of them its own) and stream a.
    const afterDeath = (await fresh(frontend.url, 'GET', '/metrics').done).body;
    assert.ok(requestsTotal(afterDeath) >= 7, `ebb_frontend_requests_total did not go backwards when a process died: ${requestsTotal(afterDeath)}`);
    const again = await Promise.all(Array.from({ length: 4 }, () => fresh(frontend.url, 'POST', '/v1/chat/completions', chat(1)).done));
    assert.deepEqual(new Set(again.map((x) => x.process)), new Set(['0', '1']), 'the replacement serves');

    // SIGTERM drains both processes: streams open on each finish whole, then everything exits 0.
    const s1 = fresh(frontend.url, 'POST', '/v1/chat/completions', chat(40));
    const s2 = fresh(frontend.url, 'POST', '/v1/chat/completions', chat(40));
    const heads = await bounded(Promise.all([s1.first, s2.first]), 'two streams started');
    assert.deepEqual(new Set(heads.map((h) => h.process)), new Set(['0', '1']), 'one stream on each process');
    const stopMark = frontend.mark();
    frontend.signal('SIGTERM');
    const [d1, d2] = await bounded(Promise.all([s1.done, s2.done]), 'both streams end');
    for (const d of [d1, d2]) {
      assert.equal(tokensIn(d.body), 40, 'not cut');
      assert.match(d.body, /data: \[DONE\]/);
    }
    assert.equal(await frontend.exitCode(), 0);
    const stopping = frontend.logs.slice(stopMark).filter((l) => l.event === 'frontend_process_stopping');
    assert.deepEqual(new Set(stopping.map((l) => l.frontend_process)), new Set([0, 1]), 'each process drained');
  });
});

describe('frontend: --processes 2 with one process wedged', () => {
  it('shows the processes\' routing view and model figures on the admin API; answers /metrics with the other process and the wedged one marked, kills and replaces the wedged one, keeps its counts', async () => {
    const discovery = tempDiscoveryUrl();
    const worker = await startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '0']);
    started.push(worker);
    const frontend = await startFrontend(discovery, ['--processes', '2', '--shutdown-grace-ms', '0']);
    started.push(frontend);
    const ready = await frontend.waitForEvent('frontend_ready');
    const processReady = (slot: number, after = 0) => frontend.waitForLog((l) => l.event === 'frontend_process_ready' && l.slot === slot, `process ${slot} ready`, { after });
    const [, p1] = (await Promise.all([processReady(0), processReady(1)])) as [LogLine, LogLine];
    await frontend.waitForLog((l) => (l.event === 'worker_added' && l.worker_id === worker.workerId) || (l.event === 'discovery_reset' && (l.workers as string[]).includes(worker.workerId)), 'worker seen');
    const answers = await Promise.all(Array.from({ length: 4 }, () => fresh(frontend.url, 'POST', '/v1/chat/completions', chat(1)).done));
    assert.deepEqual(new Set(answers.map((a) => a.process)), new Set(['0', '1']), 'both processes answered');
    // Both processes' figures are in a scrape before process 1 stops answering (its latest are kept).
    assert.equal(requestsTotal((await fresh(frontend.url, 'GET', '/metrics').done).body), 4);
    // The primary's admin API shows the processes' routing view and traffic (from that answer).
    const view = await call('GET', `${ready.admin_url as string}/workers`);
    const entry = (view.body.workers as Array<{ worker_id: string; kv: { router?: string; queued_prefill_tokens?: number } | null }>).find((w) => w.worker_id === worker.workerId);
    assert.equal(entry?.kv?.router, 'kv', `GET /workers has the routing view: ${JSON.stringify(entry)}`);
    assert.equal(entry?.kv?.queued_prefill_tokens, 0);
    const events = await openEventStream(`${ready.admin_url as string}/workers/events`);
    const snapshot = await events.waitFor((e) => e.event === 'snapshot', 'the fleet events snapshot');
    events.close();
    const m1 = (snapshot.data.models as Array<{ model: string; requests: number }>).find((m) => m.model === 'm1');
    assert.equal(m1?.requests, 4, `the dashboard's model figures count both processes' requests: ${JSON.stringify(snapshot.data.models)}`);

    const mark = frontend.mark();
    process.kill(p1.pid as number, 'SIGSTOP');
    // Two new connections: round robin hands one to process 0, which answers the scrape.
    const tries = [fresh(frontend.url, 'GET', '/metrics'), fresh(frontend.url, 'GET', '/metrics')];
    for (const t of tries) t.done.catch(() => undefined); // the one handed to the stopped process is cut when it is killed
    const scrape = await bounded(Promise.any(tries.map((t) => t.done)), 'a scrape answered while process 1 is stopped');
    assert.equal(scrape.status, 200, scrape.body);
    assert.equal(scrape.process, '0');
    assert.match(scrape.body, /^ebb_frontend_processes_answering 1$/m, 'the stopped process is marked missing');
    assert.equal(requestsTotal(scrape.body), 4, "the stopped process's requests are still counted");

    const wedged = await frontend.waitForLog((l) => l.event === 'frontend_process_wedged', 'the primary detecting the stopped process', { after: mark });
    assert.equal(wedged.pid, p1.pid);
    const exited = await frontend.waitForLog((l) => l.event === 'frontend_process_exited', 'the stopped process killed', { after: mark });
    assert.equal(exited.signal, 'SIGKILL');
    const replaced = await processReady(1, mark);
    assert.notEqual(replaced.pid, p1.pid);
    const again = await Promise.all(Array.from({ length: 4 }, () => fresh(frontend.url, 'POST', '/v1/chat/completions', chat(1)).done));
    assert.deepEqual(new Set(again.map((x) => x.process)), new Set(['0', '1']), 'new connections are served by both processes again');
    const after = (await fresh(frontend.url, 'GET', '/metrics').done).body;
    assert.match(after, /^ebb_frontend_processes_answering 2$/m);
    assert.equal(requestsTotal(after), 8, "the killed process's counts stay in the totals");
  });
});

describe('frontend: file-descriptor room', () => {
  it('runs at the hard fd limit even when started under a lower soft one, and logs the streams that leaves room for', async () => {
    const hard = Number(execFileSync('sh', ['-c', 'ulimit -Hn'], { encoding: 'utf8' }).trim());
    const soft = Math.min(hard, 512);
    const proc = spawn('sh', ['-c', `ulimit -Sn ${soft} && exec "$0" "$@"`, process.execPath, CLI, 'frontend', '--port', '0', '--discovery', tempDiscoveryUrl()], {
      env: { ...process.env, EBB_LOG_LEVEL: 'info', EBB_LOG_FORMAT: 'json' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const frontend = new EbbProcess(proc, 'frontend');
    started.push(frontend);
    const limits = await frontend.waitForEvent('frontend_limits');
    assert.equal(limits.fd_limit, hard, `Node raised the soft limit ${soft} to the hard one`);
    assert.equal(limits.fd_limit_hard, hard);
    assert.equal(limits.streams_room, Math.floor((limits.fd_budget as number) / 2), 'two descriptors per stream: client connection and worker socket');
    await frontend.terminate();
  });
});

describe('ebb up --processes', () => {
  it('runs its frontend with that many processes, and stops them on Ctrl-C', async () => {
    const up = spawnEbb(['up', '--port', '0', '--workers', '1', '--mocker-itl-ms', '0', '--processes', '2'], 'ebb up');
    started.push(up);
    const ready = await up.waitForEvent('frontend_ready');
    assert.equal(ready.processes, 2);
    const answers = await Promise.all(Array.from({ length: 4 }, () => fresh(ready.url as string, 'POST', '/v1/completions', { model: 'ebb-mock', prompt: 'x', max_tokens: 2 }).done));
    assert.deepEqual(
      answers.map((a) => a.status),
      [200, 200, 200, 200],
    );
    assert.deepEqual(new Set(answers.map((a) => a.process)), new Set(['0', '1']));
    up.signal('SIGINT');
    assert.equal(await up.exitCode(), 0);
    assert.match(up.stderr.join('\n'), /ebb up: stopped \(workers drained, frontend closed\)/);
    assert.equal(up.logs.filter((l) => l.event === 'frontend_process_stopping').length, 2);
  });
});

describe('InflightTable (the primary\'s sum of the processes\' in-flight counts)', () => {
  it('tells each process what the others have open, and forgets a process that died', () => {
    const t = new InflightTable();
    t.report(1, [['a', 2], ['b', 1]]);
    t.report(2, [['a', 1]]);
    assert.deepEqual(new Set(t.flush()), new Set(['a', 'b']));
    assert.deepEqual(t.peersOf(1, ['a', 'b']), [['a', 1], ['b', 0]]);
    assert.deepEqual(t.peersOf(2, ['a', 'b']), [['a', 2], ['b', 1]]);
    // Absolute counts: a repeated report changes nothing; a move between processes still marks the worker.
    t.report(1, [['a', 2]]);
    assert.deepEqual(t.flush(), []);
    t.report(1, [['a', 1]]);
    t.report(2, [['a', 2]]);
    assert.deepEqual(t.flush(), ['a']);
    assert.equal(t.total('a'), 3);
    t.forget(2);
    assert.equal(t.total('a'), 1);
    assert.deepEqual(t.peersOf(1, ['a']), [['a', 0]]);
    assert.deepEqual(t.flush(), ['a']);
  });
});

describe('frontend: --processes 2 keeps streams resumable whichever process a resume reaches', () => {
  it('a resume, a retrieve and a next turn reaching the other process are passed to the one that holds the stream', async () => {
    const discovery = tempDiscoveryUrl();
    started.push(await startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '0', '--mocker-ttft-ms', '0']));
    // Every stream kept (no client here says x-ebb-resumable): the flag's job.
    const frontend = await startFrontend(discovery, ['--processes', '2', '--keep-streams', 'all']);
    started.push(frontend);
    await Promise.all([0, 1].map((slot) => frontend.waitForLog((l) => l.event === 'frontend_process_ready' && l.slot === slot, `process ${slot} ready`)));
    await frontend.waitForLog((l) => l.event === 'worker_added' || (l.event === 'discovery_reset' && (l.workers as string[]).length === 1), 'the worker seen');
    const original = await fresh(frontend.url, 'POST', '/v1/chat/completions', chat(30)).done;
    assert.equal(original.status, 200, original.body);
    const id = /"id":"(chatcmpl-[0-9a-f]+)"/.exec(original.body)![1]!;
    const afterFive = original.body.slice(original.body.indexOf('\n\n', original.body.indexOf('id: 5\n')) + 2);
    // New connections go round robin: four resumes reach both processes.
    const resumes = await Promise.all(Array.from({ length: 4 }, () => fresh(frontend.url, 'GET', `/v1/chat/completions/${id}?stream=true&starting_after=5`).done));
    assert.deepEqual(new Set(resumes.map((r) => r.process)), new Set(['0', '1']), 'both processes took a resume');
    for (const r of resumes) {
      assert.equal(r.status, 200, r.body);
      assert.equal(r.body, afterFive, 'the same events, byte for byte, whichever process answered');
    }
    const first = JSON.parse((await fresh(frontend.url, 'POST', '/v1/responses', { model: 'm1', input: 'tell me about tides', max_output_tokens: 4 }).done).body) as { id: string; output: unknown[] };
    const retrieved = await Promise.all(Array.from({ length: 2 }, () => fresh(frontend.url, 'GET', `/v1/responses/${first.id}`).done));
    for (const r of retrieved) assert.deepEqual((JSON.parse(r.body) as { output: unknown[] }).output, first.output);
    const turns = await Promise.all(Array.from({ length: 2 }, () => fresh(frontend.url, 'POST', '/v1/responses', { model: 'm1', input: 'and the moon?', previous_response_id: first.id, max_output_tokens: 3 }).done));
    for (const t of turns) assert.equal(t.status, 200, t.body);
    assert.equal(JSON.parse(turns[0]!.body).output[0].content[0].text, JSON.parse(turns[1]!.body).output[0].content[0].text, 'the same history, whichever process took the turn');
  });
});
