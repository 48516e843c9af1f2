/**
 * The admission queue's leading signals over real sockets: while requests wait behind max_inflight, the scrape reads
 * how long the oldest has waited and how many prompt tokens (as estimated before dispatch) are queued; both fall back
 * to 0 once the queue drains.
 */
import { once } from 'node:events';
import { describe, expect, it } from 'vitest';
import { useCleanups } from './helpers/cleanups.js';
import { CHAT, post, startStack, type Stack } from './helpers/stack.js';

const cleanups = useCleanups();

const labels = { model: 'sim-model' };

async function waitForDepth(s: Stack, depth: number): Promise<number> {
  for (let i = 0; i < 400; i++) {
    if ((await s.metric('waybill_queue_depth', labels)) === depth) return performance.now();
    await new Promise((r) => setTimeout(r, 5));
  }
  throw new Error(`queue depth never reached ${depth}`);
}

describe('admission queue gauges', () => {
  it('read the oldest waiter age and the queued prompt tokens by value while requests wait', async () => {
    // One slot: the first request holds it for the simulator's TTFT, the next two wait.
    const s = await startStack({ sim: { ttftMs: 800 }, admission: { max_inflight: 1, max_queue: 5 } });
    cleanups.push(() => s.close());
    const sim = s.sims[0];
    if (sim === undefined) throw new Error('no simulator');
    expect(await s.metric('waybill_queue_oldest_wait_seconds', labels)).toBe(0);
    expect(await s.metric('waybill_queue_prompt_tokens', labels)).toBe(0);

    const started = once(sim.events, 'request-start');
    const first = post(s.base, '/v1/chat/completions', { ...CHAT, stream: true });
    await started;
    // Legacy completions with 7 token ids: counted exactly.
    const sentSecond = performance.now();
    const second = post(s.base, '/v1/completions', { model: 'sim-model', prompt: [1, 2, 3, 4, 5, 6, 7], max_tokens: 4 });
    const queuedSecond = await waitForDepth(s, 1);
    expect(await s.metric('waybill_queue_prompt_tokens', labels)).toBe(7);
    // Chat with 41 characters of text: ceil(41 / 4) = 11 tokens at the default metrics.chars_per_token.
    const third = post(s.base, '/v1/chat/completions', { model: 'sim-model', messages: [{ role: 'user', content: 'x'.repeat(41) }], max_tokens: 4 });
    await waitForDepth(s, 2);
    expect(await s.metric('waybill_queue_prompt_tokens', labels)).toBe(7 + 11);

    // The oldest waiter is the second request: it was queued after it was sent and before depth 1 was seen.
    await new Promise((r) => setTimeout(r, 200));
    const before = performance.now();
    const age = await s.metric('waybill_queue_oldest_wait_seconds', labels);
    const after = performance.now();
    expect(age).toBeGreaterThanOrEqual((before - queuedSecond) / 1000);
    expect(age).toBeLessThanOrEqual((after - sentSecond) / 1000);
    expect(age).toBeGreaterThanOrEqual(0.2);

    // The first ends: the second is admitted, the third (11 tokens) is now alone and oldest.
    expect((await first).status).toBe(200);
    await waitForDepth(s, 1);
    expect(await s.metric('waybill_queue_prompt_tokens', labels)).toBe(11);

    expect((await second).status).toBe(200);
    expect((await third).status).toBe(200);
    await s.settled(3);
    expect(await s.metric('waybill_queue_depth', labels)).toBe(0);
    expect(await s.metric('waybill_queue_oldest_wait_seconds', labels)).toBe(0);
    expect(await s.metric('waybill_queue_prompt_tokens', labels)).toBe(0);
  }, 20_000);
});
