/**
 * The admin listener (`server.admin_port`), over real sockets: /metrics, /healthz and /readyz move to a port of
 * their own and the API port serves only the API (those paths are unknown routes there: 404, counted under
 * route="_other"); readiness is answered on the admin port all through a drain, and the admin port closes last.
 * Without admin_port one port serves everything (test/gateway-http.test.ts and test/resilience.test.ts).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { pino } from 'pino';
import { Agent, request } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';
import { ConfigError, parseConfig } from '../src/config/load.js';
import type { ConfigInput } from '../src/config/schema.js';
import { createGateway } from '../src/app/gateway.js';
import { createSimulator } from '../src/sim/server.js';
import { useCleanups } from './helpers/cleanups.js';
import { CHAT, metricValue, post, startStack, type Stack, type StackOptions } from './helpers/stack.js';

const STREAM = { ...CHAT, stream: true };
const DONE = 'data: [DONE]\n\n';
const OPERATIONAL = ['/healthz', '/readyz', '/metrics'];
/** Never served: port 9 (discard) is privileged and refuses, so no test probes a user's `waybill sim` on :8000. */
const POOLS = [{ name: 'p', models: ['m'], upstreams: [{ url: 'http://127.0.0.1:9' }] }];

const cleanups = useCleanups();

/** A stack whose gateway has an admin listener on an ephemeral loopback port. */
async function adminStack(options: StackOptions = {}): Promise<Stack & { admin: string }> {
  const { server, ...rest } = options.config ?? {};
  const s = await startStack({ ...options, config: { ...rest, server: { host: '127.0.0.1', port: 0, admin_port: 0, ...server } } });
  cleanups.push(() => s.close());
  const admin = s.gateway.adminUrl;
  if (admin === undefined) throw new Error('no admin listener');
  return Object.assign(s, { admin });
}

/** A fresh connection each time: a refused one must not hide behind a kept-alive socket. */
async function get(url: string): Promise<{ status: number; body: string }> {
  const dispatcher = new Agent();
  try {
    const response = await request(url, { dispatcher });
    return { status: response.statusCode, body: await response.body.text() };
  } finally {
    await dispatcher.close();
  }
}

async function scrape(admin: string): Promise<string> {
  return (await get(`${admin}/metrics`)).body;
}

function expectNotFound(body: string): void {
  const parsed = JSON.parse(body) as { error: Record<string, unknown> };
  expect(Object.keys(parsed.error).sort()).toEqual(['code', 'message', 'param', 'type']);
  expect(parsed.error['code']).toBe('not_found');
}

const portOf = (url: string) => Number(new URL(url).port);

describe('server.admin_port configuration', () => {
  const parse = (server: Record<string, unknown>) => parseConfig({ server, pools: POOLS }, 'test', {});

  it('is off by default: one port serves everything', () => {
    const config = parse({});
    expect(config.server.admin_port).toBeUndefined();
    expect(createGateway(config, { logger: pino({ level: 'silent' }), defaultMetrics: false }).admin).toBeUndefined();
  });

  it('takes an admin_host, and otherwise listens where the API does', async () => {
    expect(parse({ admin_port: 9090, admin_host: '127.0.0.1' }).server).toMatchObject({ host: '0.0.0.0', admin_host: '127.0.0.1', admin_port: 9090 });
    // admin_host left out: the admin listener takes server.host (here loopback, so the test need not listen on every interface).
    const config = parseConfig({ server: { host: '127.0.0.1', port: 0, admin_port: 0 }, pools: POOLS, logging: { level: 'silent' } }, 'test', {});
    expect(config.server.admin_host).toBeUndefined();
    const gateway = createGateway(config, { logger: pino({ level: 'silent' }), defaultMetrics: false });
    cleanups.push(() => gateway.close());
    await gateway.listen();
    expect(new URL(gateway.adminUrl ?? '').hostname).toBe('127.0.0.1');
  });

  it('must differ from server.port, unless both are ephemeral', () => {
    expect(() => parse({ port: 8080, admin_port: 8080 })).toThrow(ConfigError);
    expect(() => parse({ port: 8080, admin_port: 8080 })).toThrow(/server\.admin_port: must differ from server\.port \(8080\)/);
    expect(() => parse({ admin_port: 8080 })).toThrow(/server\.admin_port: must differ/);
    expect(parse({ port: 0, admin_port: 0 }).server.admin_port).toBe(0);
    expect(() => parse({ admin_port: 65536 })).toThrow(/server\.admin_port/);
  });

  it('refuses admin_host without admin_port', () => {
    expect(() => parse({ admin_host: '127.0.0.1' })).toThrow(/server\.admin_host: set server\.admin_port too/);
  });
});

describe('with server.admin_port', () => {
  it('serves /healthz, /readyz and /metrics on the admin port, and the API on the public port', async () => {
    const s = await adminStack();
    expect(portOf(s.admin)).not.toBe(portOf(s.base));
    expect(await get(`${s.admin}/healthz`)).toEqual({ status: 200, body: JSON.stringify({ status: 'ok' }) });
    const ready = await get(`${s.admin}/readyz`);
    expect(ready.status).toBe(200);
    expect(JSON.parse(ready.body)).toMatchObject({ status: 'ready', pools: [{ name: 'sim', upstreams: [{ name: 'sim-0', healthy: true }] }] });

    const client = await post(s.base, '/v1/chat/completions', STREAM);
    expect(client.status).toBe(200);
    expect(client.body.endsWith(DONE)).toBe(true);
    await s.settled(1);
    const metrics = await request(`${s.admin}/metrics`);
    expect(metrics.headers['content-type']).toMatch(/^text\/plain; version=0\.0\.4/);
    // The one registry: the API port's request is counted in what the admin port exports.
    const text = await metrics.body.text();
    expect(metricValue(text, 'waybill_requests_total', { route: 'chat_completions', stream: 'true', code: '200', outcome: 'delivered' })).toBe(1);
    expect(metricValue(text, 'waybill_requests_total')).toBe(1);
  });

  it('answers the operational paths on the public port like any unknown path: 404, counted once each under route="_other"', async () => {
    const s = await adminStack();
    for (const path of OPERATIONAL) {
      const response = await get(`${s.base}${path}`);
      expect(response.status, path).toBe(404);
      expectNotFound(response.body);
    }
    await s.settled(OPERATIONAL.length);
    const text = await scrape(s.admin);
    const labels = { model: '_other', route: '_other', stream: 'false', code: '404', outcome: 'rejected' };
    expect(metricValue(text, 'waybill_requests_total', labels)).toBe(OPERATIONAL.length);
    expect(metricValue(text, 'waybill_requests_total')).toBe(OPERATIONAL.length);
    expect(s.settlements.map((x) => x.code)).toEqual([404, 404, 404]);
  });

  it('counts nothing the admin port is asked: probes and scrapes are not API requests, nor are its unknown paths', async () => {
    const s = await adminStack();
    for (const path of OPERATIONAL) expect((await get(`${s.admin}${path}`)).status, path).toBe(200);
    const unknown = await get(`${s.admin}/v1/chat/completions`);
    expect(unknown.status).toBe(404);
    expectNotFound(unknown.body);
    expect(metricValue(await scrape(s.admin), 'waybill_requests_total')).toBe(0);
    expect(s.settlements).toEqual([]);
  });

  it('keeps answering readiness (503, draining) on the admin port while a stream in flight completes, and closes it last', async () => {
    const s = await adminStack({ sim: { itlMs: 20, outputTokens: 100 }, config: { shutdown: { grace: '100ms', drain_timeout: '10s' } } });
    const stream = post(s.base, '/v1/chat/completions', STREAM);
    await once(s.sims[0]?.events ?? process, 'request-start');
    const drained = s.gateway.drain();
    let streamDone = false;
    void stream.then(() => (streamDone = true));

    const draining = await get(`${s.admin}/readyz`);
    expect(draining.status).toBe(503);
    expect(JSON.parse(draining.body)).toMatchObject({ status: 'draining' });

    // After the grace the API port refuses new connections; the stream is still in flight, and the admin port
    // still answers.
    await new Promise((r) => setTimeout(r, 300));
    await expect(get(`${s.base}/v1/models`)).rejects.toThrow(/ECONNREFUSED/);
    expect(streamDone).toBe(false);
    expect(s.gateway.inflight).toBe(1);
    const stillDraining = await get(`${s.admin}/readyz`);
    expect(stillDraining.status).toBe(503);
    expect(JSON.parse(stillDraining.body)).toMatchObject({ status: 'draining' });
    expect((await get(`${s.admin}/healthz`)).status).toBe(200);
    expect(metricValue(await scrape(s.admin), 'waybill_inflight_requests')).toBe(1);

    const client = await stream;
    expect(client.status).toBe(200);
    expect(client.body.endsWith(DONE)).toBe(true);
    await drained;
    const [settlement] = await s.settled(1);
    expect(settlement).toMatchObject({ outcome: 'delivered', code: 200 });
    await expect(get(`${s.admin}/healthz`)).rejects.toThrow(/ECONNREFUSED/);
  });

  it('closes both listeners on close()', async () => {
    const s = await adminStack();
    expect((await get(`${s.admin}/healthz`)).status).toBe(200);
    await s.gateway.close();
    await expect(get(`${s.base}/v1/models`)).rejects.toThrow(/ECONNREFUSED/);
    await expect(get(`${s.admin}/healthz`)).rejects.toThrow(/ECONNREFUSED/);
  });

  it('fails to start, holding no port, when either port is taken', async () => {
    const taken: Server = createServer();
    taken.listen(0, '127.0.0.1');
    await once(taken, 'listening');
    cleanups.push(() => new Promise<void>((resolve) => taken.close(() => resolve())));
    const port = (taken.address() as AddressInfo).port;
    const start = async (server: ConfigInput['server']) => {
      const config = parseConfig({ server, pools: POOLS, logging: { level: 'silent' } }, 'test', {});
      const gateway = createGateway(config, { logger: pino({ level: 'silent' }), defaultMetrics: false });
      cleanups.push(() => gateway.close());
      await expect(gateway.listen()).rejects.toThrow(/EADDRINUSE/);
      return gateway;
    };
    await start({ host: '127.0.0.1', port: 0, admin_port: port });
    const gateway = await start({ host: '127.0.0.1', port, admin_port: 0 });
    expect(gateway.adminUrl).toBeUndefined();
    expect(gateway.admin?.server.listening).toBe(false);
  });
});

describe('waybill serve with server.admin_port', () => {
  const children: ChildProcess[] = [];
  afterEach(() => {
    for (const child of children.splice(0)) if (child.exitCode === null) child.kill('SIGKILL');
  });

  it('says where the API, metrics and health endpoints are, and serves them there (needs npm run build)', async () => {
    const sim = createSimulator({ models: ['tiny'], ttftMs: 1, itlMs: 1, outputTokens: 3 });
    const { url } = await sim.listen(0, '127.0.0.1');
    cleanups.push(() => sim.close());
    const file = join(mkdtempSync(join(tmpdir(), 'waybill-admin-')), 'serve.yaml');
    writeFileSync(file, 'server: { admin_port: 0 }\npools: [{ name: p, upstreams: [{ url: "http://127.0.0.1:1" }] }]\nshutdown: { grace: 0, drain_timeout: 1s }\n');
    const bin = new URL('../bin/waybill.js', import.meta.url).pathname;
    const child = spawn(process.execPath, [bin, 'serve', '--config', file, '--upstream', url, '--host', '127.0.0.1', '--port', '0'], { stdio: ['ignore', 'pipe', 'pipe'] });
    children.push(child);
    const lines = createInterface({ input: child.stdout });
    const line = await new Promise<string>((resolve, reject) => {
      lines.on('line', (l) => {
        if (/waybill listening/.test(l)) resolve(l);
      });
      child.once('exit', (code) => reject(new Error(`exited with ${code} before listening`)));
    });
    const listening = JSON.parse(line) as { url: string; models: string[]; metrics: string; healthz: string; readyz: string };
    expect(listening.models).toEqual(['tiny']);
    const admin = new URL(listening.metrics).origin;
    expect(new URL(admin).hostname).toBe('127.0.0.1');
    expect(portOf(admin)).not.toBe(portOf(listening.url));
    expect(listening).toMatchObject({ metrics: `${admin}/metrics`, healthz: `${admin}/healthz`, readyz: `${admin}/readyz` });

    expect((await get(listening.readyz)).status).toBe(200);
    expect((await get(listening.healthz)).status).toBe(200);
    expect((await get(`${listening.url}/readyz`)).status).toBe(404);
    const completion = await post(listening.url, '/v1/chat/completions', { model: 'tiny', stream: true, messages: [{ role: 'user', content: 'hi' }] });
    expect(completion.body.endsWith(DONE)).toBe(true);
    const metrics = (await get(listening.metrics)).body;
    expect(metricValue(metrics, 'waybill_requests_total', { route: 'chat_completions', code: '200', outcome: 'delivered' })).toBe(1);
    expect(metricValue(metrics, 'waybill_requests_total', { route: '_other', code: '404' })).toBe(1);
    expect(metrics).toMatch(/^process_cpu_seconds_total \d/m);

    child.kill('SIGTERM');
    const [code] = (await once(child, 'exit')) as [number | null];
    expect(code).toBe(0);
  });
});
