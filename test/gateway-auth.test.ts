/**
 * Client keys and tenants over real sockets (docs/security.md): a key names its tenant, read from
 * `Authorization: Bearer`, `x-api-key` or `api-key`, never forwarded; a missing or wrong key is a 401 counted under
 * `tenant="_unauthenticated"` before any body is read; a tenant's model list is enforced; every per-request counter
 * carries the tenant. The official SDKs send their keys as they always do.
 */
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { connect } from 'node:net';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { request } from 'undici';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.js';
import { createAuthenticator, presentedKey } from '../src/http/auth.js';
import { useCleanups } from './helpers/cleanups.js';
import { ADMIN_HEADERS, CHAT, post, startStack, type Stack } from './helpers/stack.js';

const cleanups = useCleanups();

const KEY_A = 'wb-team-a-0123456789';
const KEY_B = 'wb-team-b-9876543210';
const sha = (key: string) => createHash('sha256').update(key).digest('hex');

async function gateway(auth: Record<string, unknown>, tenants: Record<string, unknown> = {}): Promise<Stack> {
  const stack = await startStack({ config: { auth, tenants, retries: { max_attempts: 1 } } as never });
  cleanups.push(() => stack.close());
  return stack;
}

const KEYS = {
  keys: [
    { tenant: 'team-a', key_sha256: sha(KEY_A) },
    { tenant: 'team-b', key_sha256: sha(KEY_B).toUpperCase() },
  ],
};

describe('client keys', () => {
  it('without keys every client is served as _anonymous, whatever key it sends', async () => {
    const stack = await gateway({});
    expect((await post(stack.base, '/v1/chat/completions', CHAT, { authorization: 'Bearer anything' })).status).toBe(200);
    expect((await post(stack.base, '/v1/chat/completions', CHAT)).status).toBe(200);
    await stack.settled(2);
    expect(await stack.metric('waybill_requests_total', { tenant: '_anonymous', outcome: 'delivered' })).toBe(2);
  });

  it('a missing or wrong key is 401 invalid_api_key, counted under _unauthenticated, and never reaches an upstream', async () => {
    const stack = await gateway(KEYS);
    const missing = await post(stack.base, '/v1/chat/completions', CHAT);
    expect(missing.status).toBe(401);
    expect(missing.headers['www-authenticate']).toBe('Bearer');
    expect(JSON.parse(missing.body)).toMatchObject({ error: { code: 'invalid_api_key', type: 'invalid_request_error' } });
    const wrong = await post(stack.base, '/v1/chat/completions', CHAT, { authorization: `Bearer ${KEY_A}x` });
    expect(wrong.status).toBe(401);
    // On /v1/messages the refusal is Anthropic-shaped.
    const messages = await post(stack.base, '/v1/messages', { model: 'sim-model', max_tokens: 8, messages: [] }, { 'x-api-key': 'nope' });
    expect(messages.status).toBe(401);
    expect(JSON.parse(messages.body)).toMatchObject({ type: 'error', error: { type: 'authentication_error' } });
    await stack.settled(3);
    expect(await stack.metric('waybill_requests_total', { tenant: '_unauthenticated', code: '401', outcome: 'rejected' })).toBe(3);
    expect(await stack.metric('waybill_requests_total', { tenant: '_unauthenticated', route: 'chat_completions' })).toBe(2);
    expect(stack.sims[0]?.stats().byRoute).toMatchObject({ chat_completions: 0, messages: 0 });
  });

  it('Bearer, x-api-key and api-key each name the key’s tenant; the key is not sent upstream', async () => {
    const stack = await gateway(KEYS);
    expect((await post(stack.base, '/v1/chat/completions', CHAT, { authorization: `bearer  ${KEY_A}` })).status).toBe(200);
    expect((await post(stack.base, '/v1/chat/completions', CHAT, { 'x-api-key': KEY_B })).status).toBe(200);
    expect((await post(stack.base, '/v1/chat/completions', CHAT, { 'api-key': KEY_B })).status).toBe(200);
    const settled = await stack.settled(3);
    expect(settled.map((s) => s.tenant)).toEqual(['team-a', 'team-b', 'team-b']);
    expect(await stack.metric('waybill_requests_total', { tenant: 'team-a', outcome: 'delivered' })).toBe(1);
    expect(await stack.metric('waybill_requests_total', { tenant: 'team-b', outcome: 'delivered' })).toBe(2);
    expect(await stack.metric('waybill_completion_tokens_total', { tenant: 'team-b' })).toBe(16);
    expect(await stack.metric('waybill_slo_requests_total', { tenant: 'team-a' })).toBe(1);
    // The simulator records only whether an Authorization header came: none did.
    const ended = stack.simEnded();
    await post(stack.base, '/v1/chat/completions', CHAT, { authorization: `Bearer ${KEY_A}` });
    const record = await ended;
    expect(record).toMatchObject({ headers: {} });
    expect(record.headers).not.toHaveProperty('authorization');
  });

  it('the official SDKs authenticate as they are: openai with Bearer, Anthropic with x-api-key', async () => {
    const stack = await gateway(KEYS);
    const openai = new OpenAI({ baseURL: `${stack.base}/v1`, apiKey: KEY_A, maxRetries: 0 });
    await openai.chat.completions.create({ model: 'sim-model', messages: [{ role: 'user', content: 'Hi' }] });
    const anthropic = new Anthropic({ baseURL: stack.base, apiKey: KEY_B, maxRetries: 0 });
    await anthropic.messages.create({ model: 'sim-model', max_tokens: 8, messages: [{ role: 'user', content: 'Hi' }] });
    await expect(new OpenAI({ baseURL: `${stack.base}/v1`, apiKey: 'wrong', maxRetries: 0 }).models.list()).rejects.toMatchObject({ status: 401 });
    const settled = await stack.settled(3);
    expect(settled.map((s) => [s.route, s.tenant])).toEqual([
      ['chat_completions', 'team-a'],
      ['messages', 'team-b'],
      ['_other', '_unauthenticated'],
    ]);
  });

  it('a client that closes mid-body after its 401 is counted once, and the gateway lives on', async () => {
    const stack = await gateway(KEYS);
    const { port } = new URL(stack.base);
    const socket = connect(Number(port), '127.0.0.1');
    await once(socket, 'connect');
    socket.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{');
    const [head] = (await once(socket, 'data')) as [Buffer];
    expect(head.toString()).toMatch(/^HTTP\/1.1 401/);
    socket.end();
    await once(socket, 'close');
    expect((await request(`${stack.base}/healthz`)).statusCode).toBe(200);
    await stack.settled(1);
    expect(await stack.metric('waybill_requests_total')).toBe(1);
    expect(await stack.metric('waybill_requests_total', { tenant: '_unauthenticated', code: '401' })).toBe(1);
  });

  it('probes and unknown paths need no key, /metrics an admin key (test/admin-key.test.ts); a 404 is not a 401', async () => {
    const stack = await gateway(KEYS);
    expect((await request(`${stack.base}/healthz`)).statusCode).toBe(200);
    expect((await request(`${stack.base}/metrics`)).statusCode).toBe(401);
    expect((await request(`${stack.base}/metrics`, { headers: ADMIN_HEADERS })).statusCode).toBe(200);
    const unknown = await post(stack.base, '/v1/nowhere', {});
    expect(unknown.status).toBe(404);
    await stack.settled(1);
    expect(await stack.metric('waybill_requests_total', { route: '_other', tenant: '_unauthenticated', code: '404' })).toBe(1);
  });

  it('with auth.required false a request without a key is _anonymous, and a wrong key is still refused', async () => {
    const stack = await gateway({ ...KEYS, required: false });
    expect((await post(stack.base, '/v1/chat/completions', CHAT)).status).toBe(200);
    expect((await post(stack.base, '/v1/chat/completions', CHAT, { authorization: 'Bearer wrong' })).status).toBe(401);
    const settled = await stack.settled(2);
    expect(settled.map((s) => s.tenant)).toEqual(['_anonymous', '_unauthenticated']);
  });
});

describe('tenants', () => {
  it('a tenant uses only its models: 403 model_not_allowed otherwise, and /v1/models lists only those', async () => {
    const stack = await gateway(KEYS, { 'team-a': { models: ['sim-model'] }, 'team-b': { models: [] } });
    expect((await post(stack.base, '/v1/chat/completions', CHAT, { authorization: `Bearer ${KEY_A}` })).status).toBe(200);
    const refused = await post(stack.base, '/v1/chat/completions', CHAT, { authorization: `Bearer ${KEY_B}` });
    expect(refused.status).toBe(403);
    expect(JSON.parse(refused.body)).toMatchObject({ error: { code: 'model_not_allowed', type: 'permission_error', param: 'model' } });
    const listA = await request(`${stack.base}/v1/models`, { headers: { authorization: `Bearer ${KEY_A}` } });
    expect(((await listA.body.json()) as { data: Array<{ id: string }> }).data.map((m) => m.id)).toEqual(['sim-model']);
    const listB = await request(`${stack.base}/v1/models`, { headers: { authorization: `Bearer ${KEY_B}` } });
    expect(((await listB.body.json()) as { data: unknown[] }).data).toEqual([]);
    await stack.settled(2);
    expect(await stack.metric('waybill_requests_total', { tenant: 'team-b', model: 'sim-model', code: '403', outcome: 'rejected' })).toBe(1);
  });

  it('series the ratios divide by exist from the start for every tenant that may be served', async () => {
    const stack = await gateway(KEYS);
    const text = await stack.metricsText();
    for (const tenant of ['team-a', 'team-b']) {
      expect(text).toContain(`waybill_requests_total{model="sim-model",tenant="${tenant}",route="chat_completions",stream="true",code="200",outcome="delivered"} 0`);
    }
    expect(text).not.toContain('tenant="_anonymous",route="chat_completions",stream="true",code="200"');
  });
});

describe('configuration and key reading', () => {
  const pools = [{ name: 'p', models: ['m'], upstreams: [{ url: 'http://127.0.0.1:1' }] }];

  it('reads keys from the environment, and reports every problem at once', () => {
    const config = parseConfig({ pools, auth: { keys: [{ tenant: 't', key_env: 'WB_KEY' }] } }, 'test', { WB_KEY: 'secret' });
    expect(config.auth).toMatchObject({ required: true, keys: [{ tenant: 't', sha256: sha('secret') }], servedTenants: ['t'] });
    expect(() =>
      parseConfig(
        {
          pools,
          auth: { keys: [{ tenant: 't', key_env: 'UNSET_KEY' }, { tenant: 'u', key_sha256: sha('x') }, { tenant: 'v', key_sha256: sha('x') }] },
          tenants: { t: { models: ['nope'] } },
        },
        'test',
        {},
      ),
    ).toThrow(/UNSET_KEY is not set[\s\S]*configured twice[\s\S]*tenants\.t\.models/);
    expect(() => parseConfig({ pools, auth: { keys: [{ tenant: '_anonymous', key_sha256: sha('x') }] } })).toThrow(/tenant/);
    expect(() => parseConfig({ pools, auth: { required: true } })).toThrow(/auth\.required/);
    expect(() => parseConfig({ pools, auth: { keys: [{ tenant: 't', key_sha256: sha('x'), key_env: 'K' }] } })).toThrow(/exactly one/);
  });

  it('takes the first of Authorization, x-api-key, api-key; a non-Bearer Authorization is no key', () => {
    expect(presentedKey({ authorization: 'Bearer a', 'x-api-key': 'b' })).toBe('a');
    expect(presentedKey({ 'x-api-key': 'b', 'api-key': 'c' })).toBe('b');
    expect(presentedKey({ 'api-key': 'c' })).toBe('c');
    expect(presentedKey({ authorization: 'Basic Zm9vOmJhcg==' })).toBe('');
    expect(presentedKey({ authorization: 'Basic Zm9vOmJhcg==', 'x-api-key': 'b' })).toBe('b');
    expect(presentedKey({})).toBeUndefined();
    const authenticate = createAuthenticator({ keys: [{ tenant: 't', sha256: sha('k'), admin: false }], required: true });
    expect(authenticate({ authorization: 'Basic k' })).toMatchObject({ ok: false, tenant: '_unauthenticated' });
    expect(authenticate({ authorization: 'BEARER k' })).toEqual({ ok: true, tenant: 't' });
  });
});
