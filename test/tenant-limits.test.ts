/**
 * Limits per tenant (src/proxy/tenant-limits.ts): the pure rule and the in-process store under an injected clock,
 * then the gateway over real sockets in front of the simulator — 429s with Retry-After and the x-ratelimit headers,
 * the 200s' headers, token reservations corrected by usage, and a slot freed by a client that cancels a held stream.
 */
import { createHash } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { request } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.js';
import {
  decide,
  formatReset,
  InProcessLimitStore,
  rateLimitHeaders,
  reservedTokens,
  TenantLimiter,
  usedTokens,
  WINDOW_MS,
  type Admission,
  type LimitName,
  type LimitStore,
  type LimitTicket,
  type TenantLimits,
} from '../src/proxy/tenant-limits.js';
import { choiceText } from '../src/sim/wire.js';
import { CHAT, post, type Stack, startStack, untilContentEvents } from './helpers/stack.js';

/** A clock the test moves. */
function clock(start = 0) {
  let t = start;
  return { now: () => t, set: (ms: number) => (t = ms), advance: (ms: number) => (t += ms) };
}

function limiterWith(limits: TenantLimits, start = 0, store: LimitStore = new InProcessLimitStore()) {
  const time = clock(start);
  /** Every refusal's limit, as the routes count it. */
  const refused: Array<[string, LimitName]> = [];
  const errors: unknown[] = [];
  const limiter = new TenantLimiter({ tenants: { t: limits, free: undefined } }, { store, now: time.now, onError: (error) => errors.push(error) });
  const admit = (tokens = 0): Admission => {
    const admission = limiter.admit('t', tokens);
    if (admission === undefined || admission instanceof Promise) throw new Error('expected a synchronous admission');
    if (!admission.admitted && 'limit' in admission) refused.push(['t', admission.limit]);
    return admission;
  };
  const ticket = (tokens = 0): LimitTicket => {
    const admission = admit(tokens);
    if (!admission.admitted) throw new Error(`refused: ${admission.message}`);
    return admission.ticket;
  };
  return { limiter, time, refused, errors, admit, ticket, store };
}

describe('the limiter, with an injected clock', () => {
  it('admits requests_per_minute per fixed window, then refuses until the window ends', () => {
    const { admit, time, refused } = limiterWith({ requestsPerMinute: 2 }, 10 * WINDOW_MS + 15_000);
    const first = admit();
    expect(first.admitted).toBe(true);
    expect(first.admitted && first.ticket.headers).toEqual({
      'x-ratelimit-limit-requests': '2',
      'x-ratelimit-remaining-requests': '1',
      'x-ratelimit-reset-requests': '45s',
    });
    time.advance(500);
    expect(admit().admitted).toBe(true);
    time.advance(4_000);
    const third = admit();
    expect(third).toMatchObject({
      admitted: false,
      limit: 'requests',
      retryAfter: 41, // 40.5 s left in the window, rounded up
      headers: { 'x-ratelimit-limit-requests': '2', 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '40.5s' },
    });
    expect(!third.admitted && third.message).toBe('Rate limit reached for tenant `t` on requests per minute: limit 2, used 2, requested 1. Please try again in 41s.');
    expect(refused).toEqual([['t', 'requests']]);
    // A refusal is not counted against the window: the next window starts from zero.
    time.set(11 * WINDOW_MS);
    const next = admit();
    expect(next.admitted && next.ticket.headers['x-ratelimit-remaining-requests']).toBe('1');
    expect(next.admitted && next.ticket.headers['x-ratelimit-reset-requests']).toBe('1m0s');
  });

  it('reserves tokens at admission and corrects them to the real use at settlement', () => {
    const { admit, ticket, time, store } = limiterWith({ tokensPerMinute: 250 }, 0);
    const a = ticket(100);
    expect(a.headers).toMatchObject({ 'x-ratelimit-limit-tokens': '250', 'x-ratelimit-remaining-tokens': '150' });
    const b = ticket(100);
    expect(b.headers['x-ratelimit-remaining-tokens']).toBe('50');
    time.set(20_000);
    expect(admit(100)).toMatchObject({ admitted: false, limit: 'tokens', retryAfter: 40 });
    // a used 20 of its 100: 80 come back.
    a.settle(20);
    expect((store as InProcessLimitStore).counts('t', time.now()).tokens).toBe(120);
    const c = ticket(100);
    expect(c.headers['x-ratelimit-remaining-tokens']).toBe('30');
    // b reported no usage (a failure before any): its reservation stands.
    b.settle(undefined);
    expect((store as InProcessLimitStore).counts('t', time.now()).tokens).toBe(220);
    // c used more than it reserved: charged in full.
    c.settle(130);
    expect((store as InProcessLimitStore).counts('t', time.now()).tokens).toBe(250);
    // Settling twice changes nothing.
    c.settle(0);
    expect((store as InProcessLimitStore).counts('t', time.now()).tokens).toBe(250);
  });

  it('charges a request that settles after its window only for what it used beyond its reservation', () => {
    const { ticket, time, store } = limiterWith({ tokensPerMinute: 1000 }, 50_000);
    const under = ticket(100);
    const over = ticket(100);
    time.set(WINDOW_MS + 1_000);
    under.settle(10); // its window is gone, and the reservation with it: nothing to give back
    over.settle(160); // 60 beyond the reservation, spent now
    expect((store as InProcessLimitStore).counts('t', time.now())).toMatchObject({ window: 1, requests: 0, tokens: 60 });
  });

  it('refuses a request larger than the whole tokens_per_minute without a Retry-After', () => {
    const { admit } = limiterWith({ tokensPerMinute: 250 });
    const refused = admit(251);
    expect(refused).toMatchObject({ admitted: false, limit: 'tokens', retryAfter: undefined });
    expect(!refused.admitted && refused.message).toMatch(/^Request too large for tenant `t` on tokens per minute: limit 250, requested 251/);
  });

  it('holds a max_concurrent slot until the request settles, and frees it exactly once', () => {
    const { admit, ticket, refused } = limiterWith({ maxConcurrent: 1 });
    const first = ticket();
    expect(first.headers).toEqual({}); // no OpenAI header for requests in flight
    expect(admit()).toMatchObject({ admitted: false, limit: 'concurrent', retryAfter: 1 });
    first.settle(undefined);
    const second = ticket();
    first.settle(undefined); // a second settlement of the first must not free the second's slot
    expect(admit()).toMatchObject({ admitted: false, limit: 'concurrent' });
    second.settle(5);
    expect(admit().admitted).toBe(true);
    expect(refused).toEqual([
      ['t', 'concurrent'],
      ['t', 'concurrent'],
    ]);
  });

  it('names the first limit passed, and waits for the longest of them', () => {
    const counts = { window: 0, requests: 5, tokens: 90, inflight: 2 };
    const decision = decide('t', { requestsPerMinute: 5, tokensPerMinute: 100, maxConcurrent: 2 }, counts, 20, 59_500);
    expect(decision).toMatchObject({ admitted: false, exceeded: ['requests', 'tokens', 'concurrent'], retryAfterMs: 1000 });
    expect(decide('t', { requestsPerMinute: 6, maxConcurrent: 2 }, counts, 20, 1_000)).toMatchObject({ exceeded: ['concurrent'], retryAfterMs: 1000 });
    expect(decide('t', { tokensPerMinute: 100, maxConcurrent: 2 }, counts, 200, 1_000)).toMatchObject({ exceeded: ['tokens', 'concurrent'], retryAfterMs: undefined });
  });

  it('does not limit a tenant without limits', () => {
    const { limiter } = limiterWith({ requestsPerMinute: 1 });
    expect(limiter.admit('free', 10)).toBeUndefined();
    expect(limiter.admit('other', 10)).toBeUndefined();
    expect(limiter.limited()).toEqual([{ tenant: 't', limits: ['requests'] }]);
  });

  it('works with a store that answers with promises, and admits when the store fails', async () => {
    const inner = new InProcessLimitStore();
    const settled: Array<number | undefined> = [];
    const asyncStore: LimitStore = {
      reserve: (...args) => Promise.resolve(inner.reserve(...args)),
      settle: (reservation, used, now) => {
        settled.push(used);
        return Promise.resolve(inner.settle(reservation, used, now));
      },
      release: (reservation) => Promise.resolve(inner.release(reservation)),
    };
    const { limiter } = limiterWith({ maxConcurrent: 1 }, 0, asyncStore);
    const first = await limiter.admit('t', 0);
    expect(first?.admitted).toBe(true);
    expect((await limiter.admit('t', 0))?.admitted).toBe(false);
    if (first?.admitted === true) first.ticket.settle(7);
    await Promise.resolve();
    expect(settled).toEqual([7]);
    expect((await limiter.admit('t', 0))?.admitted).toBe(true);

    const broken = limiterWith({ requestsPerMinute: 1 }, 0, { ...asyncStore, reserve: () => Promise.reject(new Error('store down')) });
    const admitted = await broken.limiter.admit('t', 0);
    expect(admitted).toMatchObject({ admitted: true, ticket: { headers: {} } });
    expect(broken.errors).toHaveLength(1);
  });
});

describe('what a request reserves and what it used', () => {
  const chat = { promptTokensEstimate: 12, expectedChoices: 1 };
  it('reserves the prompt estimate plus the output cap per choice, or the default cap', () => {
    expect(reservedTokens('chat_completions', { max_tokens: 100 }, chat, 1024)).toBe(112);
    expect(reservedTokens('chat_completions', { max_completion_tokens: 50, max_tokens: 100 }, chat, 1024)).toBe(62);
    expect(reservedTokens('chat_completions', {}, chat, 1024)).toBe(1036);
    expect(reservedTokens('chat_completions', { max_tokens: 'lots' }, chat, 1024)).toBe(1036);
    expect(reservedTokens('completions', { max_tokens: 10 }, { promptTokensEstimate: 4, expectedChoices: 3 }, 1024)).toBe(34);
    expect(reservedTokens('responses', { max_output_tokens: 7 }, chat, 1024)).toBe(19);
    expect(reservedTokens('messages', { max_tokens: 8 }, { promptTokensEstimate: undefined, expectedChoices: 1 }, 1024)).toBe(8);
    expect(reservedTokens('embeddings', { max_tokens: 8 }, chat, 1024)).toBe(12);
    // Routes that never report token usage reserve nothing.
    for (const route of ['tokenize', 'transcriptions', 'responses_retrieve', 'passthrough'] as const) expect(reservedTokens(route, {}, chat, 1024)).toBe(0);
  });

  it('counts prompt + completion tokens of the usage, and nothing without usage', () => {
    expect(usedTokens({ promptTokens: 3, completionTokens: 8, cachedTokens: 2 })).toBe(11);
    expect(usedTokens({ promptTokens: 9, completionTokens: undefined, cachedTokens: undefined })).toBe(9);
    expect(usedTokens({ promptTokens: undefined, completionTokens: undefined, cachedTokens: undefined })).toBeUndefined();
    expect(usedTokens(undefined)).toBeUndefined();
  });

  it('writes reset times as OpenAI does', () => {
    expect([0, 250.2, 1000, 12_500, 59_999, 60_000, 61_250].map(formatReset)).toEqual(['0s', '251ms', '1s', '12.5s', '59.999s', '1m0s', '1m1.25s']);
    expect(rateLimitHeaders({})).toEqual({});
  });
});

describe('configuration', () => {
  const pools = [{ name: 'p', models: ['m'], upstreams: [{ url: 'http://h:1' }] }];
  it('resolves tenants.<name>.limits and limits.anonymous', () => {
    const config = parseConfig({
      pools,
      tenants: { a: { limits: { requests_per_minute: 60, tokens_per_minute: 1000 } }, b: { models: ['m'] } },
      limits: { anonymous: { max_concurrent: 2 } },
    });
    expect(config.tenants['a']?.limits).toEqual({ requestsPerMinute: 60, tokensPerMinute: 1000, maxConcurrent: undefined });
    expect(config.tenants['b']?.limits).toBeUndefined();
    const background = { pollIntervalMs: 2_000, maxHoldMs: 600_000, maxPolls: 8, maxWatched: 1024 };
    expect(config.limits).toEqual({ defaultMaxTokens: 1024, anonymous: { requestsPerMinute: undefined, tokensPerMinute: undefined, maxConcurrent: 2 }, background });
    expect(parseConfig({ pools }).limits).toEqual({ defaultMaxTokens: 1024, anonymous: undefined, background });
  });

  it('refuses limits that are not positive integers, and unknown keys', () => {
    expect(() => parseConfig({ pools, tenants: { a: { limits: { requests_per_minute: 0 } } } })).toThrow(/tenants\.a\.limits\.requests_per_minute/);
    expect(() => parseConfig({ pools, tenants: { a: { limits: { tokens_per_minute: 1.5 } } } })).toThrow(/tokens_per_minute/);
    expect(() => parseConfig({ pools, limits: { anonymous: { per_hour: 1 } } })).toThrow(/limits\.anonymous: unknown key "per_hour"/);
    expect(() => parseConfig({ pools, tenants: { _anonymous: { limits: { max_concurrent: 1 } } } })).toThrow(/tenants/);
  });
});

// ---------------------------------------------------------------------------------------------------------------
// Through the gateway, over real sockets.

const KEY = 'sk-team-a';
const AUTH = { authorization: `Bearer ${KEY}` };
const CHAT_PATH = '/v1/chat/completions';

let stack: Stack | undefined;
afterEach(async () => {
  await stack?.close();
  stack = undefined;
});

async function open(limits: { requests_per_minute?: number; tokens_per_minute?: number; max_concurrent?: number }): Promise<Stack> {
  stack = await startStack({
    config: {
      auth: { keys: [{ tenant: 'team-a', key_sha256: createHash('sha256').update(KEY).digest('hex') }] },
      tenants: { 'team-a': { limits } },
      retries: { max_attempts: 1 },
    },
  });
  return stack;
}

/**
 * The gateway counts on the process's monotonic clock, in fixed minutes. A test that counts requests against one
 * window starts well inside one: it waits out a boundary closer than `marginMs` (at most that long, and only then).
 */
async function awayFromWindowEnd(marginMs = 5_000): Promise<void> {
  const left = WINDOW_MS - (performance.now() % WINDOW_MS);
  if (left < marginMs) await new Promise((resolve) => setTimeout(resolve, left + 10));
}

function errorOf(body: string): { message: string; type: string; param: unknown; code: string } {
  return (JSON.parse(body) as { error: { message: string; type: string; param: unknown; code: string } }).error;
}

describe('through the gateway', () => {
  it('refuses requests over requests_per_minute with 429, Retry-After and the x-ratelimit headers, and counts them', async () => {
    const s = await open({ requests_per_minute: 2 });
    // The refusal series exists from the start for each configured limit, and only for those.
    const before = await s.metricsText();
    expect(before).toContain('waybill_rate_limited_total{tenant="team-a",limit="requests"} 0');
    expect(before).not.toContain('limit="tokens"');
    await awayFromWindowEnd();
    const first = await post(s.base, CHAT_PATH, CHAT, AUTH);
    expect(first.status).toBe(200);
    expect(first.headers).toMatchObject({ 'x-ratelimit-limit-requests': '2', 'x-ratelimit-remaining-requests': '1' });
    expect(first.headers['x-ratelimit-reset-requests']).toMatch(/^(\d+(\.\d+)?s|\d+ms|1m0s)$/);
    expect(first.headers['x-ratelimit-limit-tokens']).toBeUndefined();
    // A stream carries them too: set on the response before the Exchange writes its head.
    const second = await post(s.base, CHAT_PATH, { ...CHAT, stream: true }, AUTH);
    expect(second.status).toBe(200);
    expect(second.headers['content-type']).toBe('text/event-stream; charset=utf-8');
    expect(second.headers).toMatchObject({ 'x-ratelimit-limit-requests': '2', 'x-ratelimit-remaining-requests': '0' });
    expect(second.body.endsWith('data: [DONE]\n\n')).toBe(true);

    const third = await post(s.base, CHAT_PATH, CHAT, AUTH);
    expect(third.status).toBe(429);
    const retryAfter = Number(third.headers['retry-after']);
    expect(retryAfter).toBeGreaterThanOrEqual(1);
    expect(retryAfter).toBeLessThanOrEqual(60);
    expect(third.headers).toMatchObject({ 'x-ratelimit-limit-requests': '2', 'x-ratelimit-remaining-requests': '0' });
    expect(errorOf(third.body)).toEqual({
      message: `Rate limit reached for tenant \`team-a\` on requests per minute: limit 2, used 2, requested 1. Please try again in ${retryAfter}s.`,
      type: 'rate_limit_error',
      param: null,
      code: 'rate_limited',
    });
    // Anthropic's shape on /v1/messages, with the same headers.
    const messages = await post(s.base, '/v1/messages', { model: 'sim-model', max_tokens: 16, messages: [{ role: 'user', content: 'Hi' }] }, AUTH);
    expect(messages.status).toBe(429);
    expect(JSON.parse(messages.body)).toMatchObject({ type: 'error', error: { type: 'rate_limit_error' } });
    expect(messages.headers['retry-after']).toBeDefined();

    await s.settled(4);
    expect(await s.metric('waybill_requests_total', { tenant: 'team-a', code: '429', outcome: 'rejected' })).toBe(2);
    expect(await s.metric('waybill_requests_total', { tenant: 'team-a', code: '200' })).toBe(2);
    expect(await s.metric('waybill_rate_limited_total', { tenant: 'team-a', limit: 'requests' })).toBe(2);
  });

  it('reserves tokens from max_tokens and corrects them by the usage the upstream reported', async () => {
    const s = await open({ tokens_per_minute: 1000 });
    await awayFromWindowEnd();
    const body = { ...CHAT, max_tokens: 100 };
    const first = await post(s.base, CHAT_PATH, body, AUTH);
    expect(first.status).toBe(200);
    const [settledFirst] = await s.settled(1);
    expect(first.headers['x-ratelimit-limit-tokens']).toBe('1000');
    // Reserved: the prompt's estimate and the 100 of max_tokens.
    const estimate = 1000 - 100 - Number(first.headers['x-ratelimit-remaining-tokens']);
    expect(estimate).toBeGreaterThan(0);
    expect(estimate).toBeLessThan(20);
    const used = (settledFirst?.usage?.promptTokens ?? 0) + (settledFirst?.usage?.completionTokens ?? 0);
    expect(used).toBe(3 + 8); // the simulator: ceil(11 chars / 4) prompt tokens, 8 output tokens

    // The second request sees the first's real use, not its reservation.
    const second = await post(s.base, CHAT_PATH, body, AUTH);
    expect(Number(second.headers['x-ratelimit-remaining-tokens'])).toBe(1000 - used - (estimate + 100));
    await s.settled(2);

    // 2 × 11 used; asking for 985 more output tokens passes the limit.
    const over = await post(s.base, CHAT_PATH, { ...CHAT, max_tokens: 985 }, AUTH);
    expect(over.status).toBe(429);
    expect(over.headers['retry-after']).toBeDefined();
    expect(over.headers).toMatchObject({ 'x-ratelimit-limit-tokens': '1000', 'x-ratelimit-remaining-tokens': String(1000 - 2 * used) });
    expect(errorOf(over.body).message).toBe(
      `Rate limit reached for tenant \`team-a\` on tokens per minute: limit 1000, used ${2 * used}, requested ${estimate + 985}. Please try again in ${String(over.headers['retry-after'])}s.`,
    );
    // More than the whole limit: no wait would help, so no Retry-After.
    const huge = await post(s.base, CHAT_PATH, { ...CHAT, max_tokens: 5000 }, AUTH);
    expect(huge.status).toBe(429);
    expect(huge.headers['retry-after']).toBeUndefined();
    expect(errorOf(huge.body).message).toMatch(/^Request too large for tenant `team-a` on tokens per minute/);
    await s.settled(4);
    expect(await s.metric('waybill_rate_limited_total', { tenant: 'team-a', limit: 'tokens' })).toBe(2);
  });

  it('keeps a failed request’s reservation when the upstream reported no usage', async () => {
    const s = await open({ tokens_per_minute: 1000 });
    await awayFromWindowEnd();
    const failed = await post(s.base, CHAT_PATH, { ...CHAT, max_tokens: 100 }, { ...AUTH, 'x-sim-fault': 'status=503' });
    expect(failed.status).toBe(502);
    const reserved = 1000 - Number(failed.headers['x-ratelimit-remaining-tokens']);
    expect(failed.headers['x-ratelimit-limit-tokens']).toBe('1000');
    const [settlement] = await s.settled(1);
    expect(settlement?.usage).toBeUndefined();
    const next = await post(s.base, CHAT_PATH, { ...CHAT, max_tokens: 100 }, AUTH);
    expect(Number(next.headers['x-ratelimit-remaining-tokens'])).toBe(1000 - 2 * reserved);
  });

  it('charges a stream whose client left before the usage chunk what it relayed, not its reservation', async () => {
    const s = await open({ tokens_per_minute: 20_000 });
    await awayFromWindowEnd();
    // No max_tokens: the request reserves limits.default_max_tokens (1024) and the simulator generates 3000, 50 per
    // event; it stalls after 58 events, so the gateway relays exactly 2900 tokens and never the usage chunk.
    const controller = new AbortController();
    const cut = await request(`${s.base}${CHAT_PATH}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...AUTH, 'x-sim-fault': 'tokens=3000;tokens_per_event=50;stall_after=58' },
      body: JSON.stringify({ ...CHAT, stream: true }),
      signal: controller.signal,
    });
    expect(cut.statusCode).toBe(200);
    const reserved = 20_000 - Number(cut.headers['x-ratelimit-remaining-tokens']);
    const prompt = reserved - 1024;
    expect(prompt).toBeGreaterThan(0);
    await untilContentEvents(cut.body, 58);
    controller.abort();
    const [settlement] = await s.settled(1);
    const relayedChars = choiceText(0, 0, 2900).length;
    const estimate = Math.ceil(relayedChars / 4); // metrics.chars_per_token's default
    expect(settlement).toMatchObject({ outcome: 'client_cancelled', usage: undefined, relayed: { outputEvents: 58, outputChars: relayedChars }, estimatedCompletionTokens: estimate });
    expect(estimate).toBeGreaterThan(2900); // the simulator's words average more than 4 characters
    expect(estimate).toBeLessThan(2900 * 1.1);

    // The next request sees what the first took: its prompt and the estimate of its 58 events, not its reservation.
    const next = await post(s.base, CHAT_PATH, { ...CHAT, max_tokens: 100 }, AUTH);
    expect(next.status).toBe(200);
    expect(Number(next.headers['x-ratelimit-remaining-tokens'])).toBe(20_000 - (prompt + estimate) - (prompt + 100));
    await s.settled(2);
    // Usage and the estimate, each in its own counter: the estimate is never passed off as reported usage.
    expect(await s.metric('waybill_estimated_completion_tokens_total', { tenant: 'team-a' })).toBe(estimate);
    expect(await s.metric('waybill_completion_tokens_total', { tenant: 'team-a' })).toBe(8);
  });

  it('admits only what fits once the relayed output of clients that left early is charged', async () => {
    const s = await open({ tokens_per_minute: 10_000 });
    await awayFromWindowEnd();
    // Each reserves ~1027 and takes ~3140 (2900 tokens relayed): 3 fit in 10 000, not 9.
    const statuses: number[] = [];
    for (let i = 0; i < 5; i++) {
      const controller = new AbortController();
      const answer = await request(`${s.base}${CHAT_PATH}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...AUTH, 'x-sim-fault': 'tokens=3000;tokens_per_event=50;stall_after=58' },
        body: JSON.stringify({ ...CHAT, stream: true }),
        signal: controller.signal,
      });
      statuses.push(answer.statusCode);
      if (answer.statusCode === 200) {
        await untilContentEvents(answer.body, 58);
        controller.abort();
      } else {
        await answer.body.text();
      }
      await s.settled(i + 1);
    }
    expect(statuses).toEqual([200, 200, 200, 429, 429]);
  });

  it('holds a max_concurrent slot for a stalled stream and frees it when the client cancels', async () => {
    const s = await open({ max_concurrent: 1 });
    const controller = new AbortController();
    const held = await request(`${s.base}${CHAT_PATH}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...AUTH, 'x-sim-fault': 'stall_after=2' },
      body: JSON.stringify({ ...CHAT, stream: true }),
      signal: controller.signal,
    });
    expect(held.statusCode).toBe(200);
    // Output arrived: the stream is committed, and held open by the stalled upstream.
    // (Read without a for-await loop: leaving one destroys the body, which would cancel the request here.)
    await new Promise((resolve) => held.body.once('data', resolve));

    const refused = await post(s.base, CHAT_PATH, CHAT, AUTH);
    expect(refused.status).toBe(429);
    expect(refused.headers['retry-after']).toBe('1');
    expect(refused.headers['x-ratelimit-limit-requests']).toBeUndefined(); // no per-minute limit, no OpenAI header
    expect(errorOf(refused.body).message).toBe('Rate limit reached for tenant `team-a` on concurrent requests: limit 1, in flight 1. Please try again in 1s.');

    const simEnded = s.simEnded();
    controller.abort();
    const settlements = await s.settled(2);
    expect(settlements.find((settlement) => settlement.code === 200)).toMatchObject({ outcome: 'client_cancelled' });
    expect((await simEnded).end).toBe('client_disconnect');

    // The slot is free again, once.
    const after = await post(s.base, CHAT_PATH, CHAT, AUTH);
    expect(after.status).toBe(200);
    await s.settled(3);
    const again = await post(s.base, CHAT_PATH, CHAT, AUTH);
    expect(again.status).toBe(200);
    await s.settled(4);
    expect(await s.metric('waybill_rate_limited_total', { tenant: 'team-a', limit: 'concurrent' })).toBe(1);
    expect(await s.metric('waybill_client_cancellations_total', { tenant: 'team-a' })).toBe(1);
  });

  it('limits requests served without a key with limits.anonymous, and leaves other tenants alone', async () => {
    stack = await startStack({
      config: {
        auth: { keys: [{ tenant: 'team-a', key_sha256: createHash('sha256').update(KEY).digest('hex') }], required: false },
        limits: { anonymous: { requests_per_minute: 1 } },
      },
    });
    const s = stack;
    await awayFromWindowEnd();
    expect((await post(s.base, CHAT_PATH, CHAT)).status).toBe(200);
    const refused = await post(s.base, CHAT_PATH, CHAT);
    expect(refused.status).toBe(429);
    expect(errorOf(refused.body).message).toMatch(/tenant `_anonymous` on requests per minute/);
    const keyed = await post(s.base, CHAT_PATH, CHAT, AUTH);
    expect(keyed.status).toBe(200);
    expect(keyed.headers['x-ratelimit-limit-requests']).toBeUndefined();
    await s.settled(3);
    expect(await s.metric('waybill_rate_limited_total', { tenant: '_anonymous', limit: 'requests' })).toBe(1);
  });
});
