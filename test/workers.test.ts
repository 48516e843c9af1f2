/**
 * `waybill serve --workers N` (src/http/workers.ts, src/config/workers.ts): the built CLI with two worker processes
 * in front of in-process simulators, over real sockets.
 *
 * - one /metrics for all workers, exact: `waybill load --reconcile` against it finds zero mismatches, and both
 *   workers served a share of the requests (their request log lines say which);
 * - the tenants' limits are counted once for all workers (in the primary): exactly the limit is admitted;
 * - SIGHUP reloads every worker; a worker that dies is replaced; SIGTERM drains every worker, a stream in flight
 *   included, and the primary exits 0;
 * and the pure parts: how many workers `auto` means (affinity, cgroup quota), and each worker's share of a limit.
 */
import { createHash } from 'node:crypto';
import { rmSync } from 'node:fs';
import { Agent, request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseLoadArgs, runLoadWith } from '../load/main.js';
import { parseConfig } from '../src/config/load.js';
import type { ConfigInput } from '../src/config/schema.js';
import { cgroupCpus, forWorker, oversplitLimits, shareOf, workerCount } from '../src/config/workers.js';
import { LimitHost } from '../src/proxy/cluster-limit-store.js';
import type { Decision } from '../src/proxy/tenant-limits.js';
import { createSimulator, type Simulator } from '../src/sim/server.js';
import { prefixBlocks } from '../src/routing/prefix-key.js';
import { choiceText } from '../src/sim/wire.js';
import { serveRaw, type Served } from './helpers/served.js';
import { adminKey, untilContentEvents } from './helpers/stack.js';

const KEY = 'sk-team-a';
const FREE_KEY = 'sk-free';
const sha256 = (text: string) => createHash('sha256').update(text).digest('hex');

async function serve(config: ConfigInput, workers = 2): Promise<Served> {
  const served = serveRaw(config, workers);
  const [listening] = await served.until('waybill listening', (line) => line.msg === 'waybill listening');
  served.base = listening?.url ?? '';
  return served;
}

function baseConfig(sims: readonly string[], extra: Partial<ConfigInput> = {}): ConfigInput {
  return {
    server: { host: '127.0.0.1', port: 0 },
    pools: [{ name: 'sim', models: ['sim-model'], upstreams: sims.map((url, i) => ({ name: `sim-${i}`, url })) }],
    timeouts: { first_output: '4s', idle: '1s', total: '6s' },
    retries: { backoff_base: '5ms', backoff_max: '20ms' },
    health: { interval: '1h' },
    slo: { ttft: '2s', tpot: '100ms', e2e: '60s' },
    shutdown: { grace: '0s', drain_timeout: '10s' },
    ...extra,
  };
}

/** A fresh connection per request, so the primary's round robin spreads them over the workers. */
async function chat(base: string, body: Record<string, unknown>, headers: Record<string, string> = {}): Promise<{ status: number; text: string }> {
  const dispatcher = new Agent({ pipelining: 0 });
  try {
    const response = await request(`${base}/v1/chat/completions`, { method: 'POST', dispatcher, headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
    return { status: response.statusCode, text: await response.body.text() };
  } finally {
    await dispatcher.close();
  }
}

/** Until a request is in flight in some worker (aggregated gauge); polled, bounded: there is no event to await. */
async function untilInflight(served: Served): Promise<void> {
  const deadline = performance.now() + 5_000;
  while ((await served.metric('waybill_inflight_requests')) < 1) {
    if (performance.now() > deadline) throw new Error('no request in flight after 5 s');
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

const CHAT = { model: 'sim-model', messages: [{ role: 'user', content: 'hi' }], max_tokens: 8 };

describe('how many workers, and their shares', () => {
  it('reads auto as the CPU affinity, capped by the cgroup v2 quota rounded up', () => {
    expect(cgroupCpus('max 100000\n')).toBeUndefined();
    expect(cgroupCpus('150000 100000\n')).toBe(2);
    expect(cgroupCpus('50000 100000')).toBe(1);
    expect(cgroupCpus('garbage')).toBeUndefined();
    expect(cgroupCpus(undefined)).toBeUndefined();
    expect(workerCount('auto', { availableParallelism: 64, cgroupCpuMax: '200000 100000' })).toBe(2);
    expect(workerCount('auto', { availableParallelism: 2, cgroupCpuMax: 'max 100000' })).toBe(2);
    expect(workerCount('auto', { availableParallelism: 4 })).toBe(4);
    expect(workerCount(3, { availableParallelism: 64, cgroupCpuMax: '100000 100000' })).toBe(3);
  });

  it('splits a per-process limit so the workers add up to it, each keeping at least 1', () => {
    for (const [total, count] of [
      [64, 2],
      [7, 3],
      [100, 7],
      [5, 5],
    ] as const) {
      const shares = Array.from({ length: count }, (_, i) => shareOf(total, i, count));
      expect(shares.reduce((a, b) => a + b, 0), `${total} over ${count}`).toBe(total);
      expect(Math.max(...shares) - Math.min(...shares)).toBeLessThanOrEqual(1);
    }
    expect([0, 1, 2].map((i) => shareOf(2, i, 3))).toEqual([1, 1, 1]);
    const config = parseConfig(
      {
        pools: [{ name: 'p', models: ['m'], upstreams: [{ url: 'http://10.0.0.1:8000', max_inflight: 9 }], admission: { max_inflight: 5, max_queue: 0 } }],
      },
      'test',
    );
    const [first, second] = [forWorker(config, 0, 2), forWorker(config, 1, 2)];
    expect([first.pools[0]?.admission?.maxInflight, second.pools[0]?.admission?.maxInflight]).toEqual([3, 2]);
    expect([first.pools[0]?.admission?.maxQueue, second.pools[0]?.admission?.maxQueue]).toEqual([0, 0]);
    expect([first.pools[0]?.upstreams[0]?.maxInflight, second.pools[0]?.upstreams[0]?.maxInflight]).toEqual([5, 4]);
    expect(forWorker(config, 0, 1)).toBe(config);
    expect(oversplitLimits(config, 6)).toEqual(['pools.p.admission.max_inflight (5)']);
  });
});

describe("the primary's count of the tenants' limits", () => {
  const limits = { tokensPerMinute: 1000, maxConcurrent: 2 };
  const admitted = (decision: Decision | undefined) => {
    if (decision === undefined || !decision.admitted) throw new Error('expected an admission');
    return decision;
  };

  it("gives back a dead worker's slots, and what a reserve its worker gave up on took", () => {
    const host = new LimitHost(() => 1_000);
    const a = admitted(host.answer({ op: 'reserve', tenant: 't', limits, tokens: 100 }, 0, 1));
    admitted(host.answer({ op: 'reserve', tenant: 't', limits, tokens: 100 }, 1, 1));
    expect(host.answer({ op: 'reserve', tenant: 't', limits, tokens: 100 }, 1, 2)).toMatchObject({ admitted: false, exceeded: ['concurrent'] });
    // Worker 1 dies: its slot comes back (its tokens stay counted: the request may have run).
    expect(host.workerGone(1)).toBe(1);
    const c = admitted(host.answer({ op: 'reserve', tenant: 't', limits, tokens: 100 }, 1, 7));
    expect(c.after).toMatchObject({ inflight: 2, tokens: 300 });
    // Worker 1 gave up waiting for call 7: its tokens and its slot come back; a release after that changes nothing.
    host.cancel(1, 7);
    host.answer({ op: 'release', reservation: c.reservation }, 1, 8);
    const d = admitted(host.answer({ op: 'reserve', tenant: 't', limits, tokens: 0 }, 0, 2));
    expect(d.after).toMatchObject({ inflight: 2, tokens: 200 });
    // Released once, however often it is asked.
    host.answer({ op: 'release', reservation: a.reservation }, 0, 3);
    host.answer({ op: 'release', reservation: a.reservation }, 0, 4);
    expect(admitted(host.answer({ op: 'reserve', tenant: 't', limits, tokens: 0 }, 0, 5)).after).toMatchObject({ inflight: 2 });
  });
});

describe('waybill serve --workers 2', () => {
  const sims: Simulator[] = [];
  const simUrls: string[] = [];

  beforeAll(async () => {
    for (let i = 0; i < 2; i++) {
      const sim = createSimulator({ ttftMs: 10, itlMs: 2, outputTokens: 32, jitter: 0.2, seed: i + 1, cachedTokens: 16, promptTokensDetails: true });
      simUrls.push((await sim.listen(0, '127.0.0.1')).url);
      sims.push(sim);
    }
  });

  afterAll(async () => {
    await Promise.all(sims.map((sim) => sim.close()));
  });

  it('serves one /metrics for both workers that reconciles exactly with what clients saw', async () => {
    const served = await serve(baseConfig(simUrls));
    try {
      const args = [
        '--url', served.base,
        '--model', 'sim-model',
        '--concurrency', '32',
        '--requests', '800',
        '--seed', '11',
        '--warmup', '64',
        '--prompt-tokens', '16-500',
        '--output-tokens', '8-32',
        '--stream-share', '0.85',
        '--cancel-share', '0.05',
        '--fault-share', '0.2',
        '--slo-ttft', '2s', '--slo-tpot', '100ms', '--slo-e2e', '60s',
        '--reconcile',
        '--borderline-margin', '50ms',
        '--quiet',
        ...simUrls.flatMap((url) => ['--sim', url]),
      ];
      const config = await parseLoadArgs(args);
      if ('problems' in config) throw new Error(config.problems.join('\n'));
      const lines: string[] = [];
      const outcome = await runLoadWith(config, (text) => lines.push(text));
      const report = lines.join('\n');
      expect(report).toContain('reconciliation: 0 mismatches');
      expect(outcome.mismatches, report).toBe(0);
      // Both workers took a share of the requests (warm-up included): each request's line says which worker. The
      // request lines may wait up to 50 ms for others to join their write (log-destination.ts): awaited.
      const requests = await served.until('864 request lines', (line) => line.msg === 'request', 864);
      const byWorker = [0, 1].map((worker) => requests.filter((line) => line.worker === worker).length);
      expect(byWorker[0]! + byWorker[1]!).toBe(864);
      expect(Math.min(...byWorker), `requests per worker: ${byWorker.join(', ')}`).toBeGreaterThan(100);
      // The aggregated /metrics counts each of them once.
      expect(await served.metric('waybill_requests_total')).toBe(864);
    } finally {
      expect(await served.stop()).toBe(0);
    }
  }, 180_000);

  it('sends one prefix to one engine from both workers, which learn each other’s picks through the primary (cache_aware)', async () => {
    const own = await Promise.all([0, 1, 2].map(async () => {
      const sim = createSimulator({ ttftMs: 1, itlMs: 1, outputTokens: 2, jitter: 0 });
      return { sim, url: (await sim.listen(0, '127.0.0.1')).url };
    }));
    const served = await serve(baseConfig(own.map((o) => o.url), { engine_signals: { enabled: false } }));
    try {
      const system = 'You are the routing test. '.repeat(20);
      const ask = async (i: number) => {
        const answer = await chat(served.base, { model: 'sim-model', max_tokens: 2, messages: [{ role: 'system', content: system }, { role: 'user', content: `question ${i}` }] });
        expect(answer.status).toBe(200);
      };
      await ask(0);
      // The worker that served it recorded the prompt's blocks at its pick; the other learns them through the
      // primary. Awaited, not raced: the summed index entries reach twice one worker's (each holds its own copy).
      const blocks = prefixBlocks('chat_completions', { messages: [{ role: 'system', content: system }, { role: 'user', content: 'question 0' }] }, { blockChars: 64, blockTokens: 16, maxBlocks: 256 }).blocks.length;
      expect(blocks).toBeGreaterThan(0);
      const deadline = Date.now() + 10_000;
      while ((await served.metric('waybill_routing_index_entries', { pool: 'sim' })) !== 2 * blocks) {
        if (Date.now() > deadline) throw new Error(`the other worker never learned the first pick (index entries ${await served.metric('waybill_routing_index_entries', { pool: 'sim' })}, one copy ${blocks})`);
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      for (let i = 1; i < 16; i++) await ask(i);
      // Both workers served (a fresh connection per request: the primary's round robin)… (their request lines awaited:
      // they may wait up to 50 ms for others to join their write)
      const requests = await served.until('16 request lines', (line) => line.msg === 'request', 16);
      expect(new Set(requests.map((line) => line.worker)).size).toBe(2);
      // …every request went to one engine (a new prefix is placed by rendezvous of its first block, the same choice
      // in every worker)…
      const counts = own.map((o) => o.sim.stats().requests);
      expect(counts.filter((n) => n === 16)).toHaveLength(1);
      // …and only the very first was a placement: the other worker's first request already found the prefix in its
      // index, told by the primary. (Without the sharing each worker places it once: 14 prefix decisions.)
      const placements = requests.filter((line) => (line.routing as { reason?: string } | undefined)?.reason === 'load');
      expect(placements.map((line) => line.request_id)).toHaveLength(1);
      expect(await served.metric('waybill_routing_decisions_total', { reason: 'prefix' })).toBe(15);
    } finally {
      expect(await served.stop()).toBe(0);
      await Promise.all(own.map((o) => o.sim.close()));
    }
  }, 60_000);

  it('counts a tenant limit once for both workers, reloads both on SIGHUP, replaces a worker that dies, and drains both', async () => {
    const config = baseConfig(simUrls, {
      auth: {
        keys: [
          { tenant: 'team-a', key_sha256: sha256(KEY) },
          { tenant: 'free', key_sha256: sha256(FREE_KEY) },
          adminKey('team-a'),
        ],
      },
      tenants: { 'team-a': { limits: { requests_per_minute: 10 } } },
      logging: { requests: false },
    });
    const served = await serve(config);
    try {
      // 30 requests over fresh connections, spread over both workers: exactly 10 admitted in the window. (Should a
      // window boundary fall inside the burst, more pass; the burst takes well under a second of the 60 s window.)
      const statuses = [];
      for (let i = 0; i < 30; i++) statuses.push((await chat(served.base, CHAT, { authorization: `Bearer ${KEY}` })).status);
      expect(statuses.filter((s) => s === 200)).toHaveLength(10);
      expect(statuses.filter((s) => s === 429)).toHaveLength(20);
      expect(await served.metric('waybill_rate_limited_total', { tenant: 'team-a', limit: 'requests' })).toBe(20);
      expect(await served.metric('waybill_requests_total', { tenant: 'team-a' })).toBe(30);

      // SIGHUP to the primary: each worker re-reads the file.
      served.child.kill('SIGHUP');
      await served.until('both workers to reload', (line) => typeof line.msg === 'string' && line.msg.startsWith('configuration reloaded'), 2);
      expect(served.lines.filter((line) => typeof line.msg === 'string' && line.msg.startsWith('configuration reloaded')).map((line) => line.worker).sort()).toEqual([0, 1]);
      expect(await served.metric('waybill_config_reloads_total', { result: 'ok' })).toBe(2);

      // A worker dies: another takes its place, and requests go on being served. Its counts stay in /metrics as last
      // collected (the scrapes above): a counter never goes backwards.
      const pids = served.lines.filter((line) => line.msg === 'worker listening').map((line) => line.pid as number);
      process.kill(pids[0]!, 'SIGKILL');
      await served.until('the dead worker to be replaced', (line) => line.msg === 'worker listening', 3);
      expect(served.lines.filter((line) => line.msg === 'worker died; starting another')).toHaveLength(1);
      expect(await served.metric('waybill_requests_total', { tenant: 'team-a' })).toBe(30);
      expect(await served.metric('waybill_rate_limited_total', { tenant: 'team-a', limit: 'requests' })).toBe(20);
      // The count outlives the worker (it lives in the primary): team-a is still over its limit; others are served.
      expect((await chat(served.base, { ...CHAT, stream: true }, { authorization: `Bearer ${KEY}` })).status).toBe(429);
      expect((await chat(served.base, { ...CHAT, stream: true }, { authorization: `Bearer ${FREE_KEY}` })).status).toBe(200);

      // SIGTERM with a slow stream in flight: it completes; the primary exits 0 once both workers drained.
      const slow = chat(served.base, { ...CHAT, stream: true, max_tokens: 32 }, { authorization: `Bearer ${FREE_KEY}`, 'x-sim-fault': 'itl_ms=40' });
      await untilInflight(served);
      served.child.kill('SIGTERM');
      const answer = await slow;
      expect(answer.status).toBe(200);
      expect(answer.text.trimEnd().endsWith('data: [DONE]')).toBe(true);
      expect(await served.exited).toBe(0);
      expect(served.lines.filter((line) => line.msg === 'drained')).toHaveLength(2);
    } finally {
      await served.stop();
    }
  }, 120_000);

  it("charges a stream whose client left before the usage chunk what it relayed, in the primary's count", async () => {
    const config = baseConfig(simUrls, {
      auth: { keys: [{ tenant: 'team-a', key_sha256: sha256(KEY) }, adminKey('team-a')] },
      tenants: { 'team-a': { limits: { tokens_per_minute: 20_000 } } },
      logging: { requests: false },
    });
    // The primary counts windows on its own monotonic clock, which starts near 0 with it: this test runs in its first
    // minute, so every count below is in one window.
    const served = await serve(config);
    try {
      const body = { model: 'sim-model', messages: [{ role: 'user', content: 'Hello there' }], stream: true };
      const dispatcher = new Agent({ pipelining: 0 });
      const controller = new AbortController();
      // No max_tokens: 1024 reserved; 58 events of 50 tokens relayed, then the simulator stalls before its usage.
      const cut = await request(`${served.base}/v1/chat/completions`, {
        method: 'POST',
        dispatcher,
        headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}`, 'x-sim-fault': 'tokens=3000;tokens_per_event=50;stall_after=58' },
        body: JSON.stringify(body),
        signal: controller.signal,
      });
      expect(cut.statusCode).toBe(200);
      const prompt = 20_000 - Number(cut.headers['x-ratelimit-remaining-tokens']) - 1024;
      await untilContentEvents(cut.body, 58);
      controller.abort();
      await dispatcher.close().catch(() => undefined);
      const estimate = Math.ceil(choiceText(0, 0, 2900).length / 4);
      // Polled, bounded (5 s): the settlement is published in a worker, seen through the aggregated scrape. The worker
      // sent its settle to the primary before it answered that scrape, on the same channel: the count has it.
      const deadline = performance.now() + 5_000;
      while ((await served.metric('waybill_estimated_completion_tokens_total', { tenant: 'team-a' })) !== estimate) {
        if (performance.now() > deadline) throw new Error('the cut stream was not settled within 5 s');
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      const next = await request(`${served.base}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
        body: JSON.stringify({ ...body, stream: false, max_tokens: 100 }),
      });
      await next.body.text();
      expect(Number(next.headers['x-ratelimit-remaining-tokens'])).toBe(20_000 - (prompt + estimate) - (prompt + 100));
    } finally {
      await served.stop();
    }
  }, 60_000);

  it("counts the requests in flight on a SIGKILLed worker, so the ledger adds up to what the clients saw", async () => {
    const served = await serve(baseConfig(simUrls, { logging: { requests: false } }));
    try {
      // Six slow streams over fresh connections: the round robin gives each worker some.
      const streams = await Promise.all(
        Array.from({ length: 6 }, async () => {
          const dispatcher = new Agent({ pipelining: 0 });
          const response = await request(`${served.base}/v1/chat/completions`, {
            method: 'POST',
            dispatcher,
            headers: { 'content-type': 'application/json', 'x-sim-fault': 'itl_ms=100' },
            body: JSON.stringify({ ...CHAT, stream: true, max_tokens: 32 }),
          });
          expect(response.statusCode).toBe(200);
          const text = response.body.text().then(
            (body) => ({ cut: false, body }),
            () => ({ cut: true, body: '' }),
          );
          return { text, dispatcher };
        }),
      );
      // All six in flight (the aggregated gauge), and this scrape is each worker's last collection before the kill.
      const deadline = performance.now() + 5_000;
      while ((await served.metric('waybill_inflight_requests')) < 6) {
        if (performance.now() > deadline) throw new Error('six streams not in flight after 5 s');
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      const pids = served.lines.filter((line) => line.msg === 'worker listening').map((line) => line.pid as number);
      process.kill(pids[0]!, 'SIGKILL');
      await served.until('the dead worker to be replaced', (line) => line.msg === 'worker listening', 3);
      const results = await Promise.all(streams.map(async ({ text }) => text));
      await Promise.all(streams.map(({ dispatcher }) => dispatcher.close()));
      const cut = results.filter((r) => r.cut).length;
      const completed = results.filter((r) => !r.cut && r.body.trimEnd().endsWith('data: [DONE]')).length;
      expect(cut, 'streams the dead worker held').toBeGreaterThan(0);
      expect(cut + completed).toBe(6);
      // The survivors settle as their clients read the end: the sum reaches 6 (polled, bounded: 5 s).
      const settled = performance.now() + 5_000;
      while ((await served.metric('waybill_requests_total')) < 6) {
        if (performance.now() > settled) break;
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      // Every request the clients sent is in the ledger once: the cut ones as lost, incomplete after their 200.
      expect(await served.metric('waybill_requests_total')).toBe(6);
      expect(await served.metric('waybill_worker_lost_requests_total')).toBe(cut);
      expect(await served.metric('waybill_requests_total', { route: 'chat_completions', stream: 'true', code: '200', outcome: 'incomplete', tenant: '_anonymous', model: 'sim-model' })).toBe(cut);
      expect(await served.metric('waybill_requests_total', { outcome: 'delivered' })).toBe(completed);
      expect(await served.metric('waybill_inflight_requests')).toBe(0);
      expect(served.lines.filter((line) => line.msg?.startsWith('a worker died with requests in flight') === true).map((line) => line.requests)).toEqual([cut]);
    } finally {
      expect(await served.stop()).toBe(0);
    }
  }, 60_000);

  it('drains a worker told to stop before it listened, and workers whose primary died', async () => {
    // SIGTERM as soon as the first worker listens: the other may still be starting, and must drain all the same.
    const early = serveRaw(baseConfig(simUrls));
    await early.until('a worker to listen', (line) => line.msg === 'worker listening');
    early.child.kill('SIGTERM');
    expect(await early.exited).toBe(0);
    expect(early.lines.filter((line) => line.msg === 'drained')).toHaveLength(2);
    rmSync(early.dir, { recursive: true, force: true });

    // The primary is killed outright with a stream in flight: its workers drain (the stream completes), then exit.
    const served = await serve(baseConfig(simUrls));
    try {
      const workerPids = served.lines.filter((line) => line.msg === 'worker listening').map((line) => line.pid as number);
      const slow = chat(served.base, { ...CHAT, stream: true, max_tokens: 32 }, { 'x-sim-fault': 'itl_ms=40' });
      await untilInflight(served);
      served.child.kill('SIGKILL');
      const answer = await slow;
      expect(answer.status).toBe(200);
      expect(answer.text.trimEnd().endsWith('data: [DONE]')).toBe(true);
      await served.until('both orphaned workers to drain', (line) => line.msg === 'drained', 2);
      for (const pid of workerPids) await untilGone(pid);
    } finally {
      await served.stop();
    }
  }, 60_000);
});

/** Until a process no longer exists (polled, bounded: an orphan's exit sends no event to us). */
async function untilGone(pid: number): Promise<void> {
  const deadline = performance.now() + 10_000;
  for (;;) {
    try {
      process.kill(pid, 0);
    } catch {
      return;
    }
    if (performance.now() > deadline) throw new Error(`process ${pid} still running after 10 s`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

describe('waybill serve --workers 2: stored responses under client-chosen ids', () => {
  it("finds a client-chosen id's owner on whichever worker a read lands, and still refuses another tenant", async () => {
    const sim = createSimulator({ responsesStore: true, ttftMs: 1, itlMs: 1, jitter: 0, outputTokens: 4 });
    const { url } = await sim.listen(0, '127.0.0.1');
    const OTHER = 'sk-team-b';
    const served = await serve(
      baseConfig([url], {
        auth: { keys: [{ tenant: 'team-a', key_sha256: sha256(KEY) }, { tenant: 'team-b', key_sha256: sha256(OTHER) }, adminKey('team-a')] },
      }),
    );
    /** A fresh connection per request, so the primary's round robin spreads them over both workers. */
    const call = async (method: 'GET' | 'POST', path: string, key: string, body?: unknown): Promise<number> => {
      const dispatcher = new Agent({ pipelining: 0 });
      try {
        const response = await request(`${served.base}${path}`, {
          method,
          dispatcher,
          headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
          ...(body === undefined ? {} : { body: JSON.stringify(body) }),
        });
        await response.body.text();
        return response.statusCode;
      } finally {
        await dispatcher.close();
      }
    };
    try {
      const ids = ['team-a-report-1', 'team-a-report-2'];
      for (const id of ids) expect(await call('POST', '/v1/responses', KEY, { model: 'sim-model', input: 'hello', request_id: id })).toBe(200);
      // Eight reads of each on fresh connections: without the owners shared, about half land on the worker that did
      // not relay the answer, which knows no owner and answers 404 (keys are configured).
      const reads: number[] = [];
      for (const id of ids) for (let i = 0; i < 8; i++) reads.push(await call('GET', `/v1/responses/${id}`, KEY));
      expect(reads).toEqual(Array(16).fill(200));
      // (Their request lines awaited: they may wait up to 50 ms for others to join their write.)
      const retrieved = await served.until('16 retrieve lines', (line) => line.msg === 'request' && line.route === 'responses_retrieve', 16);
      const workersThatRead = new Set(retrieved.map((line) => line.worker));
      expect(workersThatRead.size, 'the reads reached both workers').toBe(2);
      // Another tenant is refused on every worker, as an unknown id.
      const foreign: number[] = [];
      for (let i = 0; i < 4; i++) foreign.push(await call('GET', `/v1/responses/${ids[0]}`, OTHER));
      expect(foreign).toEqual([404, 404, 404, 404]);
    } finally {
      expect(await served.stop()).toBe(0);
      await sim.close();
    }
  }, 60_000);
});
