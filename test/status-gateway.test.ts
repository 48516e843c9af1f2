/**
 * The live status page over real sockets, in front of the simulator: /status.json after real requests (the funnel,
 * the failed requests with their causes, per model, tenant and upstream), the event stream (its bound, its end on
 * drain), and where the page is served: the admin listener when there is one, never then the API port.
 */
import type { AddressInfo } from 'node:net';
import { pino } from 'pino';
import { Agent, request } from 'undici';
import { describe, expect, it } from 'vitest';
import { parseConfig, type Config } from '../src/config/load.js';
import type { ConfigInput } from '../src/config/schema.js';
import { createGateway, type Gateway } from '../src/app/gateway.js';
import type { StatusSnapshot } from '../src/http/status-page.js';
import { createSimulator, type Simulator } from '../src/sim/server.js';
import { useCleanups } from './helpers/cleanups.js';
import { CHAT, metricValue, post, startStack, type Stack, type StackOptions } from './helpers/stack.js';

const STREAM = { ...CHAT, stream: true };
/** Never served: port 9 (discard) is privileged and refuses, so no test probes a user's `waybill sim` on :8000. */
const POOLS = [{ name: 'p', models: ['m'], upstreams: [{ url: 'http://127.0.0.1:9' }] }];

const cleanups = useCleanups();

async function stack(options: StackOptions = {}): Promise<Stack> {
  const s = await startStack(options);
  cleanups.push(() => s.close());
  return s;
}

/** A fresh connection each time: a refused one must not hide behind a kept-alive socket. */
async function get(url: string): Promise<{ status: number; headers: Record<string, unknown>; body: string }> {
  const dispatcher = new Agent();
  try {
    const response = await request(url, { dispatcher });
    return { status: response.statusCode, headers: response.headers, body: await response.body.text() };
  } finally {
    await dispatcher.close();
  }
}

async function snapshot(base: string): Promise<StatusSnapshot> {
  const response = await get(`${base}/status.json`);
  expect(response.status).toBe(200);
  return JSON.parse(response.body) as StatusSnapshot;
}

/** An open event stream, read event by event. */
async function follow(url: string) {
  const dispatcher = new Agent();
  const response = await request(url, { dispatcher });
  const events: string[] = [];
  let buffer = '';
  let waiter: (() => void) | undefined;
  let ended = false;
  response.body.setEncoding('utf8');
  response.body.on('data', (chunk: string) => {
    buffer += chunk;
    let end: number;
    while ((end = buffer.indexOf('\n\n')) !== -1) {
      events.push(buffer.slice(0, end));
      buffer = buffer.slice(end + 2);
    }
    waiter?.();
  });
  response.body.on('error', () => undefined);
  response.body.on('end', () => {
    ended = true;
    waiter?.();
  });
  return {
    status: response.statusCode,
    headers: response.headers,
    events,
    get ended() {
      return ended;
    },
    /** Resolves once `n` events arrived (or the stream ended). */
    async until(n: number): Promise<string[]> {
      while (events.length < n && !ended) await new Promise<void>((resolve) => (waiter = resolve));
      return events;
    },
    async close() {
      response.body.destroy();
      await dispatcher.destroy();
    },
  };
}

const dataOf = (event: string) => JSON.parse(event.split('\n').find((line) => line.startsWith('data: '))?.slice(6) ?? 'null') as StatusSnapshot;

/** A gateway whose configuration carries `status` settings, started in front of one simulator. */
async function gatewayWith(status: { enabled: boolean; maxClients: number }, input: Partial<ConfigInput> = {}): Promise<{ gateway: Gateway; base: string; sim: Simulator }> {
  const sim = createSimulator({ ttftMs: 5, itlMs: 1, outputTokens: 8, jitter: 0 });
  const { url } = await sim.listen(0, '127.0.0.1');
  const parsed = parseConfig({ server: { host: '127.0.0.1', port: 0 }, pools: [{ name: 'sim', models: ['sim-model'], upstreams: [{ name: 'sim-0', url }] }], logging: { level: 'silent' }, ...input }, 'test');
  // The status section as config/load.ts resolves it (status.enabled, status.max_clients).
  const config = { ...parsed, status } as Config;
  const gateway = createGateway(config, { logger: pino({ level: 'silent' }), defaultMetrics: false });
  await gateway.listen();
  cleanups.push(async () => {
    await gateway.close();
    await sim.close();
  });
  return { gateway, base: `http://127.0.0.1:${(gateway.app.server.address() as AddressInfo).port}`, sim };
}

describe('status configuration', () => {
  it('resolves status.enabled and status.max_clients, on by default with 16 streams', () => {
    expect(parseConfig({ pools: POOLS }, 'test', {}).status).toEqual({ enabled: true, maxClients: 16 });
    expect(parseConfig({ pools: POOLS, status: { enabled: false, max_clients: 2 } }, 'test', {}).status).toEqual({ enabled: false, maxClients: 2 });
    expect(() => parseConfig({ pools: POOLS, status: { max_clients: 0 } }, 'test', {})).toThrow(/status\.max_clients/);
    expect(() => parseConfig({ pools: POOLS, status: { page: true } }, 'test', {})).toThrow(/status: unknown key "page"/);
  });
});

describe('/status.json after real requests', () => {
  it('shows the funnel, the failed requests with their causes, and each model, tenant and upstream', async () => {
    const s = await stack({ config: { retries: { max_attempts: 1 }, limits: { anonymous: { requests_per_minute: 4 } } } });
    const ok = await post(s.base, '/v1/chat/completions', STREAM, { 'x-request-id': 'status-ok' });
    expect(ok.body.endsWith('data: [DONE]\n\n')).toBe(true);
    const broken = await post(s.base, '/v1/chat/completions', STREAM, { 'x-sim-fault': 'error_after=2', 'x-request-id': 'status-broken' });
    expect(broken.status).toBe(200);
    const cut = await post(s.base, '/v1/chat/completions', STREAM, { 'x-sim-fault': 'finish_reason=length', 'x-request-id': 'status-cut' });
    expect(cut.body.endsWith('data: [DONE]\n\n')).toBe(true);
    const upstream429 = await post(s.base, '/v1/chat/completions', STREAM, { 'x-sim-fault': 'status=429', 'x-request-id': 'status-429' });
    expect(upstream429.status).toBe(429);
    const limited = await post(s.base, '/v1/chat/completions', STREAM, { 'x-request-id': 'status-limited' });
    expect(limited.status).toBe(429);
    expect(JSON.parse(limited.body)).toMatchObject({ error: { code: 'rate_limited' } });
    await s.settled(5);

    const view = await snapshot(s.base);
    expect(view).toMatchObject({ version: 1, state: 'serving', window: { seconds: 300, bucket_seconds: 10 } });
    expect(view.funnel).toMatchObject({ requests: 5, http_2xx: 3, delivered: 2, accepted: 1, slo_met: 2, slo_eligible: 5 });
    expect(view.funnel.outcomes).toMatchObject({ delivered: 2, stream_error: 1, rejected: 2 });
    // The same numbers as the metrics, which count from the same ledger.
    const text = await s.metricsText();
    expect(metricValue(text, 'waybill_requests_total')).toBe(view.funnel.requests);
    expect(metricValue(text, 'waybill_requests_total', { outcome: 'delivered' })).toBe(view.funnel.delivered);
    expect(metricValue(text, 'waybill_requests_accepted_total')).toBe(view.funnel.accepted);

    expect(view.failures.map((f) => [f.request_id, f.outcome, f.code, f.cause])).toEqual([
      ['status-limited', 'rejected', 429, 'gateway'],
      ['status-429', 'rejected', 429, 'upstream_4xx'],
      ['status-cut', 'delivered', 200, 'check_failed:not_truncated'],
      ['status-broken', 'stream_error', 200, 'error_payload'],
    ]);
    expect(view.failures[1]).toMatchObject({ model: 'sim-model', tenant: '_anonymous', route: 'chat_completions', stream: true, upstream: 'sim-0', attempts: 1, trace_id: null });

    expect(view.models).toEqual([expect.objectContaining({ name: 'sim-model', requests: 5, delivered: 2, accepted: 1 })]);
    expect(view.tenants).toEqual([expect.objectContaining({ name: '_anonymous', requests: 5, completion_tokens: expect.any(Number) as number })]);
    expect(view.tenants[0]?.completion_tokens).toBeGreaterThan(0);
    expect(view.latency.map((l) => l.prompt_len)).toEqual(['0-1k', '1k-4k', '4k-16k', '16k-64k', '64k+', 'unknown']);
    expect(view.latency[0]?.ttft.count).toBe(3);
    expect(view.upstreams).toEqual([
      // The error event (code 500) counts against the upstream's health; the 429 is the client's lot, not a failure.
      expect.objectContaining({ name: 'sim-0', pool: 'sim', up: true, healthy: true, circuit: 'closed', inflight: 0, attempts: 4, failed_attempts: 1 }),
    ]);
    expect(view.upstreams[0]?.last_failure).toMatchObject({ result: 'error_payload' });
    expect(view.upstreams[0]?.first_output.count).toBe(3);

    // Ids, closed-set values and numbers only: nothing of the prompt or the answer.
    const raw = (await get(`${s.base}/status.json`)).body;
    expect(raw).not.toContain('Hello there');
    expect(raw).not.toMatch(/héllo|日本/);
  });

  it('serves the page itself, self-contained, with a policy that lets only its own script run', async () => {
    const s = await stack();
    const page = await get(`${s.base}/status`);
    expect(page.status).toBe(200);
    expect(page.headers['content-type']).toBe('text/html; charset=utf-8');
    expect(page.headers['content-security-policy']).toMatch(/default-src 'none'; script-src 'sha256-[A-Za-z0-9+/=]+'; style-src 'sha256-/);
    expect(page.headers['cache-control']).toBe('no-store');
    expect(page.body).toMatch(/^<!doctype html>/);
    expect(page.body).not.toMatch(/<(script|link)[^>]+(src|href)="(https?:)?\/\//);
    // Not an API request: nothing counted.
    expect(metricValue(await s.metricsText(), 'waybill_requests_total')).toBe(0);
  });
});

describe('/status/events', () => {
  it('sends a snapshot at once and one a second, and ends the streams on drain without holding it', async () => {
    const s = await stack({ config: { shutdown: { grace: '50ms', drain_timeout: '5s' } } });
    const stream = await follow(`${s.base}/status/events`);
    cleanups.push(() => stream.close());
    expect(stream.status).toBe(200);
    expect(stream.headers['content-type']).toBe('text/event-stream; charset=utf-8');
    // How long EventSource waits to reconnect, then the first snapshot at once.
    const [retry, first] = await stream.until(2);
    expect(retry).toBe('retry: 2000');
    expect(dataOf(first ?? '').funnel.requests).toBe(0);
    await post(s.base, '/v1/chat/completions', STREAM);
    await s.settled(1);
    const events = await stream.until(3);
    expect(dataOf(events.at(-1) ?? '').funnel.requests).toBe(1);

    const started = Date.now();
    await s.gateway.drain();
    expect(Date.now() - started).toBeLessThan(2000);
    await stream.until(Number.POSITIVE_INFINITY);
    expect(stream.ended).toBe(true);
  });

  it('ends the streams on the API port at a reload, so they do not hold the retired configuration; pages reconnect', async () => {
    const s = await stack();
    const stream = await follow(`${s.base}/status/events`);
    cleanups.push(() => stream.close());
    await stream.until(2);
    expect(await s.gateway.reload(s.gateway.config)).toMatchObject({ result: 'ok' });
    await stream.until(Number.POSITIVE_INFINITY);
    expect(stream.ended).toBe(true);
    const again = await follow(`${s.base}/status/events`);
    cleanups.push(() => again.close());
    expect(again.status).toBe(200);
    expect(dataOf((await again.until(2))[1] ?? '').upstreams.map((u) => u.name)).toEqual(['sim-0']);
  });

  it('refuses streams past status.max_clients with 503 in OpenAI shape, and takes one again when a page leaves', async () => {
    const { base } = await gatewayWith({ enabled: true, maxClients: 2 });
    const a = await follow(`${base}/status/events`);
    const b = await follow(`${base}/status/events`);
    cleanups.push(() => a.close(), () => b.close());
    await Promise.all([a.until(1), b.until(1)]);
    const refused = await get(`${base}/status/events`);
    expect(refused.status).toBe(503);
    const body = JSON.parse(refused.body) as { error: Record<string, unknown> };
    expect(Object.keys(body.error).sort()).toEqual(['code', 'message', 'param', 'type']);
    expect(body.error).toMatchObject({ code: 'too_many_connections', type: 'unavailable_error' });
    expect(body.error['message']).toMatch(/status\.max_clients/);
    // The page and the one-off snapshot are not streams: still served.
    expect((await get(`${base}/status.json`)).status).toBe(200);

    // Once a page leaves (its socket closes on the gateway's side), its place is free.
    await a.close();
    let status = 0;
    for (let tries = 0; tries < 100 && status !== 200; tries++) {
      const c = await follow(`${base}/status/events`);
      status = c.status;
      await c.close();
      if (status !== 200) await new Promise((r) => setTimeout(r, 20));
    }
    expect(status).toBe(200);
  });

  it('is off with status.enabled: false: the paths are unknown, like any other', async () => {
    const { gateway, base } = await gatewayWith({ enabled: false, maxClients: 16 });
    for (const path of ['/status', '/status.json', '/status/events']) {
      const response = await get(`${base}${path}`);
      expect(response.status, path).toBe(404);
      expect(JSON.parse(response.body)).toMatchObject({ error: { code: 'not_found' } });
    }
    expect(metricValue((await gateway.metrics.scrape(undefined)).body, 'waybill_requests_total', { route: '_other', code: '404' })).toBe(3);
  });
});

describe('with server.admin_port', () => {
  it('serves the status page on the admin port only; the API port answers it 404', async () => {
    const s = await stack({ config: { server: { host: '127.0.0.1', port: 0, admin_port: 0 }, shutdown: { grace: '1500ms', drain_timeout: '5s' } } });
    const admin = s.gateway.adminUrl ?? '';
    expect(admin).not.toBe('');
    await post(s.base, '/v1/chat/completions', STREAM);
    await s.settled(1);
    for (const path of ['/status', '/status.json', '/status/events']) {
      const response = await get(`${s.base}${path}`);
      expect(response.status, path).toBe(404);
      expect(JSON.parse(response.body)).toMatchObject({ error: { code: 'not_found' } });
    }
    expect((await get(`${admin}/status`)).status).toBe(200);
    // The completion, and the three 404s the API port answered (counted there as unknown paths, route="_other").
    expect((await snapshot(admin)).funnel).toMatchObject({ requests: 4, delivered: 1 });

    // The admin port keeps streaming through the drain, then ends the stream before it closes.
    const stream = await follow(`${admin}/status/events`);
    cleanups.push(() => stream.close());
    await stream.until(1);
    const drained = s.gateway.drain();
    const events = await stream.until(3);
    expect(dataOf(events.at(-1) ?? '').state).toBe('draining');
    await drained;
    await stream.until(Number.POSITIVE_INFINITY);
    expect(stream.ended).toBe(true);
    // The 404s on the API port were counted there, as unknown paths.
    expect(s.settlements.filter((x) => x.route === '_other' && x.code === 404)).toHaveLength(3);
  });
});
