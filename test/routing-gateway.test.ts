/**
 * Routing that sees the engines, on real sockets through a real gateway (docs/routing.md): cache_aware sends a prefix
 * back where it is cached and checks its guess against vLLM's usage; engine signals scraped from each upstream's
 * /metrics steer new prefixes away from a busy engine; stale, lying and absent /metrics are counted and never break
 * picking; an engine restart drops its index entries. Engines are the simulator's engine model, or, for /metrics the
 * simulator would never serve, small upstreams scripted here.
 *
 * Waiting on the gateway's own scrapes (engine_signals.interval 50 ms here) is polling with a deadline on its
 * counters: the condition is awaited, never slept for.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { request } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';
import { until } from './helpers/poll.js';
import { metricValue, startStack, type Stack } from './helpers/stack.js';

let stacks: Stack[] = [];
const servers: Server[] = [];
afterEach(async () => {
  await Promise.all(stacks.map((s) => s.close()));
  stacks = [];
  for (const server of servers.splice(0)) {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
});

/** 1 160 characters: 18 full 64-character prefix blocks (288 tokens), shared by every question below. */
const SYSTEM = 'You are a helpful assistant. '.repeat(40);
const FAST_SIGNALS = { engine_signals: { interval: '50ms', timeout: '40ms', stale_after: '300ms' } };

interface Answer {
  readonly status: number;
  readonly cached: number | undefined;
  readonly text: string;
}

async function chat(base: string, system: string, question: string, headers: Record<string, string> = {}): Promise<Answer> {
  const response = await request(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'sim-model', stream: true, stream_options: { include_usage: true }, messages: [{ role: 'system', content: system }, { role: 'user', content: question }] }),
  });
  const text = await response.body.text();
  const line = text.split('\n').find((l) => l.startsWith('data: {') && l.includes('"usage":{'));
  const parsed = line === undefined ? undefined : (JSON.parse(line.slice(6)) as { usage: { prompt_tokens_details?: { cached_tokens: number } } }).usage;
  return { status: response.statusCode, cached: parsed?.prompt_tokens_details?.cached_tokens, text };
}

/** A vLLM-shaped upstream whose /metrics says what the test wants; it answers chat with a two-token stream. */
async function engine(metrics: () => string | null): Promise<{ url: string; chats: () => number }> {
  let chats = 0;
  const server = createServer((req, res) => {
    req.resume();
    if (req.url === '/health') return void res.end();
    if (req.url === '/version') return void res.writeHead(200, { 'content-type': 'application/json' }).end('{"version":"0.9.1"}');
    if (req.url === '/metrics') {
      const body = metrics();
      if (body === null) return; // never answers: a hung /metrics
      res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' });
      return void res.end(body);
    }
    chats++;
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
      const chunk = (delta: unknown, finish: string | null) =>
        `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'sim-model', choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }] })}\n\n`;
      res.end(`${chunk({ role: 'assistant', content: '' }, null)}${chunk({ content: 'hi' }, null)}${chunk({}, 'stop')}data: [DONE]\n\n`);
    });
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, chats: () => chats };
}

const vllmMetrics = (waiting: number, running: number, kv: number, start = 1_700_000_000): string =>
  [
    '# TYPE vllm:num_requests_waiting gauge',
    `vllm:num_requests_waiting{engine="0",model_name="sim-model"} ${waiting}`,
    '# TYPE vllm:num_requests_running gauge',
    `vllm:num_requests_running{engine="0",model_name="sim-model"} ${running}`,
    '# TYPE vllm:kv_cache_usage_perc gauge',
    `vllm:kv_cache_usage_perc{engine="0",model_name="sim-model"} ${kv}`,
    '# TYPE process_start_time_seconds gauge',
    `process_start_time_seconds ${start}`,
    '',
  ].join('\n');

describe('cache_aware against the engine model', () => {
  it('sends a shared prefix back where it is cached, and counts the prediction against what vLLM cached', async () => {
    const s = await startStack({
      sims: 3,
      sim: { engineModel: true, promptTokensDetails: true, outputTokens: 4, jitter: 0 },
      config: FAST_SIGNALS,
    });
    stacks.push(s);
    // The stack's pool takes the default policy (cache_aware); usage without details then counts only when reported.
    const answers: Answer[] = [];
    for (let i = 0; i < 6; i++) answers.push(await chat(s.base, SYSTEM, `question number ${i}?`));
    expect(answers.map((a) => a.status)).toEqual([200, 200, 200, 200, 200, 200]);
    // The first is new everywhere; every later one lands where its 18 blocks are cached.
    expect(answers.map((a) => a.cached)).toEqual([undefined, 288, 288, 288, 288, 288]);
    const served = s.sims.map((sim) => sim.stats().requests);
    expect(served.filter((n) => n === 6)).toHaveLength(1);

    const text = await s.metricsText();
    const m = (name: string, labels: Record<string, string> = {}) => metricValue(text, name, { model: 'sim-model', pool: 'sim', ...labels });
    expect(m('waybill_routing_decisions_total', { policy: 'cache_aware', reason: 'prefix' })).toBe(5);
    expect(m('waybill_routing_decisions_total', { policy: 'cache_aware', reason: 'load' })).toBe(1);
    // Only the five whose usage reported cached tokens are compared (the pool does not declare usage_reports_cached_tokens).
    expect(m('waybill_routing_predicted_cached_tokens_total')).toBe(5 * 288);
    expect(m('waybill_routing_cached_tokens_total')).toBe(5 * 288);
    expect(m('waybill_routing_prompt_tokens_total')).toBeGreaterThan(5 * 288);
  });

  it('with least_request the same prefixes spread, and nothing is predicted', async () => {
    const lr = await startStack({
      sims: 3,
      sim: { engineModel: true, promptTokensDetails: true, outputTokens: 4, jitter: 0 },
      config: FAST_SIGNALS,
      routing: { policy: 'least_request' },
    });
    stacks.push(lr);
    const answers = await Promise.all(Array.from({ length: 9 }, (_, i) => chat(lr.base, SYSTEM, `q${i}`)));
    expect(answers.every((a) => a.status === 200)).toBe(true);
    // Nine at once over three engines: the power of two choices spreads them, so at least two engines served.
    expect(lr.sims.filter((sim) => sim.stats().requests > 0).length).toBeGreaterThanOrEqual(2);
    const text = await lr.metricsText();
    expect(metricValue(text, 'waybill_routing_decisions_total', { policy: 'least_request', reason: 'load' })).toBe(9);
    expect(metricValue(text, 'waybill_routing_predicted_cached_tokens_total')).toBe(0);
  });

  it('drops an engine’s index entries when it restarts: the next request is placed afresh and predicted nothing', async () => {
    const s = await startStack({
      sims: 2,
      sim: { engineModel: true, promptTokensDetails: true, outputTokens: 4, jitter: 0 },
      config: FAST_SIGNALS,
      routing: { usage_reports_cached_tokens: true },
    });
    stacks.push(s);
    await chat(s.base, SYSTEM, 'first');
    const home = s.sims.findIndex((sim) => sim.stats().requests === 1);
    await until('signals from both engines', async () => (await s.metric('waybill_upstream_engine_signals_up')) === 2);
    s.sims[home]?.restart();
    await until('the restart to be seen', async () => (await s.metric('waybill_upstream_engine_restarts_total', { upstream: `sim-${home}`, cause: 'start_time' })) === 1);
    const after = await chat(s.base, SYSTEM, 'second');
    expect(after.cached).toBeUndefined();
    const text = await s.metricsText();
    // Two requests compared (the pool declares its upstreams report cached tokens: absent is 0), none predicted cached.
    expect(metricValue(text, 'waybill_routing_predicted_cached_tokens_total')).toBe(0);
    expect(metricValue(text, 'waybill_routing_cached_tokens_total')).toBe(0);
  });
});

describe('cache_aware bounded by what an engine can hold', () => {
  /** Three system prompts of 18 blocks each that share no block; with a question each takes 19 index blocks. */
  const systems = ['alpha', 'bravo', 'charlie'].map((word) => `${word} ${'You are a helpful assistant. '.repeat(40)}`.slice(0, SYSTEM.length));

  async function predictedForReturn(engineSignals: boolean): Promise<{ predicted: number; cached: number | undefined }> {
    // 40 KV blocks of 16 tokens: room for two of the three prompts, not three.
    const s = await startStack({
      sims: 1,
      sim: { engineModel: true, promptTokensDetails: true, outputTokens: 4, jitter: 0, kvBlocks: 40 },
      config: engineSignals ? FAST_SIGNALS : { engine_signals: { enabled: false } },
      routing: { usage_reports_cached_tokens: true },
    });
    stacks.push(s);
    if (engineSignals) await until('signals from the engine', async () => (await s.metric('waybill_upstream_engine_signals_up')) === 1);
    for (const system of systems) expect((await chat(s.base, system, 'a question?')).status).toBe(200);
    const before = await s.metric('waybill_routing_predicted_cached_tokens_total', { model: 'sim-model', pool: 'sim' });
    const again = await chat(s.base, systems[0] ?? '', 'a question?');
    const after = await s.metric('waybill_routing_predicted_cached_tokens_total', { model: 'sim-model', pool: 'sim' });
    return { predicted: after - before, cached: again.cached };
  }

  it('forgets, as vLLM evicts, the oldest prefix once the engine’s cache_config_info capacity is exceeded', async () => {
    const bounded = await predictedForReturn(true);
    // The index holds 40 blocks (640 tokens / block_tokens 16): after bravo and charlie (18 full blocks each), alpha
    // keeps its 4 most recently recorded, leading blocks. vLLM evicted alpha the same way, within one block: it also
    // spends blocks on each question's partial block and the answers, which the index does not record.
    expect(bounded.predicted).toBe(4 * 16);
    expect(Math.abs((bounded.cached ?? 0) - bounded.predicted)).toBeLessThanOrEqual(16);
  });

  it('without engine signals the index cannot know and goes on predicting the whole prefix', async () => {
    const unbounded = await predictedForReturn(false);
    expect(unbounded.predicted).toBe(18 * 16);
    expect(unbounded.cached ?? 0).toBeLessThan(unbounded.predicted);
  });
});

describe('cache_aware across a configuration reload', () => {
  it('keeps where prefixes went when the pool and its routing are unchanged', async () => {
    const s = await startStack({ sims: 3, sim: { engineModel: true, promptTokensDetails: true, outputTokens: 4, jitter: 0 }, config: FAST_SIGNALS });
    stacks.push(s);
    await chat(s.base, SYSTEM, 'before the reload');
    const decisions = async (reason: string) => s.metric('waybill_routing_decisions_total', { reason });
    // The same configuration again (a SIGHUP with nothing changed, or a change elsewhere): the index is kept.
    expect((await s.gateway.reload(s.gateway.config)).result).toBe('ok');
    const prefixBefore = await decisions('prefix');
    await chat(s.base, SYSTEM, 'after the reload');
    expect(await decisions('prefix')).toBe(prefixBefore + 1);
    expect(s.sims.map((sim) => sim.stats().requests).filter((n) => n === 2)).toHaveLength(1);
  });
});

describe('cache_aware under a burst, and with sessions', () => {
  it('spreads a burst of one prefix within the bound: never more than ceil(1.5 × mean) on one upstream', async () => {
    // Long answers, so all eight are in flight together: each pick sees the earlier ones' load (counted at pick time).
    const s = await startStack({ sims: 4, sim: { engineModel: true, promptTokensDetails: true, outputTokens: 200, jitter: 0 }, config: FAST_SIGNALS });
    stacks.push(s);
    const answers = await Promise.all(Array.from({ length: 8 }, (_, i) => chat(s.base, SYSTEM, `burst ${i}`)));
    expect(answers.every((a) => a.status === 200)).toBe(true);
    const served = s.sims.map((sim) => sim.stats().requests);
    // The 8th pick sees 7 in flight: an upstream may hold at most ceil(1.5 × 8 / 4) = 3.
    expect(Math.max(...served)).toBeLessThanOrEqual(3);
    expect(served.reduce((a, b) => a + b, 0)).toBe(8);
    const text = await s.metricsText();
    expect(metricValue(text, 'waybill_routing_decisions_total', { reason: 'bounded_load' }) + metricValue(text, 'waybill_routing_decisions_total', { reason: 'load' })).toBeGreaterThan(0);
  });

  it('keeps a session on one upstream whatever its prompts, and measures its idle gaps', async () => {
    const s = await startStack({
      sims: 4,
      sim: { engineModel: true, promptTokensDetails: true, outputTokens: 4, jitter: 0 },
      config: FAST_SIGNALS,
      routing: { session_header: 'x-session-id', usage_reports_cached_tokens: true },
    });
    stacks.push(s);
    for (let turn = 0; turn < 4; turn++) {
      // Each turn a different system prompt: only the session can keep them together.
      for (const session of ['alpha', 'beta']) expect((await chat(s.base, `${session}-${turn}-${SYSTEM}`, 'q', { 'x-session-id': session })).status).toBe(200);
    }
    const served = s.sims.map((sim) => sim.stats().requests).filter((n) => n > 0);
    // Both sessions' four turns each on one upstream (possibly the same one for both).
    expect(served.every((n) => n % 4 === 0)).toBe(true);
    const text = await s.metricsText();
    expect(metricValue(text, 'waybill_routing_decisions_total', { reason: 'session' })).toBe(8);
    // Three gaps per session after its first turn; the first turn of each is `first`.
    expect(metricValue(text, 'waybill_routing_session_idle_gap_seconds_count')).toBe(6);
    expect(metricValue(text, 'waybill_routing_session_prompt_tokens_total', { gap: 'first' })).toBeGreaterThan(0);
    expect(metricValue(text, 'waybill_routing_session_prompt_tokens_total', { gap: '0-10s' })).toBeGreaterThan(0);
  });
});

describe('engine signals', () => {
  it('keeps new prefixes off an engine whose own queue is long, and spreads them over the rest', async () => {
    const quiet = await Promise.all([engine(() => vllmMetrics(0, 1, 0.1)), engine(() => vllmMetrics(0, 1, 0.1))]);
    const busy = await engine(() => vllmMetrics(50, 64, 0.95));
    const s = await startStack({
      sims: 0,
      extraUpstreams: [
        { name: 'quiet-0', url: quiet[0]?.url ?? '' },
        { name: 'quiet-1', url: quiet[1]?.url ?? '' },
        { name: 'busy', url: busy.url },
      ],
      config: FAST_SIGNALS,
    });
    stacks.push(s);
    await until('signals from all three', async () => (await s.metric('waybill_upstream_engine_signals_up')) === 3);
    for (let i = 0; i < 30; i++) expect((await chat(s.base, `${String(i).padStart(4, '0')}${SYSTEM}`, 'q')).status).toBe(200);
    expect(busy.chats()).toBe(0);
    expect(quiet.map((e) => e.chats()).every((n) => n > 0)).toBe(true);
  });

  it('counts stale, lying and absent /metrics by result, falls back to its own counts, and never fails a request', async () => {
    let mode: 'nan' | 'negative' | 'inf' | 'kv-percent' | 'missing' | 'huge' | 'hung' | 'ok' = 'nan';
    const lying = await engine(() => {
      switch (mode) {
        case 'nan':
          return vllmMetrics(Number.NaN, 1, 0.5);
        case 'negative':
          return vllmMetrics(-3, 1, 0.5);
        case 'inf':
          return vllmMetrics(Number.POSITIVE_INFINITY, 1, 0.5);
        case 'kv-percent':
          return vllmMetrics(0, 1, 95);
        case 'missing':
          return '# nothing here\nvllm:kv_cache_usage_perc 0.1\n';
        case 'huge':
          return `# ${'x'.repeat(64)}\n`.repeat(40_000); // 2.8 MB, over health.max_body_bytes (1 MiB)
        case 'hung':
          return null;
        case 'ok':
          return vllmMetrics(0, 0, 0);
      }
    });
    const honest = await engine(() => vllmMetrics(0, 0, 0.1));
    const s = await startStack({ sims: 0, extraUpstreams: [{ name: 'lying', url: lying.url }, { name: 'honest', url: honest.url }], config: FAST_SIGNALS });
    stacks.push(s);
    const scrapes = (result: string) => s.metric('waybill_upstream_engine_scrapes_total', { upstream: 'lying', result });
    for (const [next, result] of [
      ['nan', 'invalid'],
      ['negative', 'invalid'],
      ['inf', 'invalid'],
      ['kv-percent', 'invalid'],
      ['missing', 'missing'],
      ['huge', 'too_large'],
      ['hung', 'deadline'],
    ] as const) {
      mode = next;
      const before = await scrapes(result);
      await until(`a scrape counted ${result} for ${next}`, async () => (await scrapes(result)) > before);
      // Picking goes on: every request is answered while the signals are broken.
      expect((await chat(s.base, SYSTEM, next)).status).toBe(200);
    }
    // No valid signal for longer than stale_after: not up, so its own in-flight count stands in.
    await until('the lying engine’s signals to go stale', async () => (await s.metric('waybill_upstream_engine_signals_up', { upstream: 'lying' })) === 0);
    expect(await s.metric('waybill_upstream_engine_signals_up', { upstream: 'honest' })).toBe(1);
    mode = 'ok';
    await until('fresh again', async () => (await s.metric('waybill_upstream_engine_signals_up', { upstream: 'lying' })) === 1);
    expect(await s.metric('waybill_upstream_engine_signal_age_seconds', { upstream: 'lying' })).toBeLessThan(0.3);
  });

  it('with engine_signals.enabled false, never reads /metrics and says every signal is down', async () => {
    let reads = 0;
    const e = await engine(() => {
      reads++;
      return vllmMetrics(0, 0, 0);
    });
    const s = await startStack({ sims: 0, extraUpstreams: [{ name: 'e', url: e.url }], config: { engine_signals: { enabled: false } } });
    stacks.push(s);
    expect((await chat(s.base, SYSTEM, 'q')).status).toBe(200);
    expect(reads).toBe(0);
    expect(await s.metric('waybill_routing_decisions_total', { reason: 'single' })).toBe(1);
  });
});
