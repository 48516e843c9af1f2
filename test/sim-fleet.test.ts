/**
 * Two demonstrations on the simulator's fleet, through a real gateway picking as today (power of two choices on its
 * own in-flight count: `least_request`), documented in docs/simulator.md ("Two fleet demonstrations"):
 *
 * 1. The long-prompt incident on one engine: engine 3 is kept near full KV by other clients' long prompts (seen only
 *    in its /metrics), so the gateway's 16k–64k prompts placed there wait in its queue and miss their TTFT, while the
 *    same prompts on the three other engines (KV under 60 %) meet it.
 *    Margins: on engines 0–2 a 20 000-token prompt prefills in 10 steps of 2 048 tokens (≈ 49 ms each) plus at most two
 *    other long prompts' steps, ≈ 1.5 s at worst, against a 4 s threshold; on engine 3 it waits behind a queue of
 *    external 18 000-token prompts that only two at a time fit (each ≈ 1.3 s), held at ≥ 3 waiting before the gateway's
 *    traffic starts, so ≥ 2 s before its own prefill — and the gateway's first-output deadline (6 s) may cut it: either
 *    way it is not `met`. A request whose client-side TTFT is within 300 ms of the threshold is left unclassified.
 * 2. A shared-prefix workload placed at random: each engine's KV holds about a third of the 12 system prompts, so the
 *    cached-prompt ratio from usage is about what random placement predicts, (K / G) × (prefix tokens / prompt
 *    tokens) with K prefixes per engine; with KV for all of them it is about (1 − misses / N) × prefix share, misses
 *    being the first visit of each prefix to each engine. Tolerances are three binomial standard deviations; with a
 *    third of the prefixes per engine, the prediction is a range, K − 1 to K cached, as a running sequence pins one.
 */
import { request } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';
import type { EngineSnapshot } from '../src/sim/engine/types.js';
import { metricValue, startStack, type Stack } from './helpers/stack.js';

let stacks: Stack[] = [];
afterEach(async () => {
  await Promise.all(stacks.map((s) => s.close()));
  stacks = [];
});

interface Observed {
  readonly status: number;
  readonly delivered: boolean;
  /** Client-side: request sent → first content event, ms. */
  readonly ttftMs: number | undefined;
  readonly promptTokens: number | undefined;
  readonly cachedTokens: number | undefined;
}

async function stream(base: string, messages: unknown[]): Promise<Observed> {
  const sentAt = performance.now();
  const response = await request(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'sim-model', stream: true, stream_options: { include_usage: true }, messages }),
    headersTimeout: 30_000,
    bodyTimeout: 30_000,
  });
  let ttftMs: number | undefined;
  let text = '';
  for await (const chunk of response.body) {
    text += (chunk as Buffer).toString();
    if (ttftMs === undefined && text.includes('"content":"') && /"content":"[^"]/.test(text)) ttftMs = performance.now() - sentAt;
  }
  const usageLine = text.split('\n').find((line) => line.includes('"usage":{'));
  const usage = usageLine === undefined ? undefined : (JSON.parse(usageLine.slice(6)) as { usage: { prompt_tokens: number; prompt_tokens_details?: { cached_tokens: number } } }).usage;
  return {
    status: response.statusCode,
    delivered: response.statusCode === 200 && text.endsWith('data: [DONE]\n\n'),
    ttftMs,
    promptTokens: usage?.prompt_tokens,
    cachedTokens: usage === undefined ? undefined : (usage.prompt_tokens_details?.cached_tokens ?? 0),
  };
}

/** Polls the engines' own state on every turn of the event loop until `check` holds (the engines step on timers). */
async function until(check: () => boolean, what: string, ms = 20_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

/** Runs `tasks` with at most `concurrency` at once, in order. */
async function pool<T>(count: number, concurrency: number, task: (i: number) => Promise<T>): Promise<T[]> {
  const results: T[] = new Array<T>(count);
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < count) {
        const i = next++;
        results[i] = await task(i);
      }
    }),
  );
  return results;
}

const FLEET = { engineModel: true, promptTokensDetails: true, jitter: 0 } as const;

describe('the long-prompt incident on one engine of four', () => {
  it('its 16k-64k prompts miss their TTFT at high KV use while the other engines meet it', async () => {
    const THRESHOLD_MS = 2_000;
    const LONG_TOKENS = 20_000;
    const s = await startStack({
      sims: 4,
      sim: { ...FLEET, outputTokens: 8 },
      // Engine 3: KV for two 18 000-token prompts and little more, kept busy by other clients' long prompts.
      simEach: [undefined, undefined, undefined, { kvBlocks: 2_600, externalLoad: 2, externalPromptTokens: 18_000, externalOutputTokens: 100 }],
      // Picking as Waybill always has: the demonstration is what the engines do, not what routing could do about it.
      routing: { policy: 'least_request' },
      config: {
        slo: { ttft: '500ms', ttft_by_prompt_len: { '16k-64k': `${THRESHOLD_MS}ms` } },
        retries: { max_attempts: 1 },
        timeouts: { first_output: '6s', idle: '10s', total: '30s' },
        health: { interval: '1h', eject_after_failures: 1000 },
      },
    });
    stacks.push(s);
    const snapshot = (i: number): EngineSnapshot => s.sims[i]?.engineSnapshot() ?? ({} as EngineSnapshot);
    await until(() => snapshot(3).waiting >= 3, 'engine 3 to have other clients queued');

    const peaks = [0, 0, 0, 0];
    const sampler = setInterval(() => {
      for (let i = 0; i < 4; i++) peaks[i] = Math.max(peaks[i] ?? 0, snapshot(i).kvUsage);
    }, 20);
    const longPrompt = (i: number): unknown[] => [{ role: 'user', content: `${String(i).padStart(4, '0')}${'y'.repeat(LONG_TOKENS * 4 - 4)}` }];
    const observed = await pool(12, 6, (i) => stream(s.base, longPrompt(i)));
    clearInterval(sampler);
    const settlements = await s.settled(12);

    const onBusy = settlements.filter((x) => x.attempts.at(-1)?.upstream === 'sim-3');
    const onOthers = settlements.filter((x) => x.attempts.at(-1)?.upstream !== 'sim-3');
    expect(onBusy.length).toBeGreaterThan(0);
    expect(onOthers.length).toBeGreaterThan(0);
    for (const x of onOthers) {
      expect(x.promptLen).toBe('16k-64k');
      expect(x.usage?.promptTokens).toBe(LONG_TOKENS);
      // Unclassified when borderline: within 300 ms of the threshold.
      if (x.ttftMs !== undefined && Math.abs(x.ttftMs - THRESHOLD_MS) < 300) continue;
      expect(x.slo).toBe('met');
    }
    console.log(`long-prompt incident: ${JSON.stringify(settlements.map((x) => [x.attempts.at(-1)?.upstream, x.slo, Math.round(x.ttftMs ?? -1)]))}, peak KV use ${peaks.map((p) => p.toFixed(2)).join(' ')}`);
    for (const x of onBusy) {
      expect(x.promptLen).toBe('16k-64k');
      if (x.ttftMs !== undefined && Math.abs(x.ttftMs - THRESHOLD_MS) < 300) continue;
      expect(x.slo === 'missed_ttft' || x.slo === 'failed').toBe(true);
    }
    // The clients saw the same split: as many over the threshold (or failed) as the gateway counted not met.
    const clientMissed = observed.filter((o) => !o.delivered || (o.ttftMs ?? Infinity) >= THRESHOLD_MS).length;
    const ledgerMissed = settlements.filter((x) => x.slo !== 'met').length;
    expect(Math.abs(clientMissed - ledgerMissed)).toBeLessThanOrEqual(settlements.filter((x) => x.ttftMs !== undefined && Math.abs(x.ttftMs - THRESHOLD_MS) < 300).length);
    // One replica near full KV while the others stay well under: what its /metrics says, and what no gateway count shows.
    expect(peaks[3]).toBeGreaterThanOrEqual(0.85);
    for (const i of [0, 1, 2]) expect(peaks[i]).toBeLessThan(0.6);
    // Engine 3's requests waited in its queue; the others' did not (vLLM's own request_queue_time histogram).
    const queued = await Promise.all([0, 1, 2, 3].map(async (i) => metricValue(await (await request(`${simUrl(s, i)}/metrics`)).body.text(), 'vllm:request_queue_time_seconds_sum')));
    // (The others' is not 0: a waiting prompt there waits for the step's token budget the running prefills use.)
    console.log(`queue time, seconds summed per engine: ${queued.map((q) => q.toFixed(2)).join(' ')}`);
    expect(queued[3]).toBeGreaterThan(3 * Math.max(queued[0] ?? 0, queued[1] ?? 0, queued[2] ?? 0));
    expect(s.sims[3]?.stats().requests).toBe(onBusy.length);
  }, 60_000);
});

/** Simulator i's URL: the stack names its upstreams sim-i, in order. */
function simUrl(s: Stack, index: number): string {
  const url = s.gateway.config.pools[0]?.upstreams[index]?.url;
  return url === undefined ? '' : new URL(String(url)).origin;
}

describe('a shared-prefix workload placed at random', () => {
  const GROUPS = 12;
  const PREFIX_TOKENS = 512;
  const QUESTION_TOKENS = 16;
  const REQUESTS = 240;
  /**
   * One request in flight per engine on average: a running sequence pins its prefix's blocks, and with more of them at
   * once on a loaded machine the engine caches fewer prefixes than K (at 8, a CI run measured 0.22 against 0.32).
   */
  const CONCURRENCY = 4;
  /** A distinct system prompt per group, distinct from its first token on (4 characters a token). */
  const system = (g: number): string => `g${String(g).padStart(3, '0')}${'abcdefgh'.repeat(PREFIX_TOKENS / 2)}`.slice(0, PREFIX_TOKENS * 4);
  const question = (i: number): string => `q${String(i).padStart(QUESTION_TOKENS * 4 - 1, '0')}`;
  /** Uniform popularity, drawn from a fixed sequence so every run sends the same requests. */
  const groupOf = (i: number): number => (i * 7 + Math.floor(i / GROUPS) * 5) % GROUPS;

  async function run(kvBlocks: number): Promise<{ ratio: number; observed: Observed[] }> {
    const s = await startStack({
      sims: 4,
      sim: { ...FLEET, outputTokens: 4, kvBlocks },
      // Random placement: least_request (the power of two choices on in-flight) knows nothing of prefixes.
      routing: { policy: 'least_request' },
      config: { retries: { max_attempts: 1 }, health: { interval: '1h', eject_after_failures: 1000 } },
    });
    stacks.push(s);
    const observed = await pool(REQUESTS, CONCURRENCY, (i) =>
      stream(s.base, [
        { role: 'system', content: system(groupOf(i)) },
        { role: 'user', content: question(i) },
      ]),
    );
    const prompt = observed.reduce((sum, o) => sum + (o.promptTokens ?? 0), 0);
    const cached = observed.reduce((sum, o) => sum + (o.cachedTokens ?? 0), 0);
    return { ratio: cached / prompt, observed };
  }

  it('has the cached ratio random placement predicts when one engine holds a third of the prefixes', async () => {
    const prefixBlocks = PREFIX_TOKENS / 16;
    // 4 prefixes of 32 blocks, plus the question and output blocks of the sequences an engine runs at once.
    const kvBlocks = 4 * prefixBlocks + 12;
    const { ratio, observed } = await run(kvBlocks);
    expect(observed.filter((o) => !o.delivered).map((o) => o.status)).toEqual([]);
    expect(observed.every((o) => o.promptTokens === PREFIX_TOKENS + QUESTION_TOKENS)).toBe(true);
    const share = PREFIX_TOKENS / (PREFIX_TOKENS + QUESTION_TOKENS);
    // K / G with K = 4 prefixes per engine; a sequence running on the engine pins its prefix's blocks, so while one is
    // in flight (the average here) the free queue caches as few as K − 1 others: a hit of (K − 1) / G to K / G.
    const hit = 4 / GROUPS;
    const pinned = 3 / GROUPS;
    const tolerance = 3 * Math.sqrt((hit * (1 - hit)) / REQUESTS);
    const [low, high] = [pinned * share - tolerance, hit * share + tolerance];
    console.log(`shared prefix, KV for 4 of ${GROUPS} prefixes per engine: cached ratio ${ratio.toFixed(3)}, predicted ${(pinned * share).toFixed(3)}–${(hit * share).toFixed(3)} ± ${tolerance.toFixed(3)}`);
    expect(ratio).toBeGreaterThan(low);
    expect(ratio).toBeLessThan(high);
  }, 60_000);

  it('and, with KV for every prefix, misses only each prefix’s first visit to each engine', async () => {
    const { ratio, observed } = await run(8192);
    expect(observed.every((o) => o.delivered)).toBe(true);
    const share = PREFIX_TOKENS / (PREFIX_TOKENS + QUESTION_TOKENS);
    // Each of the 12 prefixes is sent 20 times; the chance an engine never sees one is (3/4)^20 ≈ 0.3 %, so misses
    // are ≈ 12 × 4 first visits.
    const hit = 1 - (GROUPS * 4) / REQUESTS;
    const predicted = hit * share;
    const tolerance = 3 * Math.sqrt((hit * (1 - hit)) / REQUESTS);
    console.log(`shared prefix, KV for all: cached ratio ${ratio.toFixed(3)}, predicted ${predicted.toFixed(3)} ± ${tolerance.toFixed(3)}`);
    expect(Math.abs(ratio - predicted)).toBeLessThan(tolerance);
  }, 60_000);
});
