/**
 * Issue 22 item 7: without server.admin_port, /metrics and the status page (which name tenants and other tenants'
 * failed request ids) are served on the API port; where client keys exist only a key with `admin: true` reads them.
 * Real gateways on port 0, real sockets.
 */
import { createHash } from 'node:crypto';
import { Writable } from 'node:stream';
import type { AddressInfo } from 'node:net';
import { pino } from 'pino';
import { request } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.js';
import type { ConfigInput } from '../src/config/schema.js';
import { createGateway, type Gateway } from '../src/app/gateway.js';
import { createSimulator, type Simulator } from '../src/sim/server.js';

const sha = (key: string) => createHash('sha256').update(key).digest('hex');
const CLIENT = 'sk-client-a';
const ADMIN = 'sk-ops-admin';
const KEYS = [
  { tenant: 'acme', key_sha256: sha(CLIENT) },
  { tenant: 'ops', key_sha256: sha(ADMIN), admin: true },
];
const OPS_PATHS = ['/metrics', '/status.json', '/status'];

let gateways: Gateway[] = [];
let sims: Simulator[] = [];
afterEach(async () => {
  await Promise.all(gateways.map((g) => g.close()));
  await Promise.all(sims.map((s) => s.close()));
  gateways = [];
  sims = [];
});

async function start(extra: Partial<ConfigInput>): Promise<{ base: string; gateway: Gateway; logs: string[] }> {
  const sim = createSimulator({ ttftMs: 1, itlMs: 1, outputTokens: 2, jitter: 0 });
  const { url } = await sim.listen(0, '127.0.0.1');
  sims.push(sim);
  const { server, ...rest } = extra;
  const config = parseConfig(
    {
      server: { host: '127.0.0.1', port: 0, ...server },
      pools: [{ name: 'sim', models: ['sim-model'], upstreams: [{ name: 'sim-0', url }] }],
      logging: { level: 'silent' },
      ...rest,
    },
    'test',
  );
  const logs: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _encoding, callback) {
      logs.push(chunk.toString('utf8'));
      callback();
    },
  });
  const gateway = createGateway(config, { logger: pino({ level: 'warn' }, sink), defaultMetrics: false });
  gateways.push(gateway);
  await gateway.listen();
  const { port } = gateway.app.server.address() as AddressInfo;
  return { base: `http://127.0.0.1:${port}`, gateway, logs };
}

async function get(url: string, headers: Record<string, string> = {}): Promise<{ status: number; headers: Record<string, unknown>; body: string }> {
  const response = await request(url, { headers });
  return { status: response.statusCode, headers: response.headers, body: await response.body.text() };
}

const basic = (user: string, password: string) => `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`;

describe('operational endpoints on the API port with client keys', () => {
  it('refuses an anonymous scrape 401, a client key 403, and serves an admin key', async () => {
    const { base } = await start({ auth: { keys: KEYS } });
    for (const path of OPS_PATHS) {
      const anonymous = await get(`${base}${path}`);
      expect(anonymous.status, path).toBe(401);
      expect((JSON.parse(anonymous.body) as { error: { code: string } }).error.code).toBe('invalid_api_key');
      expect(String(anonymous.headers['www-authenticate'])).toMatch(/Basic/);
      expect(anonymous.body).not.toContain('acme');

      const unknown = await get(`${base}${path}`, { authorization: 'Bearer sk-nobody' });
      expect(unknown.status, path).toBe(401);

      const client = await get(`${base}${path}`, { authorization: `Bearer ${CLIENT}` });
      expect(client.status, path).toBe(403);
      expect((JSON.parse(client.body) as { error: { code: string } }).error.code).toBe('admin_required');
      expect(client.body).not.toContain('acme');

      for (const headers of [{ authorization: `Bearer ${ADMIN}` }, { 'x-api-key': ADMIN }, { authorization: basic('me', ADMIN) }]) {
        expect((await get(`${base}${path}`, headers)).status, `${path} ${JSON.stringify(headers)}`).toBe(200);
      }
    }
    const metrics = await get(`${base}/metrics`, { authorization: `Bearer ${ADMIN}` });
    expect(metrics.body).toContain('waybill_');
    // The page's live feed (a snapshot a second, the same tenants and failed ids): refused alike, open to an admin key.
    // A served feed never ends: its body is read only when refused.
    const feed = async (headers: Record<string, string>) => {
      const response = await request(`${base}/status/events`, { headers });
      const served = response.statusCode === 200;
      if (served) response.body.destroy();
      return { status: response.statusCode, type: String(response.headers['content-type']), body: served ? '' : await response.body.text() };
    };
    expect((await feed({})).status).toBe(401);
    const clientFeed = await feed({ authorization: `Bearer ${CLIENT}` });
    expect(clientFeed.status).toBe(403);
    expect(clientFeed.body).toContain('admin_required');
    const adminFeed = await feed({ authorization: `Bearer ${ADMIN}` });
    expect(adminFeed.status).toBe(200);
    expect(adminFeed.type).toMatch(/^text\/event-stream/);
    for (const path of ['/healthz', '/readyz']) expect((await get(`${base}${path}`)).status, path).toBe(200);
  });

  it('keeps everything open without keys (the quick start)', async () => {
    const { base } = await start({});
    for (const path of [...OPS_PATHS, '/healthz', '/readyz']) expect((await get(`${base}${path}`)).status, path).toBe(200);
  });

  it('with server.admin_port: the API port answers 404 as before and the admin port is open', async () => {
    const { base, gateway } = await start({ server: { admin_port: 0 }, auth: { keys: KEYS } });
    const adminUrl = gateway.adminUrl as string;
    expect(adminUrl).toBeDefined();
    for (const path of ['/metrics', '/status.json']) {
      expect((await get(`${base}${path}`, { authorization: `Bearer ${ADMIN}` })).status, path).toBe(404);
      expect((await get(`${adminUrl}${path}`)).status, path).toBe(200);
    }
  });

  it('warns at start-up when keys exist, no admin port and no admin key', async () => {
    const warning = /refused to every client.*admin: true.*server\.admin_port|server\.admin_port.*admin: true/;
    const without = await start({ auth: { keys: [KEYS[0] as (typeof KEYS)[number]] } });
    expect(without.logs.some((line) => warning.test(line))).toBe(true);
    expect((await get(`${without.base}/metrics`, { authorization: `Bearer ${CLIENT}` })).status).toBe(403);
    const withAdmin = await start({ auth: { keys: KEYS } });
    expect(withAdmin.logs.some((line) => warning.test(line))).toBe(false);
  });
});
