/**
 * The prompt-length class is known before dispatch, so the requests of a long-prompt incident — the ones that time
 * out or fail before any usage arrives — are counted in their class, not as `unknown`.
 */
import { describe, expect, it } from 'vitest';
import { useCleanups } from './helpers/cleanups.js';
import { startScriptedFor } from './helpers/scripted.js';
import { post, startStack, type Stack } from './helpers/stack.js';

const cleanups = useCleanups();

async function silentGateway(): Promise<Stack> {
  // An upstream that takes the request and never answers: a prefill that outlasts the first-output deadline.
  const upstream = await startScriptedFor(cleanups, () => undefined);
  const stack = await startStack({
    sims: 0,
    extraUpstreams: [{ name: 'slow', url: upstream.url }],
    config: { health: { interval: '1h' }, timeouts: { first_output: '200ms' }, retries: { max_attempts: 1 } },
  });
  cleanups.push(() => stack.close());
  return stack;
}

describe('prompt_len before usage', () => {
  it('a ~25k-token chat prompt that times out is counted in 16k-64k', async () => {
    const s = await silentGateway();
    const response = await post(s.base, '/v1/chat/completions', { model: 'sim-model', stream: true, messages: [{ role: 'user', content: 'x'.repeat(100_000) }] });
    expect(response.status).toBe(504);
    const [settlement] = await s.settled(1);
    expect(settlement).toMatchObject({ outcome: 'timeout', promptLen: '16k-64k', usage: undefined });
    expect(await s.metric('waybill_slo_requests_total', { prompt_len: '16k-64k', result: 'failed' })).toBe(1);
    expect(await s.metric('waybill_slo_requests_total', { prompt_len: 'unknown' })).toBe(0);
  });

  it('a token-id completions prompt is counted exactly', async () => {
    const s = await silentGateway();
    await post(s.base, '/v1/completions', { model: 'sim-model', prompt: Array.from({ length: 4096 }, (_, i) => i) });
    const [settlement] = await s.settled(1);
    expect(settlement).toMatchObject({ outcome: 'timeout', promptLen: '4k-16k' });
  });
});
