/**
 * The long-prompt incident, end to end on real sockets: the simulated vLLM prefills in proportion to the prompt,
 * so under a mixed load the long prompts miss their TTFT while the short ones meet theirs — and the ledger must
 * say so per `prompt_len` class, including for the long prompts that fail or time out before any usage arrives.
 *
 * Timing margins (the only timing this test depends on), with the simulator's jitter off:
 * - long prompts: 25 000 tokens × 100 ms per 1 000 = 2 500 ms of prefill + 5 ms TTFT, at least 5× their 500 ms
 *   threshold (`slo.ttft_by_prompt_len["16k-64k"]`), and 5× the 500 ms first-output deadline of the timeout case;
 * - short prompts: 3 tokens, whose prefill rounds to 0 ms, so 5 ms at the simulator: 1/50 of their 250 ms
 *   threshold (`slo.ttft`), which leaves 245 ms for the gateway on a loaded machine before a short one could miss.
 * No sleeps: requests are awaited, then the gateway's settlements and the simulator's request-end events.
 */
import { afterEach, describe, expect, it } from 'vitest';
import type { RequestRecord } from '../src/sim/server.js';
import { CHAT, metricValue, post, startStack, type Stack } from './helpers/stack.js';

const LONG_TOKENS = 25_000;
/** 100 000 characters: the gateway estimates 25 000 tokens at metrics.chars_per_token 4, the simulator counts the same. */
const LONG_TEXT = 'x'.repeat(LONG_TOKENS * 4);
/** Token ids on /v1/completions: counted exactly by both. */
const LONG_IDS = Array.from({ length: LONG_TOKENS }, (_, i) => i % 1000);
const PREFILL_MS_PER_1K = 100;
const SHORT_TTFT_SLO_MS = 250;
const LONG_TTFT_SLO_MS = 500;

const SHORT = { ...CHAT, stream: true };
const LONG_CHAT = { model: 'sim-model', stream: true, messages: [{ role: 'user', content: LONG_TEXT }] };
const LONG_COMPLETION = { model: 'sim-model', stream: true, prompt: LONG_IDS };

let stacks: Stack[] = [];
afterEach(async () => {
  await Promise.all(stacks.map((s) => s.close()));
  stacks = [];
});

async function incidentStack(config: Record<string, unknown> = {}): Promise<Stack> {
  const stack = await startStack({
    sim: { ttftMs: 5, prefillMsPer1kTokens: PREFILL_MS_PER_1K, jitter: 0 },
    config: {
      slo: { ttft: `${SHORT_TTFT_SLO_MS}ms`, ttft_by_prompt_len: { '16k-64k': `${LONG_TTFT_SLO_MS}ms` } },
      // One attempt per request and no ejection, so every count below is one request's own result.
      retries: { max_attempts: 1 },
      health: { interval: '1h', eject_after_failures: 1000 },
      ...config,
    },
  });
  stacks.push(stack);
  return stack;
}

const statuses = (count: number, status: number): number[] => Array.from({ length: count }, () => status);

type SloTable = Map<string, Map<string, number>>;

/** waybill_slo_requests_total by prompt_len, then result, read from one scrape. */
function sloTable(text: string): SloTable {
  const table: SloTable = new Map();
  for (const line of text.split('\n')) {
    const match = /^waybill_slo_requests_total\{([^}]*)\} (\S+)$/.exec(line);
    if (match === null) continue;
    const labels = new Map([...(match[1] ?? '').matchAll(/(\w+)="([^"]*)"/g)].map((m) => [m[1], m[2]]));
    const promptLen = labels.get('prompt_len') ?? '';
    const result = labels.get('result') ?? '';
    const row = table.get(promptLen) ?? new Map<string, number>();
    row.set(result, (row.get(result) ?? 0) + Number(match[2]));
    table.set(promptLen, row);
  }
  return table;
}

/**
 * The dashboard's SLO attainment, `met / (all − excluded)`, grouped by prompt_len instead of model: what
 * `sum by (prompt_len) (rate(…{result="met"}))  / sum by (prompt_len) (rate(…{result!="excluded"}))` gives over
 * a window that holds the whole run. undefined where the denominator is 0 (the `> 0` guard drops the series).
 */
function attainment(table: SloTable, promptLen: string): number | undefined {
  const row = table.get(promptLen) ?? new Map<string, number>();
  const counted = [...row].filter(([result]) => result !== 'excluded').reduce((sum, [, value]) => sum + value, 0);
  return counted > 0 ? (row.get('met') ?? 0) / counted : undefined;
}

describe('the long-prompt incident', () => {
  it('long prompts miss their TTFT under a mixed load while short ones meet theirs, counted in their classes', async () => {
    const s = await incidentStack();
    const shortCount = 20;
    // 3 chat prompts sent as text (class estimated from characters, then confirmed by usage) and 2 token-id prompts.
    const longBodies = [LONG_CHAT, LONG_CHAT, LONG_CHAT, LONG_COMPLETION, LONG_COMPLETION];
    // Long prompts that fail: the engine errors where it would have sent the first token, after the prefill.
    const failingCount = 2;
    const replies = await Promise.all([
      ...Array.from({ length: shortCount }, () => post(s.base, '/v1/chat/completions', SHORT)),
      ...longBodies.map((body) => post(s.base, body === LONG_CHAT ? '/v1/chat/completions' : '/v1/completions', body)),
      ...Array.from({ length: failingCount }, () =>
        post(s.base, '/v1/chat/completions', LONG_CHAT, { 'x-sim-fault': 'error_before_output=503' }),
      ),
    ]);
    // Nothing was sent to the failing ones' clients before the error, so the gateway relays it as a status.
    expect(replies.map((r) => r.status)).toEqual([...statuses(shortCount + longBodies.length, 200), ...statuses(failingCount, 503)]);
    const total = shortCount + longBodies.length + failingCount;
    const settlements = await s.settled(total);
    expect(settlements).toHaveLength(total);

    // The margins hold as designed (lower bounds only: an upper bound on a loaded machine would be a guess).
    const long = settlements.filter((x) => x.promptLen === '16k-64k' && x.outcome === 'delivered');
    expect(long).toHaveLength(longBodies.length);
    for (const x of long) {
      expect(x.usage?.promptTokens).toBe(LONG_TOKENS);
      expect(x.ttftMs).toBeGreaterThanOrEqual(5 * LONG_TTFT_SLO_MS);
    }

    const text = await s.metricsText();
    const slo = (labels: Record<string, string>): number => metricValue(text, 'waybill_slo_requests_total', labels);
    expect(slo({ prompt_len: '16k-64k', result: 'missed_ttft' })).toBe(longBodies.length);
    expect(slo({ prompt_len: '16k-64k', result: 'met' })).toBe(0);
    expect(slo({ prompt_len: '16k-64k', result: 'failed' })).toBe(failingCount);
    expect(slo({ prompt_len: '0-1k', result: 'met' })).toBe(shortCount);
    expect(slo({ prompt_len: '0-1k' })).toBe(shortCount);
    expect(slo({ prompt_len: 'unknown' })).toBe(0);
    expect(slo({})).toBe(total);

    const requests = (labels: Record<string, string>): number => metricValue(text, 'waybill_requests_total', labels);
    expect(requests({ outcome: 'delivered' })).toBe(shortCount + longBodies.length);
    expect(requests({ outcome: 'failed', code: '503' })).toBe(failingCount);
    expect(requests({})).toBe(total);

    // The TTFT histogram has the long requests in their class, all above its threshold (a bucket, since Waybill
    // adds thresholds to the buckets); the short ones all within theirs. Failed requests delivered no first token.
    const ttft = (suffix: string, labels: Record<string, string>): number =>
      metricValue(text, `waybill_time_to_first_token_seconds_${suffix}`, labels);
    expect(ttft('count', { prompt_len: '16k-64k' })).toBe(longBodies.length);
    expect(ttft('bucket', { prompt_len: '16k-64k', le: String(LONG_TTFT_SLO_MS / 1000) })).toBe(0);
    expect(ttft('bucket', { prompt_len: '16k-64k', le: '+Inf' })).toBe(longBodies.length);
    expect(ttft('count', { prompt_len: '0-1k' })).toBe(shortCount);
    expect(ttft('bucket', { prompt_len: '0-1k', le: String(SHORT_TTFT_SLO_MS / 1000) })).toBe(shortCount);
    expect(ttft('count', { prompt_len: 'unknown' })).toBe(0);

    // The dashboard's attainment, per class: plain in the classes, blended into 20 of 27 in the total.
    const table = sloTable(text);
    expect(attainment(table, '16k-64k')).toBe(0);
    expect(attainment(table, '0-1k')).toBe(1);
    expect(attainment(table, '1k-4k')).toBeUndefined();
    const overall = [...table.keys()].map((c) => table.get(c)?.get('met') ?? 0).reduce((a, b) => a + b, 0) / total;
    expect(overall).toBeCloseTo(shortCount / total, 10);
  });

  it('long prompts that outlast the first-output deadline are failed timeouts in 16k-64k, not unknown', async () => {
    // The deadline is 1/5 of the long prompts' prefill and 100× the short prompts' TTFT at the simulator.
    const FIRST_OUTPUT_MS = 500;
    const s = await incidentStack({ timeouts: { first_output: `${FIRST_OUTPUT_MS}ms` } });
    const sim = s.sims[0];
    if (sim === undefined) throw new Error('no simulator');
    const longCount = 3;
    const shortCount = 5;
    // The simulator's record of each long request ends when the gateway gives up on it and leaves.
    const abandoned: RequestRecord[] = [];
    const allAbandoned = new Promise<void>((resolve) => {
      sim.events.on('request-end', (record: RequestRecord) => {
        if (record.end === 'client_disconnect') abandoned.push(record);
        if (abandoned.length === longCount) resolve();
      });
    });
    const replies = await Promise.all([
      ...Array.from({ length: longCount }, (_, i) =>
        i === 0 ? post(s.base, '/v1/completions', LONG_COMPLETION) : post(s.base, '/v1/chat/completions', LONG_CHAT),
      ),
      ...Array.from({ length: shortCount }, () => post(s.base, '/v1/chat/completions', SHORT)),
    ]);
    expect(replies.map((r) => r.status)).toEqual([...statuses(longCount, 504), ...statuses(shortCount, 200)]);
    const settlements = await s.settled(longCount + shortCount);
    const timedOut = settlements.filter((y) => y.outcome === 'timeout');
    expect(timedOut).toHaveLength(longCount);
    for (const x of timedOut) expect(x).toMatchObject({ promptLen: '16k-64k', usage: undefined, slo: 'failed' });
    await allAbandoned;
    // The prefill timer went with the request: nothing is left running or waiting at the simulator.
    expect(abandoned.map((r) => [r.status, r.outputEventsSent])).toEqual(Array.from({ length: longCount }, () => [200, 0]));
    expect(sim.stats().inflight).toBe(0);

    expect(await s.metric('waybill_slo_requests_total', { prompt_len: '16k-64k', result: 'failed' })).toBe(longCount);
    expect(await s.metric('waybill_slo_requests_total', { prompt_len: '0-1k', result: 'met' })).toBe(shortCount);
    expect(await s.metric('waybill_slo_requests_total', { prompt_len: 'unknown' })).toBe(0);
    expect(await s.metric('waybill_requests_total', { outcome: 'timeout', code: '504' })).toBe(longCount);
    expect(await s.metric('waybill_time_to_first_token_seconds_count', { prompt_len: '16k-64k' })).toBe(0);
    const table = sloTable(await s.metricsText());
    expect(attainment(table, '16k-64k')).toBe(0);
    expect(attainment(table, '0-1k')).toBe(1);
  });
});
