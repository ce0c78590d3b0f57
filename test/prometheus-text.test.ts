import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { MetricsFormatError, parseSampleLine, readSamples, sumGauge } from '../src/engine/prometheus-text.js';

describe('Prometheus text reader (idleness probes)', () => {
  it('reads labelled and unlabelled samples, with escapes, exponents and timestamps', () => {
    assert.deepEqual(parseSampleLine('a:b{x="1",y="q\\"uo\\\\te\\n"} 2.5e+00 1700000000000'), { name: 'a:b', labels: { x: '1', y: 'q"uo\\te\n' }, value: 2.5 });
    assert.deepEqual(parseSampleLine('llamacpp:requests_processing 3'), { name: 'llamacpp:requests_processing', labels: {}, value: 3 });
    assert.equal(parseSampleLine('x{le="+Inf"} +Inf').value, Infinity);
    assert.ok(Number.isNaN(parseSampleLine('x NaN').value));
  });

  it('sums a gauge over its label sets and ignores other metrics, including longer names sharing the prefix', () => {
    const page = [
      '# HELP vllm:num_requests_running Number of requests running.',
      '# TYPE vllm:num_requests_running gauge',
      'vllm:num_requests_running{engine="0",model_name="m"} 1.0',
      'vllm:num_requests_running{engine="1",model_name="m"} 2.0',
      'vllm:num_requests_running_extra{model_name="m"} 100.0',
      'something else entirely { that is not parsed',
    ].join('\n');
    assert.equal(sumGauge(readSamples(page, ['vllm:num_requests_running']), 'vllm:num_requests_running'), 3);
  });

  it('fails (never a silent 0) on a missing gauge, a garbled sample or a value that is not a count', () => {
    assert.throws(() => sumGauge(readSamples('<html>502</html>', ['g']), 'g'), MetricsFormatError);
    assert.throws(() => readSamples('g{a="1"} lots', ['g']), MetricsFormatError);
    assert.throws(() => readSamples('g{a="1} 1', ['g']), MetricsFormatError);
    assert.throws(() => readSamples('g 1 2 3', ['g']), MetricsFormatError);
    for (const bad of ['NaN', '-1', '+Inf']) assert.throws(() => sumGauge(readSamples(`g ${bad}`, ['g']), 'g'), MetricsFormatError, bad);
  });
});
