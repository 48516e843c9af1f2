/**
 * The simulator's lengthRate (--length-rate): a share of chat and completions answers end with finish_reason
 * `length`, so a canary revision that truncates more can be played on one engine of a fleet (issue 25, incident 2).
 */
import { afterEach, describe, expect, it } from 'vitest';
import { request } from 'undici';
import { parseSimArgs } from '../src/sim/main.js';
import { validateSimOptions } from '../src/sim/options.js';
import { createSimulator, type Simulator } from '../src/sim/server.js';

let sims: Simulator[] = [];
afterEach(async () => {
  await Promise.all(sims.map((sim) => sim.close()));
  sims = [];
});

async function start(options: Parameters<typeof createSimulator>[0]): Promise<string> {
  const sim = createSimulator({ ttftMs: 0, itlMs: 0, outputTokens: 2, jitter: 0, ...options });
  sims.push(sim);
  return (await sim.listen(0, '127.0.0.1')).url;
}

/** The finish reasons of `count` answers (streamed chat and non-stream completions, alternately). */
async function finishReasons(url: string, count: number, headers: Record<string, string> = {}): Promise<string[]> {
  const reasons: string[] = [];
  for (let i = 0; i < count; i++) {
    const stream = i % 2 === 0;
    const path = stream ? '/v1/chat/completions' : '/v1/completions';
    const body = stream ? { model: 'sim-model', stream, messages: [{ role: 'user', content: 'hi' }] } : { model: 'sim-model', prompt: 'hi' };
    const response = await request(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
    const text = await response.body.text();
    expect(response.statusCode).toBe(200);
    const found = [...text.matchAll(/"finish_reason":"(\w+)"/g)].map((m) => m[1] ?? '');
    expect(found).toHaveLength(1);
    reasons.push(...found);
  }
  return reasons;
}

describe('lengthRate', () => {
  it('ends about that share of answers with finish_reason length, the rest stop; the same seed gives the same answers', async () => {
    const url = await start({ lengthRate: 0.3, seed: 5 });
    const reasons = await finishReasons(url, 200);
    const lengths = reasons.filter((r) => r === 'length').length;
    expect(reasons.filter((r) => r !== 'length' && r !== 'stop')).toEqual([]);
    // Binomial(200, 0.3): mean 60, sd 6.5; ±4 sd.
    expect(lengths).toBeGreaterThan(34);
    expect(lengths).toBeLessThan(86);
    const again = await finishReasons(await start({ lengthRate: 0.3, seed: 5 }), 200);
    expect(again).toEqual(reasons);
  });

  it('0 (the default) never, and an x-sim-fault header is answered as it says', async () => {
    expect(new Set(await finishReasons(await start({}), 20))).toEqual(new Set(['stop']));
    const url = await start({ lengthRate: 1 });
    expect(new Set(await finishReasons(url, 4))).toEqual(new Set(['length']));
    expect(new Set(await finishReasons(url, 4, { 'x-sim-fault': 'tokens=2' }))).toEqual(new Set(['stop']));
  });

  it('is validated, and set by --length-rate or per engine by --engine I:length-rate=F', () => {
    expect(validateSimOptions({ lengthRate: 1.5 })).toMatchObject({ ok: false, problems: [{ option: 'lengthRate' }] });
    expect(parseSimArgs(['--length-rate', '0.25'])).toMatchObject({ ok: true, args: { options: { lengthRate: 0.25 } } });
    const fleet = parseSimArgs(['--engines', '2', '--engine', '1:length-rate=0.3']);
    expect(fleet).toMatchObject({ ok: true, args: { engines: [{ options: { lengthRate: 0 } }, { options: { lengthRate: 0.3 } }] } });
  });
});
