/**
 * The `revision` of each upstream (issue 25, "Revision and canary"), over real sockets: configured, or read from the
 * upstream's GET /version (the simulator answers vLLM's `{"version": …}`), validated, bounded in size and, per pool,
 * in how many label values it may add for the life of the process; on the SLO counter, output checks, finish
 * reasons and TPOT, taken from the attempt that answered.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { pino } from 'pino';
import { request } from 'undici';
import { ConfigError, parseConfig } from '../src/config/load.js';
import { createGateway, type Gateway } from '../src/app/gateway.js';
import { createSimulator, type Simulator } from '../src/sim/server.js';
import { metricValue, post } from './helpers/stack.js';
import { wire } from './helpers/scripted.js';

const MODEL = 'sim-model';
const CHAT = { model: MODEL, stream: true, messages: [{ role: 'user', content: 'hi' }] };

const closers: Array<() => Promise<void>> = [];
afterEach(async () => {
  await Promise.all(closers.splice(0).map((close) => close()));
});

interface Scripted {
  readonly url: string;
  /** Resolves at the n-th GET /version answered (1-based). */
  versionRead(n: number): Promise<void>;
}

/** An upstream whose GET /version answers `version(n)` at its n-th read (a body, or a status); chat streams `stop`. */
async function scripted(version: (n: number) => { status?: number; body: string }): Promise<Scripted> {
  let reads = 0;
  const waiters: Array<{ n: number; resolve: () => void }> = [];
  const sockets = new Set<Socket>();
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on('end', () => {
      if (req.url === '/health') return void res.end();
      if (req.url === '/version') {
        const answer = version(++reads);
        res.writeHead(answer.status ?? 200, { 'content-type': 'application/json' }).end(answer.body);
        for (const waiter of waiters.filter((w) => w.n <= reads)) waiter.resolve();
        return;
      }
      if (req.url === '/v1/chat/completions') {
        res.writeHead(200, wire.sse).end(wire.role + wire.content('a') + wire.finish + wire.done);
        return;
      }
      res.writeHead(404).end();
    });
  });
  server.on('connection', (socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  closers.push(
    () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  );
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    versionRead: (n) => (reads >= n ? Promise.resolve() : new Promise((resolve) => waiters.push({ n, resolve }))),
  };
}

async function sim(revision: string): Promise<Simulator & { url: string }> {
  const simulator = createSimulator({ ttftMs: 1, itlMs: 1, outputTokens: 3, jitter: 0, revision });
  const { url } = await simulator.listen(0, '127.0.0.1');
  closers.push(() => simulator.close());
  return Object.assign(simulator, { url });
}

async function gateway(upstreams: Array<Record<string, unknown>>, extra: Record<string, unknown> = {}): Promise<{ gateway: Gateway; base: string }> {
  const config = parseConfig(
    {
      server: { host: '127.0.0.1', port: 0 },
      pools: [{ name: 'p', models: [MODEL], upstreams }],
      health: { interval: '1h' },
      logging: { level: 'silent' },
      ...extra,
    },
    'test',
  );
  const g = createGateway(config, { logger: pino({ level: 'silent' }), defaultMetrics: false });
  const base = await g.listen();
  closers.push(() => g.close());
  return { gateway: g, base };
}

async function metricsText(base: string): Promise<string> {
  const response = await request(`${base}/metrics`);
  return response.body.text();
}

describe('the revision of an upstream', () => {
  it("is read from GET /version when not configured, and labels the SLO counter, output checks, finish reasons and TPOT of the requests it answered", async () => {
    const stable = await sim('0.9.1');
    const canary = await sim('0.10.0rc1');
    const { base } = await gateway([
      { name: 'stable', url: stable.url },
      // Configured: /version is never asked, whatever the engine says.
      { name: 'canary', url: canary.url, revision: 'canary' },
      { name: 'read', url: canary.url },
    ]);
    for (let i = 0; i < 12; i++) expect((await post(base, '/v1/chat/completions', CHAT)).status).toBe(200);
    const text = await metricsText(base);
    expect(metricValue(text, 'waybill_upstream_revision_info', { pool: 'p', upstream: 'stable', revision: '0.9.1' })).toBe(1);
    expect(metricValue(text, 'waybill_upstream_revision_info', { pool: 'p', upstream: 'canary', revision: 'canary' })).toBe(1);
    expect(metricValue(text, 'waybill_upstream_revision_info', { pool: 'p', upstream: 'read', revision: '0.10.0rc1' })).toBe(1);
    // Every request lands on one of the three: the counters by revision add up to the attempts by upstream.
    const attempts = (upstream: string) => metricValue(text, 'waybill_upstream_attempts_total', { model: MODEL, upstream, result: 'ok' });
    const slo = (revision: string) => metricValue(text, 'waybill_slo_requests_total', { model: MODEL, revision });
    expect(slo('0.9.1')).toBe(attempts('stable'));
    expect(slo('canary')).toBe(attempts('canary'));
    expect(slo('0.10.0rc1')).toBe(attempts('read'));
    expect(slo('0.9.1') + slo('canary') + slo('0.10.0rc1')).toBe(12);
    expect(metricValue(text, 'waybill_choice_finish_reasons_total', { model: MODEL, finish_reason: 'stop', revision: '0.9.1' })).toBe(attempts('stable'));
    expect(metricValue(text, 'waybill_output_checks_total', { model: MODEL, check: 'not_truncated', result: 'pass', revision: 'canary' })).toBe(attempts('canary'));
    expect(metricValue(text, 'waybill_time_per_output_token_seconds_count', { model: MODEL, revision: '0.10.0rc1' })).toBe(attempts('read'));
    // The zero series the SLO counter is created with are per upstream, under the revision each has (none under
    // _none: that is a request that reached no upstream), and nothing reached an unknown revision.
    const zeros = text.split('\n').filter((line) => line.startsWith('waybill_slo_requests_total{') && line.endsWith('} 0'));
    expect(zeros.length).toBeGreaterThan(0);
    for (const line of zeros) expect(line).toMatch(/upstream="(stable|canary|read)",revision="(0\.9\.1|canary|0\.10\.0rc1)"\} 0$/);
    expect(text).not.toContain('revision="_unknown"');
  });

  it('a request that reached no upstream is counted under revision="_none"', async () => {
    const stable = await sim('0.9.1');
    const { base } = await gateway([{ name: 'stable', url: stable.url }]);
    // An unknown model: answered by the gateway, no attempt.
    expect((await post(base, '/v1/chat/completions', { ...CHAT, model: 'nope' })).status).toBe(404);
    const text = await metricsText(base);
    expect(metricValue(text, 'waybill_slo_requests_total', { result: 'excluded', revision: '_none' })).toBe(1);
    expect(metricValue(text, 'waybill_slo_requests_total', { revision: '0.9.1' })).toBe(0);
  });

  it('an answer that is not a valid version keeps _unknown: a 404, a non-string, a value that is not a revision, a body over health.max_body_bytes (the read stopped, counted)', async () => {
    const bodies: Array<{ status?: number; body: string }> = [
      { status: 404, body: '{"detail":"Not Found"}' },
      { body: '{"version": 9}' },
      { body: '{"version": "0.9.1 <script>"}' },
      { body: JSON.stringify({ version: 'v'.repeat(65) }) },
      { body: JSON.stringify({ version: '0.9.1', pad: 'x'.repeat(4096) }) },
      { body: 'null' },
    ];
    const upstreams = await Promise.all(bodies.map((answer) => scripted(() => answer)));
    const { base } = await gateway(
      upstreams.map((u, i) => ({ name: `u${i}`, url: u.url })),
      { health: { interval: '1h', max_body_bytes: 1024 } },
    );
    const text = await metricsText(base);
    for (let i = 0; i < bodies.length; i++) {
      expect(metricValue(text, 'waybill_upstream_revision_info', { upstream: `u${i}`, revision: '_unknown' }), `u${i}`).toBe(1);
    }
    expect(metricValue(text, 'waybill_upstream_reads_stopped_total', { upstream: 'u4', read: 'discovery', reason: 'too_large' })).toBe(1);
    // Its requests are counted under _unknown.
    expect((await post(base, '/v1/chat/completions', CHAT)).status).toBe(200);
    expect(metricValue(await metricsText(base), 'waybill_slo_requests_total', { revision: '_unknown' })).toBe(1);
  });

  it('revisions read past discovery.max_revisions_per_pool are counted under _other for the life of the process; a failed read keeps the last one', async () => {
    // A new version at every read, and every third read fails.
    const upstream = await scripted((n) => (n % 3 === 0 ? { status: 500, body: '' } : { body: JSON.stringify({ version: `0.${n}.0` }) }));
    const { base } = await gateway([{ name: 'u', url: upstream.url }], {
      discovery: { refresh_interval: '20ms', max_revisions_per_pool: 2 },
    });
    const revisionAfter = async (n: number) => {
      await upstream.versionRead(n);
      // The read's answer is applied once its body is parsed: the next scrape after the next read has it.
      await upstream.versionRead(n + 1);
      return metricsText(base);
    };
    // Reads 1 and 2 admit 0.1.0 and 0.2.0; read 3 fails (0.2.0 kept, or a later one); from read 4 on, _other.
    let text = await revisionAfter(1);
    expect(text).toMatch(/waybill_upstream_revision_info\{pool="p",upstream="u",revision="(0\.[12]\.0|_other)"\} 1/);
    text = await revisionAfter(6);
    expect(metricValue(text, 'waybill_upstream_revision_info', { upstream: 'u', revision: '_other' })).toBe(1);
    const lines = text.split('\n').filter((line) => !line.startsWith('waybill_build_info'));
    const labels = new Set(lines.flatMap((line) => [...line.matchAll(/revision="([^"]+)"/g)].map((m) => m[1])));
    for (const label of labels) expect(['0.1.0', '0.2.0', '_other', '_none']).toContain(label);
  });

  it('a reload keeps what /version said of an unchanged upstream, even when /version fails after it', async () => {
    const upstream = await scripted((n) => (n === 1 ? { body: '{"version":"0.9.1"}' } : { status: 503, body: '' }));
    const upstreams = [{ name: 'u', url: upstream.url }];
    const { gateway: g, base } = await gateway(upstreams);
    expect(metricValue(await metricsText(base), 'waybill_upstream_revision_info', { upstream: 'u', revision: '0.9.1' })).toBe(1);
    const next = parseConfig({ server: { host: '127.0.0.1', port: 0 }, pools: [{ name: 'p', models: [MODEL], upstreams }], health: { interval: '1h' }, logging: { level: 'silent' } }, 'reload');
    expect((await g.reload(next)).result).toBe('ok');
    await upstream.versionRead(2);
    expect(metricValue(await metricsText(base), 'waybill_upstream_revision_info', { upstream: 'u', revision: '0.9.1' })).toBe(1);
    expect((await post(base, '/v1/chat/completions', CHAT)).status).toBe(200);
    expect(metricValue(await metricsText(base), 'waybill_slo_requests_total', { revision: '0.9.1' })).toBe(1);
  });

  it('a configured revision is validated: never a closed value, never free text', () => {
    const config = (revision: string) => ({ pools: [{ name: 'p', models: [MODEL], upstreams: [{ url: 'http://127.0.0.1:1', revision }] }] });
    expect(parseConfig(config('0.9.1+cu124'), 'test').pools[0]?.upstreams[0]?.revision).toBe('0.9.1+cu124');
    for (const bad of ['_none', '_other', '', 'two words', 'x'.repeat(65)]) expect(() => parseConfig(config(bad), 'test'), bad).toThrow(ConfigError);
  });

  it('an engine restart (a new process start time in its /metrics) reads its revision again: a rolled pod behind the same address', async () => {
    const engine = { version: '0.9.1', start: 1_700_000_000, versionReads: 0 };
    const server = createServer((req, res) => {
      req.resume();
      if (req.url === '/health') return void res.end();
      if (req.url === '/version') {
        engine.versionReads++;
        return void res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ version: engine.version }));
      }
      if (req.url === '/metrics') {
        const gauges = ['num_requests_waiting 0', 'num_requests_running 0', 'kv_cache_usage_perc 0.1'].map((g) => `vllm:${g.replace(' ', '{engine="0",model_name="sim-model"} ')}`);
        return void res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' }).end([...gauges, `process_start_time_seconds ${engine.start}`, ''].join('\n'));
      }
      res.writeHead(404).end();
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    closers.push(() => new Promise<void>((resolve) => server.close(() => resolve())));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const { base } = await gateway([{ name: 'u', url }], { engine_signals: { interval: '50ms' }, discovery: { refresh_interval: '1h' } });
    const info = async (revision: string) => metricValue(await metricsText(base), 'waybill_upstream_revision_info', { upstream: 'u', revision });
    expect(await info('0.9.1')).toBe(1);
    expect(engine.versionReads).toBe(1);
    engine.version = '0.10.0';
    engine.start += 60;
    // Polled (bounded): the restart is seen at the next scrape, 50 ms apart, and the read follows it.
    for (let i = 0; i < 100 && (await info('0.10.0')) === 0; i++) await new Promise((resolve) => setTimeout(resolve, 20));
    expect(await info('0.10.0')).toBe(1);
    expect(await info('0.9.1')).toBe(0);
    expect(engine.versionReads).toBe(2);
    expect(metricValue(await metricsText(base), 'waybill_upstream_engine_restarts_total', { upstream: 'u', cause: 'start_time' })).toBe(1);
  });
});
