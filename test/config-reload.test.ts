/**
 * Live reload (docs/operations.md, "Reloading the configuration"), over real loopback sockets: a stream in flight
 * across a reload finishes on the upstream it started on, a rotated key takes effect for new requests only, an
 * invalid or restart-only change keeps the configuration in force, and the reload metrics say so.
 */
import { createHash } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { pino } from 'pino';
import { request } from 'undici';
import { afterEach, describe, expect, it, vi } from 'vitest';
import type { Settlement } from '../src/accounting/ledger.js';
import { ConfigError, parseConfig, type Config } from '../src/config/load.js';
import type { ConfigInput } from '../src/config/schema.js';
import { createGateway, type Gateway } from '../src/app/gateway.js';
import { createSimulator, type Simulator } from '../src/sim/server.js';
import { CHAT, eventData, metricValue } from './helpers/stack.js';

const sha = (key: string) => createHash('sha256').update(key).digest('hex');

interface Rig {
  gateway: Gateway;
  base: string;
  sims: Simulator[];
  urls: string[];
  settlements: Settlement[];
  config(input?: Partial<ConfigInput> & { upstream?: number }): Config;
  metric(name: string, labels?: Record<string, string>): Promise<number>;
  metricsText(): Promise<string>;
}

const rigs: Rig[] = [];

afterEach(async () => {
  for (const rig of rigs.splice(0)) {
    await rig.gateway.close();
    await Promise.all(rig.sims.map((sim) => sim.close()));
  }
});

/** Two simulators serving sim-model; the gateway's pool starts with the first only. */
async function startRig(input: Partial<ConfigInput> = {}): Promise<Rig> {
  const sims: Simulator[] = [];
  const urls: string[] = [];
  for (let i = 0; i < 2; i++) {
    // Slow enough to reload mid-stream: 20 tokens, 40 ms apart.
    const sim = createSimulator({ ttftMs: 5, itlMs: 40, outputTokens: 20, jitter: 0 });
    urls.push((await sim.listen(0, '127.0.0.1')).url);
    sims.push(sim);
  }
  const config = ({ upstream = 0, ...rest }: Partial<ConfigInput> & { upstream?: number } = {}) =>
    parseConfig(
      {
        server: { host: '127.0.0.1', port: 0 },
        pools: [{ name: 'sim', models: ['sim-model'], upstreams: [{ name: `sim-${upstream}`, url: urls[upstream] ?? '' }] }],
        logging: { level: 'silent' },
        ...input,
        ...rest,
      },
      'test',
    );
  const settlements: Settlement[] = [];
  const gateway = createGateway(config(), { logger: pino({ level: 'silent' }), defaultMetrics: false, onSettled: (s) => settlements.push(s) });
  await gateway.listen();
  const base = `http://127.0.0.1:${(gateway.app.server.address() as AddressInfo).port}`;
  const metricsText = async () => (await request(`${base}/metrics`)).body.text();
  const rig: Rig = {
    gateway,
    base,
    sims,
    urls,
    settlements,
    config: (more = {}) => config({ ...input, ...more }),
    metricsText,
    metric: async (name, labels = {}) => metricValue(await metricsText(), name, labels),
  };
  rigs.push(rig);
  return rig;
}

async function chat(base: string, body: Record<string, unknown>, headers: Record<string, string> = {}) {
  const response = await request(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ ...CHAT, ...body }),
  });
  return { status: response.statusCode, body: await response.body.text() };
}

/** Starts a stream and resolves once its first bytes arrived; `rest` reads the remainder. */
async function startStream(base: string, headers: Record<string, string> = {}) {
  const response = await request(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ ...CHAT, stream: true }),
  });
  const chunks: Buffer[] = [];
  const iterator = response.body[Symbol.asyncIterator]();
  const first = await iterator.next();
  if (first.done !== true) chunks.push(first.value as Buffer);
  return {
    status: response.statusCode,
    async rest(): Promise<string> {
      for (let next = await iterator.next(); next.done !== true; next = await iterator.next()) chunks.push(next.value as Buffer);
      return Buffer.concat(chunks).toString();
    },
  };
}

const until = async (check: () => boolean, ms = 5000) => {
  const deadline = Date.now() + ms;
  while (!check()) {
    if (Date.now() > deadline) throw new Error('timed out');
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
};

describe('configuration reload', () => {
  it('finishes a stream in flight on its old upstream, counted once, while new requests go to the new one', async () => {
    const rig = await startRig();
    const stream = await startStream(rig.base);
    expect(stream.status).toBe(200);
    const before = rig.gateway.configHash;
    const old = rig.gateway.upstreams;
    const closed = vi.spyOn(old, 'close');
    const stopped = vi.spyOn(old, 'stop');

    const result = await rig.gateway.reload(rig.config({ upstream: 1 }));
    expect(result.result).toBe('ok');
    expect(rig.gateway.upstreams).not.toBe(old);
    // The old upstreams stop their health checks at once, but stay open for the stream still on them.
    expect(stopped).toHaveBeenCalledTimes(1);
    expect(closed).not.toHaveBeenCalled();
    expect(rig.gateway.configHash).not.toBe(before);

    // A new request, while the old stream is still going, goes to the new upstream.
    const fresh = await chat(rig.base, { stream: false });
    expect(fresh.status).toBe(200);
    expect(rig.sims[1]?.stats().byRoute.chat_completions).toBe(1);

    const text = await stream.rest();
    const data = eventData(text);
    expect(data.at(-1)).toBe('[DONE]');
    expect(data.filter((d) => d !== '[DONE]').length).toBeGreaterThanOrEqual(20);
    await until(() => rig.settlements.length === 2);
    const streamed = rig.settlements.find((s) => s.stream);
    expect(streamed?.outcome).toBe('delivered');
    expect(streamed?.attempts.map((a) => a.upstream)).toEqual(['sim-0']);
    expect(rig.settlements.find((s) => !s.stream)?.attempts.map((a) => a.upstream)).toEqual(['sim-1']);
    // Its last request done, the old generation closes its upstreams.
    await until(() => closed.mock.calls.length === 1);
    expect(rig.sims[0]?.stats().byRoute.chat_completions).toBe(1);
    expect(rig.sims[0]?.stats().completed).toBe(1);
    expect(await rig.metric('waybill_requests_total', { stream: 'true' })).toBe(1);
    expect(await rig.metric('waybill_config_reloads_total', { result: 'ok' })).toBe(1);
    // Readiness and the upstream gauges describe the configuration in force.
    const text2 = await rig.metricsText();
    expect(text2).toContain('waybill_upstream_up{upstream="sim-1"} 1');
    expect(text2).not.toContain('upstream_up{upstream="sim-0"}');
    const ready = await request(`${rig.base}/readyz`);
    expect(ready.statusCode).toBe(200);
    expect(JSON.stringify(await ready.body.json())).toContain('sim-1');
  });

  it('rotates a key: the old key is refused after the reload, the new one served, a stream under the old key completes', async () => {
    const rig = await startRig({ auth: { keys: [{ tenant: 'team-a', key_sha256: sha('old-key') }] } });
    const old = { authorization: 'Bearer old-key' };
    const rotated = { authorization: 'Bearer new-key' };
    expect((await chat(rig.base, {}, rotated)).status).toBe(401);
    const stream = await startStream(rig.base, old);
    expect(stream.status).toBe(200);

    const result = await rig.gateway.reload(rig.config({ auth: { keys: [{ tenant: 'team-a', key_sha256: sha('new-key') }] } }));
    expect(result.result).toBe('ok');

    expect((await chat(rig.base, {}, old)).status).toBe(401);
    expect((await chat(rig.base, {}, rotated)).status).toBe(200);
    const data = eventData(await stream.rest());
    expect(data.at(-1)).toBe('[DONE]');
    await until(() => rig.settlements.length === 4);
    expect(rig.settlements.find((s) => s.stream)).toMatchObject({ tenant: 'team-a', outcome: 'delivered', code: 200 });
  });

  it('reports a changed hash and declares the series of new tenants', async () => {
    const rig = await startRig();
    const hashOf = async () => /waybill_config_hash\{hash="([0-9a-f]{12})"\} 1/.exec(await rig.metricsText())?.[1];
    const first = await hashOf();
    expect(first).toBe(rig.gateway.configHash);
    await rig.gateway.reload(rig.config({ slo: { ttft: '750ms' } }));
    const second = await hashOf();
    expect(second).toBe(rig.gateway.configHash);
    expect(second).not.toBe(first);
    // One series only: the old hash is gone.
    expect((await rig.metricsText()).match(/^waybill_config_hash\{/gm)).toHaveLength(1);
    expect(rig.gateway.config.slo.defaults.ttftMs).toBe(750);

    // A tenant the reload adds has its series from the reload on.
    await rig.gateway.reload(rig.config({ slo: { ttft: '750ms' }, tenants: { 'team-z': {} } }));
    expect(await rig.metricsText()).toContain('waybill_slo_requests_total{model="sim-model",tenant="team-z"');
    const third = await hashOf();
    expect(third).not.toBe(second);

    // The same configuration again: applied, the same hash.
    await rig.gateway.reload(rig.config({ slo: { ttft: '750ms' }, tenants: { 'team-z': {} } }));
    expect(await hashOf()).toBe(third);
    expect(await rig.metric('waybill_config_reloads_total', { result: 'ok' })).toBe(3);
  });

  it('refuses a change only a restart applies, naming the keys, and keeps serving the configuration in force', async () => {
    const rig = await startRig();
    const hash = rig.gateway.configHash;
    const result = await rig.gateway.reload(rig.config({ server: { host: '127.0.0.1', port: 1 }, upstream: 1 }));
    expect(result).toMatchObject({ result: 'restart_required', keys: ['server.port'] });
    expect(rig.gateway.configHash).toBe(hash);
    expect(await rig.metric('waybill_config_reloads_total', { result: 'restart_required' })).toBe(1);
    expect(await rig.metric('waybill_config_reloads_total', { result: 'ok' })).toBe(0);
    // The upstream change was not applied either: the reload is whole or nothing.
    expect((await chat(rig.base, {})).status).toBe(200);
    expect(rig.sims[0]?.stats().byRoute.chat_completions).toBe(1);
    expect(rig.sims[1]?.stats().byRoute.chat_completions).toBe(0);
  });

  it('an invalid configuration never reaches the gateway: parsing throws every problem, the caller counts it invalid (the CLI test sends SIGHUP end to end)', async () => {
    const rig = await startRig();
    let problems: readonly string[] = [];
    try {
      rig.config({ pools: [], retries: { backoff_base: '10s', backoff_max: '1s' } });
    } catch (err) {
      expect(err).toBeInstanceOf(ConfigError);
      problems = (err as ConfigError).problems;
    }
    expect(problems.length).toBeGreaterThan(0);
    rig.gateway.metrics.configReloaded('invalid');
    expect(await rig.metric('waybill_config_reloads_total', { result: 'invalid' })).toBe(1);
    expect((await chat(rig.base, {})).status).toBe(200);
  });
});
