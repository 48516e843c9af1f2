/**
 * Background responses hold their tenant's limits until they end (src/proxy/background-holds.ts): the pure reading
 * of a polled answer, then the gateway over real sockets in front of the simulator's background mode — a
 * `max_concurrent` slot held past the `queued` acknowledgement, the usage of the final response charged by value, and
 * a hold that no answer ends released at `limits.background_max_hold`.
 */
import { createHash } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { request } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';
import { readPolled } from '../src/proxy/background-holds.js';
import { WINDOW_MS } from '../src/proxy/tenant-limits.js';
import type { Simulator } from '../src/sim/server.js';
import { startScripted } from './helpers/scripted.js';
import { endOf } from './helpers/sim-records.js';
import { post, startStack, type Stack } from './helpers/stack.js';

describe('readPolled', () => {
  it('ends on a final status with its usage, is lost on 404, and asks again on anything else', () => {
    const usage = { input_tokens: 4, output_tokens: 8 };
    for (const status of ['completed', 'incomplete', 'failed', 'cancelled']) {
      expect(readPolled(200, { object: 'response', id: 'resp_1', status, usage })).toEqual({ kind: 'ended', usedTokens: 12 });
    }
    expect(readPolled(200, { object: 'response', status: 'cancelled', usage: null })).toEqual({ kind: 'ended', usedTokens: undefined });
    expect(readPolled(200, { object: 'response', status: 'completed', usage: { input_tokens: -1, output_tokens: 1e308 } })).toEqual({ kind: 'ended', usedTokens: undefined });
    expect(readPolled(404, undefined)).toEqual({ kind: 'lost' });
    for (const [status, body] of [
      [200, { object: 'response', status: 'queued' }],
      [200, { object: 'response', status: 'in_progress' }],
      [200, { object: 'response' }],
      [200, undefined],
      [200, 'completed'],
      [503, undefined],
      [401, { error: 'Unauthorized' }],
    ] as const) {
      expect(readPolled(status, body)).toEqual({ kind: 'pending' });
    }
  });
});

const KEY = 'sk-team-a';
const AUTH = { authorization: `Bearer ${KEY}` };
const MODEL = 'sim-model';
const INPUT = 'Say hello, world';
/** ceil(16 chars / 4): the simulator's input_tokens. */
const PROMPT_TOKENS = 4;

let stack: Stack | undefined;
afterEach(async () => {
  await stack?.close();
  stack = undefined;
});

async function open(limits: Record<string, number>, background: Record<string, unknown> = {}): Promise<Stack> {
  stack = await startStack({
    sim: { responsesStore: true, ttftMs: 2, itlMs: 1, jitter: 0, outputTokens: 8, prefillMsPer1kTokens: 0 },
    config: {
      auth: { keys: [{ tenant: 'team-a', key_sha256: createHash('sha256').update(KEY).digest('hex') }] },
      tenants: { 'team-a': { limits } },
      limits: { background_poll_interval: '20ms', ...background },
      health: { interval: '1h' },
      retries: { max_attempts: 1 },
    },
  });
  return stack;
}

/**
 * Polls `read` until it returns `want`, within `boundMs` (the holds poll every 20 ms here: a hold ends within one
 * interval and a poll's round trip of its generation ending, so 5 s is a margin of over 100 intervals).
 */
async function until(read: () => Promise<number>, want: number, boundMs = 5_000): Promise<void> {
  const deadline = performance.now() + boundMs;
  for (;;) {
    const value = await read();
    if (value === want) return;
    if (performance.now() > deadline) throw new Error(`still ${value}, not ${want}, after ${boundMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

async function awayFromWindowEnd(marginMs = 10_000): Promise<void> {
  const left = WINDOW_MS - (performance.now() % WINDOW_MS);
  if (left < marginMs) await new Promise((resolve) => setTimeout(resolve, left + 10));
}

function background(s: Stack, fault: string | undefined, extra: Record<string, unknown> = {}) {
  return post(s.base, '/v1/responses', { model: MODEL, input: INPUT, background: true, ...extra }, { ...AUTH, ...(fault !== undefined && { 'x-sim-fault': fault }) });
}

describe('background responses through the gateway', () => {
  it('hold their max_concurrent slot until they end, and are charged the usage of the final response', async () => {
    const s = await open({ max_concurrent: 2, tokens_per_minute: 100_000 });
    await awayFromWindowEnd();
    // One that never ends on its own (stalled before any output), one that generates 8 tokens 60 ms apart.
    const stalled = await background(s, 'stall_after=0', { max_output_tokens: 500 });
    expect(stalled.status).toBe(200);
    const generated = endOf(s.sims[0] as Simulator, (record) => record.route === 'responses' && record.end === 'completed');
    const running = await background(s, 'itl_ms=60', { max_output_tokens: 500 });
    expect(running.status).toBe(200);
    expect(JSON.parse(running.body)).toMatchObject({ status: 'queued' });
    const reservation = PROMPT_TOKENS + 500;
    expect(Number(running.headers['x-ratelimit-remaining-tokens'])).toBe(100_000 - 2 * reservation);
    await s.settled(2);
    expect(await s.metric('waybill_background_holds')).toBe(2);

    // Both acknowledged, both still generating: a third is refused.
    const third = await background(s, undefined, { max_output_tokens: 500 });
    expect(third.status).toBe(429);
    expect(JSON.parse(third.body)).toMatchObject({ error: { code: 'rate_limited' } });
    expect((JSON.parse(third.body) as { error: { message: string } }).error.message).toMatch(/on concurrent requests: limit 2, in flight 2/);

    // The running one completes in the simulator; its hold learns it by polling and gives the slot back.
    const record = await generated;
    expect(record).toMatchObject({ responseId: (JSON.parse(running.body) as { id: string }).id, outputEventsSent: 8 });
    await until(() => s.metric('waybill_background_holds_ended_total', { how: 'ended' }), 1);
    expect(await s.metric('waybill_background_holds')).toBe(1);

    // Admitted now; and the finished one was charged its usage (4 + 8), not its reservation (4 + 500).
    const fourth = await background(s, 'stall_after=0', { max_output_tokens: 500 });
    expect(fourth.status).toBe(200);
    expect(Number(fourth.headers['x-ratelimit-remaining-tokens'])).toBe(100_000 - reservation - (PROMPT_TOKENS + 8) - reservation);
    // Two held again: the next is refused.
    expect((await background(s, undefined)).status).toBe(429);
    await s.settled(5);
    expect(await s.metric('waybill_rate_limited_total', { tenant: 'team-a', limit: 'concurrent' })).toBe(2);
    // No estimate for an acknowledgement: nothing was relayed.
    expect(await s.metric('waybill_estimated_completion_tokens_total')).toBe(0);
  });

  it('refuses a background or store flag that is not a JSON boolean (vLLM would read 1 or "true" as true), before the upstream', async () => {
    const s = await open({ max_concurrent: 1 });
    for (const [flag, value] of [['background', 1], ['background', 'true'], ['store', 'yes']] as const) {
      const refused = await post(s.base, '/v1/responses', { model: MODEL, input: INPUT, [flag]: value }, AUTH);
      expect(refused.status).toBe(400);
      expect(JSON.parse(refused.body)).toMatchObject({ error: { param: flag } });
    }
    expect(s.sims.reduce((sum, sim) => sum + (sim.stats().byRoute['responses'] ?? 0), 0)).toBe(0);
  });

  it('holds every slot of a client-chosen request_id reused while its first background response runs', async () => {
    const s = await open({ max_concurrent: 2 });
    expect((await background(s, 'stall_after=0', { request_id: 'mine-1' })).status).toBe(200);
    expect((await background(s, 'stall_after=0', { request_id: 'mine-1' })).status).toBe(200);
    await s.settled(2);
    // Both slots are held by the one id: a third request is refused.
    expect((await background(s, undefined, { request_id: 'mine-1' })).status).toBe(429);
    expect(await s.metric('waybill_background_holds')).toBe(1);
  });

  it('asks the home at once when a client reads a held response through the gateway', async () => {
    // An interval no test waits out: only the read can end the hold in time.
    const s = await open({ max_concurrent: 2, tokens_per_minute: 100_000 }, { background_poll_interval: '1h' });
    await awayFromWindowEnd();
    const generated = endOf(s.sims[0] as Simulator, (record) => record.route === 'responses' && record.end === 'completed');
    const ack = await background(s, undefined, { max_output_tokens: 500 });
    expect(ack.status).toBe(200);
    const { id } = JSON.parse(ack.body) as { id: string };
    await generated;
    await s.settled(1);
    expect(await s.metric('waybill_background_holds')).toBe(1);
    const read = await request(`${s.base}/v1/responses/${id}`, { headers: AUTH });
    expect(read.statusCode).toBe(200);
    expect(JSON.parse(await read.body.text())).toMatchObject({ id, status: 'completed' });
    await until(() => s.metric('waybill_background_holds_ended_total', { how: 'ended' }), 1);
    expect(await s.metric('waybill_background_holds')).toBe(0);
    // Charged its usage (4 + 8): the next reservation sees it.
    const next = await background(s, 'stall_after=0', { max_output_tokens: 500 });
    expect(Number(next.headers['x-ratelimit-remaining-tokens'])).toBe(100_000 - (PROMPT_TOKENS + 8) - (PROMPT_TOKENS + 500));
  });

  it('releases a slot whose response never ends at limits.background_max_hold, counted deadline', async () => {
    const s = await open({ max_concurrent: 1 }, { background_max_hold: '200ms' });
    const held = await background(s, 'stall_after=0');
    expect(held.status).toBe(200);
    expect((await background(s, undefined)).status).toBe(429);
    // The simulator answers `queued` for ever: only the deadline ends the hold.
    await until(() => s.metric('waybill_background_holds_ended_total', { how: 'deadline' }), 1);
    expect(await s.metric('waybill_background_holds')).toBe(0);
    expect((await background(s, 'stall_after=0')).status).toBe(200);
    expect(await s.metric('waybill_background_holds_ended_total', { how: 'ended' })).toBe(0);
  });

  it('polls the home with its API key, and ends the hold at once when the home lost the response (404), counted lost', async () => {
    const polls: Array<string | undefined> = [];
    let created = 0;
    const home = await startScripted((req, res) => {
      if (req.method === 'POST' && req.url === '/v1/responses') {
        created++;
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ id: `resp_lost${created}`, object: 'response', model: MODEL, status: 'queued', background: true, output: [], usage: null }));
        return;
      }
      polls.push(req.headers.authorization);
      // Queued at the first poll; then the home restarted, and its store went with it.
      res.writeHead(polls.length === 1 ? 200 : 404, { 'content-type': 'application/json' });
      res.end(polls.length === 1 ? JSON.stringify({ id: 'resp_lost1', object: 'response', status: 'queued' }) : JSON.stringify({ error: { message: 'not found', type: 'NotFoundError', code: 404 } }));
    });
    try {
      stack = await startStack({
        sims: 0,
        config: {
          pools: [{ name: 'scripted', models: [MODEL], upstreams: [{ name: 'home', url: home.url, api_key: 'upstream-key' }] }],
          auth: { keys: [{ tenant: 'team-a', key_sha256: createHash('sha256').update(KEY).digest('hex') }] },
          tenants: { 'team-a': { limits: { max_concurrent: 1 } } },
          limits: { background_poll_interval: '20ms' },
          health: { interval: '1h' },
          retries: { max_attempts: 1 },
        },
      });
      const s = stack;
      expect((await background(s, undefined)).status).toBe(200);
      await until(() => s.metric('waybill_background_holds_ended_total', { how: 'lost' }), 1);
      expect(polls).toEqual(['Bearer upstream-key', 'Bearer upstream-key']);
      expect(await s.metric('waybill_background_holds')).toBe(0);
      expect((await background(s, undefined)).status).toBe(200);
    } finally {
      await stack?.close();
      stack = undefined;
      await home.close();
    }
  });

  it('reads a poll like every own read: a body over health.max_body_bytes is a failed poll, counted, that never frees the slot early', async () => {
    let polls = 0;
    let written = 0;
    const home = await startScripted((req, res) => {
      if (req.method === 'POST' && req.url === '/v1/responses') {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ id: 'resp_huge1', object: 'response', model: MODEL, status: 'queued', background: true, output: [], usage: null }));
        return;
      }
      polls++;
      // A response object of 64 MiB, written as the socket takes it: the gateway must stop reading at its limit.
      res.writeHead(200, { 'content-type': 'application/json' });
      const piece = Buffer.alloc(64 * 1024, 0x20);
      const write = (): void => {
        while (written < 64 * 1024 * 1024) {
          written += piece.length;
          if (!res.write(piece)) {
            res.once('drain', write);
            return;
          }
        }
        res.end();
      };
      res.on('error', () => undefined);
      write();
    });
    try {
      stack = await startStack({
        sims: 0,
        config: {
          pools: [{ name: 'scripted', models: [MODEL], upstreams: [{ name: 'home', url: home.url }] }],
          auth: { keys: [{ tenant: 'team-a', key_sha256: createHash('sha256').update(KEY).digest('hex') }] },
          tenants: { 'team-a': { limits: { max_concurrent: 1 } } },
          // The poll's deadline is long, so only the size limit can end it; the hold's own deadline longer still.
          limits: { background_poll_interval: '20ms', background_max_hold: '1500ms' },
          responses: { lookup_timeout: '30s' },
          health: { interval: '1h', max_body_bytes: 65536 },
          retries: { max_attempts: 1 },
        },
      });
      const s = stack;
      expect((await background(s, undefined)).status).toBe(200);
      // The first poll is stopped at the limit and counted; the slot stays held (the body may be the tenant's doing).
      await until(() => s.metric('waybill_upstream_reads_stopped_total', { upstream: 'home', read: 'background', reason: 'too_large' }).then((n) => Math.min(n, 1)), 1);
      expect(written, 'bytes the home wrote before the gateway closed the socket').toBeLessThan(32 * 1024 * 1024);
      expect(await s.metric('waybill_background_holds')).toBe(1);
      expect((await background(s, undefined)).status).toBe(429);
      // It ends at its deadline (1.5 s; bound 5 s), never as lost or ended.
      await until(() => s.metric('waybill_background_holds_ended_total', { how: 'deadline' }), 1);
      expect(await s.metric('waybill_background_holds_ended_total', { how: 'lost' })).toBe(0);
      expect(polls).toBeGreaterThanOrEqual(1);
      expect((await background(s, undefined)).status).toBe(200);
    } finally {
      await stack?.close();
      stack = undefined;
      await home.close();
    }
  });

  it('settles at once what it cannot hold: one past background_max_watched, a background stream read to its end', async () => {
    const t = await open({ max_concurrent: 3 }, { background_max_watched: 1 });
    expect((await background(t, 'stall_after=0')).status).toBe(200);
    expect((await background(t, 'stall_after=0')).status).toBe(200);
    await t.settled(2);
    expect(await t.metric('waybill_background_holds')).toBe(1);
    expect(await t.metric('waybill_background_holds_ended_total', { how: 'overflow' })).toBe(1);
    // A background stream read to its end carries its usage: settled then, nothing held.
    const streamed = await post(t.base, '/v1/responses', { model: MODEL, input: INPUT, background: true, stream: true }, AUTH);
    expect(streamed.status).toBe(200);
    await t.settled(3);
    expect(await t.metric('waybill_background_holds')).toBe(1);
  });
});
