import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { FairShare, MAX_IDLE_TENANTS } from '../src/frontend/admission/fair-share.js';
import { queueRetryAfterS, ServiceRate, RATE_SAMPLES } from '../src/frontend/admission/service-rate.js';

/** The admission queue's pure parts: the tenants' fair share and the Retry-After of its 429s. */
describe('fair share', () => {
  it('charges a request at its grant, by the tokens it asks for, and refunds a turn that ends unserved', () => {
    const f = new FairShare();
    for (const t of ['a', 'b']) f.join(t);
    f.charge('a', 1000);
    assert.equal(f.start('a'), 1000, "a's next request starts where its 1000 tokens end");
    assert.equal(f.start('b'), 0, 'b has had nothing');
    const c = f.charge('b', 3);
    assert.equal(f.start('b'), 3);
    f.refund(c);
    assert.equal(f.start('b'), 0, 'a turn that found no worker costs nothing');
  });

  it('requests that left without a grant cost their tenant nothing', () => {
    const f = new FairShare();
    f.join('c');
    for (let i = 0; i < 50; i++) f.join('a');
    for (let i = 0; i < 50; i++) f.leave('a');
    f.join('a');
    assert.equal(f.start('a'), f.start('c'), 'a starts even with c, whatever its burst was');
  });

  it('an idle tenant keeps what it owes while the virtual time has not passed it, and is dropped once it has', () => {
    const f = new FairShare();
    f.join('b');
    f.join('a');
    f.charge('a', 100);
    f.leave('a');
    f.join('a');
    assert.equal(f.start('a'), 100, 'back at once: it still owes its 100 tokens');
    f.leave('a');
    // b is served past where a's share ends: a owes nothing any more.
    for (let i = 0; i < 40; i++) f.charge('b', 3);
    assert.equal(f.start('a'), f.start('b') - 3);
    assert.ok(f.start('a') >= 100);
  });

  it('tenant entries are dropped when idle: a queue kept busy while 40,000 tenants come and go holds only those queued, and a bounded few that owe', () => {
    const f = new FairShare();
    f.join('steady');
    for (let i = 0; i < 40_000; i++) {
      const t = `tenant-${i}`;
      f.join(t);
      f.charge(t, 3);
      f.leave(t);
      f.charge('steady', 3);
    }
    assert.ok(f.size <= 200, `${f.size} entries held`);
    // With nothing moving the virtual time on, those that owe are bounded too.
    const g = new FairShare();
    g.join('steady');
    for (let i = 0; i < 40_000; i++) {
      const t = `tenant-${i}`;
      g.join(t);
      g.charge(t, 3);
      g.leave(t);
    }
    assert.ok(g.size <= MAX_IDLE_TENANTS + 1, `${g.size} entries held`);
  });
});

describe("the queue's Retry-After", () => {
  it('is the queue timeout while no admission rate is known, else when the requests ahead (and this one) would be admitted', () => {
    assert.equal(queueRetryAfterS(10, undefined, 30_000), 30);
    assert.equal(queueRetryAfterS(10, undefined, 1_500), 2, 'rounded up');
    assert.equal(queueRetryAfterS(9, 2, 30_000), 5, '10 requests at 2 a second');
    assert.equal(queueRetryAfterS(0, 100, 30_000), 1, 'never 0');
  });

  it("the rate is the model's recent admissions per second, over the last samples", () => {
    const r = new ServiceRate();
    assert.equal(r.perSecond(0), undefined);
    r.admitted(0);
    assert.equal(r.perSecond(100), undefined, 'one admission says no rate');
    for (let i = 1; i <= 10; i++) r.admitted(i * 250);
    assert.equal(r.perSecond(2500), 4, '10 admissions in 2.5 s');
    for (let i = 11; i <= 100; i++) r.admitted(i * 1000);
    assert.equal(r.perSecond(100_000), 1, `the last ${RATE_SAMPLES}: one a second`);
  });
});
