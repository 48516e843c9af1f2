/**
 * Stored responses belong to the tenant that created them (docs/security.md "tenant model for stored responses"),
 * their lookups are limited, counted and cached, and a continuation goes where its response lives — over real
 * sockets: gateways in front of two simulated vLLMs that keep a Responses store (VLLM_ENABLE_RESPONSES_API_STORE=1),
 * or in front of two scripted upstreams where a lookup must be held open. A second gateway in front of the same
 * simulators stands for another replica, or this one after a restart: it remembers nothing.
 */
import { createHash } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { pino } from 'pino';
import { request } from 'undici';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.js';
import type { ConfigInput } from '../src/config/schema.js';
import { ResponseOwners } from '../src/proxy/response-owners.js';
import { createGateway, type Gateway } from '../src/app/gateway.js';
import type { Simulator } from '../src/sim/server.js';
import { useCleanups } from './helpers/cleanups.js';
import { startScripted } from './helpers/scripted.js';
import { ADMIN_HEADERS, adminKey, metricValue, post, startStack, type Stack } from './helpers/stack.js';

const cleanups = useCleanups();

const SECRET_ENV = 'WAYBILL_TEST_RESPONSE_ID_SECRET';
const SECRET = 'test secret shared by every replica';
process.env[SECRET_ENV] = SECRET;

const sha = (key: string) => createHash('sha256').update(key).digest('hex');
const A = { authorization: 'Bearer key-a' };
const C = { authorization: 'Bearer key-c' };
const TENANTS = {
  auth: { keys: [{ tenant: 'team-a', key_sha256: sha('key-a') }, { tenant: 'team-c', key_sha256: sha('key-c') }, adminKey('team-a')] },
  responses: { id_secret_env: SECRET_ENV },
};
const MODEL = 'sim-model';

/** An id of `tenant`'s that no upstream holds (store off, or evicted): minted as the gateways mint, same secret. */
const ownedId = (tenant: string) => new ResponseOwners({ secret: SECRET, capacity: 0, unownedUsable: false }).mint(tenant);

async function twoSims(config: Partial<ConfigInput> = {}): Promise<Stack> {
  const stack = await startStack({
    sims: 2,
    sim: { responsesStore: true, ttftMs: 1, itlMs: 1, jitter: 0, outputTokens: 4, prefillMsPer1kTokens: 0 },
    config: { health: { interval: '1h' }, retries: { max_attempts: 1 }, ...TENANTS, ...config },
  });
  cleanups.push(() => stack.close());
  return stack;
}

/** Another gateway in front of the same upstreams, remembering nothing (another replica, or a restart). */
async function replica(stack: Stack): Promise<{ gateway: Gateway; base: string; metric: (name: string, labels?: Record<string, string>) => Promise<number> }> {
  const upstreams = stack.gateway.upstreams.upstreams.map((u) => ({ name: u.name, url: u.url.origin }));
  const config = parseConfig({
    server: { host: '127.0.0.1', port: 0 },
    pools: [{ name: 'sim', models: [MODEL], upstreams }],
    logging: { level: 'silent' },
    health: { interval: '1h' },
    retries: { max_attempts: 1 },
    ...TENANTS,
  });
  const gateway = createGateway(config, { logger: pino({ level: 'silent' }), defaultMetrics: false });
  await gateway.listen();
  cleanups.push(() => gateway.close());
  const base = `http://127.0.0.1:${(gateway.app.server.address() as AddressInfo).port}`;
  return { gateway, base, metric: async (name, labels = {}) => metricValue(await (await request(`${base}/metrics`, { headers: ADMIN_HEADERS })).body.text(), name, labels) };
}

async function get(url: string, headers: Record<string, string>): Promise<{ status: number; body: string }> {
  const response = await request(url, { headers });
  return { status: response.statusCode, body: await response.body.text() };
}

async function cancel(url: string, headers: Record<string, string>): Promise<{ status: number; body: string }> {
  const response = await request(url, { method: 'POST', headers });
  return { status: response.statusCode, body: await response.body.text() };
}

/** Requests each simulator saw on `route` (health checks are off). */
const seen = (stack: Stack, route: keyof ReturnType<Simulator['stats']>['byRoute']): number[] => stack.sims.map((sim: Simulator) => sim.stats().byRoute[route]);
const total = (counts: number[]) => counts.reduce((a, b) => a + b, 0);

/** vLLM's 404 for an id its store does not hold, as the gateway answers it. */
const notFound = (id: string) => ({ error: { message: `Response with id '${id}' not found.`, type: 'invalid_request_error', param: 'response_id', code: 'not_found' } });

describe('stored responses belong to the tenant that created them', () => {
  it("another tenant cannot read, cancel or continue a response: the same 404 as an unknown id, and no upstream is asked", async () => {
    const stack = await twoSims();
    const created = await post(stack.base, '/v1/responses', { model: MODEL, input: 'secret plans', background: true }, C);
    expect(created.status).toBe(200);
    const id = (JSON.parse(created.body) as { id: string }).id;
    const before = { retrieve: total(seen(stack, 'responses_retrieve')), cancel: total(seen(stack, 'responses_cancel')), responses: total(seen(stack, 'responses')) };

    const read = await get(`${stack.base}/v1/responses/${id}`, A);
    expect(read.status).toBe(404);
    expect(JSON.parse(read.body)).toEqual(notFound(id));
    // An id nobody holds, of the same shape: answered alike.
    const unknown = ownedId('team-c');
    const readUnknown = await get(`${stack.base}/v1/responses/${unknown}`, A);
    expect(readUnknown.status).toBe(404);
    expect(JSON.parse(readUnknown.body)).toEqual(notFound(unknown));

    const cancelled = await cancel(`${stack.base}/v1/responses/${id}/cancel`, A);
    expect(cancelled.status).toBe(404);
    expect(JSON.parse(cancelled.body)).toEqual(notFound(id));
    const continued = await post(stack.base, '/v1/responses', { model: MODEL, input: 'and then?', previous_response_id: id }, A);
    expect(continued.status).toBe(404);
    expect(JSON.parse(continued.body)).toEqual(notFound(id));
    const replay = await get(`${stack.base}/v1/responses/${id}?stream=true`, A);
    expect(replay.status).toBe(404);

    // Nothing reached an upstream: no lookup to time, nothing cancelled, nothing continued.
    expect(total(seen(stack, 'responses_retrieve'))).toBe(before.retrieve);
    expect(total(seen(stack, 'responses_cancel'))).toBe(before.cancel);
    expect(total(seen(stack, 'responses'))).toBe(before.responses);
    await stack.settled(6);
    expect(await stack.metric('waybill_requests_total', { tenant: 'team-a', code: '404', outcome: 'rejected' })).toBe(5);

    // Its owner still can, and its response was left alone. (Its id is Waybill's, bound to team C.)
    expect(id).toMatch(/^resp_w1-[0-9a-f]{32}-[0-9a-f]{32}$/);
    const own = await get(`${stack.base}/v1/responses/${id}`, C);
    expect(own.status).toBe(200);
    expect(JSON.parse(own.body)).toMatchObject({ id });
    expect((JSON.parse(own.body) as { status: string }).status).not.toBe('cancelled');
  });

  it("a client-chosen request_id is its tenant's from admission: another tenant's request racing a stream still in flight is refused", async () => {
    const stack = await twoSims();
    // C's stream under its own id stalls before any output: in flight, no answer relayed yet.
    const controller = new AbortController();
    const live = request(`${stack.base}/v1/responses`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sim-fault': 'stall_after=0', ...C },
      body: JSON.stringify({ model: MODEL, input: 'mine', stream: true, request_id: 'team-c-live' }),
      signal: controller.signal,
    }).catch(() => undefined);
    // Polled, bounded (5 s): there is no event to await for a request entering the gateway.
    const deadline = performance.now() + 5_000;
    while ((await stack.metric('waybill_inflight_requests')) < 1) {
      if (performance.now() > deadline) throw new Error('the stream was not in flight after 5 s');
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    const racing = await post(stack.base, '/v1/responses', { model: MODEL, input: 'overwritten', request_id: 'team-c-live' }, A);
    expect(racing.status).toBe(400);
    expect(JSON.parse(racing.body)).toMatchObject({ error: { code: 'invalid_request', param: 'request_id' } });
    controller.abort();
    await live;
  });

  it("a client-chosen request_id that is another tenant's stored response is refused; the response is not overwritten", async () => {
    const stack = await twoSims();
    const mine = await post(stack.base, '/v1/responses', { model: MODEL, input: 'original', request_id: 'team-c-report' }, C);
    expect(mine.status).toBe(200);
    const minted = (JSON.parse((await post(stack.base, '/v1/responses', { model: MODEL, input: 'original' }, C)).body) as { id: string }).id;
    const posted = total(seen(stack, 'responses'));

    for (const taken of ['team-c-report', minted]) {
      const overwrite = await post(stack.base, '/v1/responses', { model: MODEL, input: 'overwritten', request_id: taken }, A);
      expect(overwrite.status).toBe(400);
      expect(JSON.parse(overwrite.body)).toMatchObject({ error: { code: 'invalid_request', param: 'request_id' } });
    }
    // A Waybill-shaped id that is nobody's (a forged tag) is refused too: only the gateway mints them.
    const forged = `resp_w1-${'0'.repeat(32)}-${'1'.repeat(32)}`;
    expect((await post(stack.base, '/v1/responses', { model: MODEL, input: 'x', request_id: forged }, A)).status).toBe(400);
    expect(total(seen(stack, 'responses'))).toBe(posted);

    // The owner reads its own, unchanged; it may reuse its own id (vLLM replaces the stored response).
    const read = await get(`${stack.base}/v1/responses/team-c-report`, C);
    expect(read.status).toBe(200);
    expect(read.body).not.toContain('overwritten');
    expect((await get(`${stack.base}/v1/responses/team-c-report`, A)).status).toBe(404);
    expect((await post(stack.base, '/v1/responses', { model: MODEL, input: 'again', request_id: 'team-c-report' }, C)).status).toBe(200);
    // A fresh id of the client's own choosing is fine.
    expect((await post(stack.base, '/v1/responses', { model: MODEL, input: 'mine', request_id: 'team-a-report' }, A)).status).toBe(200);
  });

  it('across replicas and restarts: the binding is checked from the id itself, by any gateway with the same secret', async () => {
    const stack = await twoSims();
    const created = await post(stack.base, '/v1/responses', { model: MODEL, input: 'kept' }, C);
    const id = (JSON.parse(created.body) as { id: string }).id;
    await post(stack.base, '/v1/responses', { model: MODEL, input: 'chosen', request_id: 'team-c-chosen' }, C);
    const other = await replica(stack);
    const retrieves = total(seen(stack, 'responses_retrieve'));

    // Another tenant: 404 with no lookup, although this replica knows nothing of the id.
    const foreign = await get(`${other.base}/v1/responses/${id}`, A);
    expect(foreign.status).toBe(404);
    expect(JSON.parse(foreign.body)).toEqual(notFound(id));
    expect(total(seen(stack, 'responses_retrieve'))).toBe(retrieves);
    // Its owner: found by asking both upstreams (two lookup GETs, counted), then read at its home.
    const own = await get(`${other.base}/v1/responses/${id}`, C);
    expect(own.status).toBe(200);
    expect(JSON.parse(own.body)).toMatchObject({ id, status: 'completed' });
    expect(total(seen(stack, 'responses_retrieve'))).toBe(retrieves + 3);
    expect(await other.metric('waybill_upstream_attempts_total', { model: '_lookup' })).toBe(2);
    // A client-chosen id's owner is remembered by the replica that relayed it only: elsewhere nobody may use it.
    expect((await get(`${other.base}/v1/responses/team-c-chosen`, C)).status).toBe(404);
    expect((await get(`${other.base}/v1/responses/team-c-chosen`, A)).status).toBe(404);
    expect((await get(`${stack.base}/v1/responses/team-c-chosen`, C)).status).toBe(200);
  });
});

describe('lookups of unknown ids are authorised, limited per tenant, counted and cached', () => {
  it("the tenant's limits admit a lookup before it is sent; each lookup GET is an attempt; a miss is cached", async () => {
    const stack = await twoSims({
      tenants: { 'team-a': { limits: { requests_per_minute: 2 } } },
      responses: { id_secret_env: SECRET_ENV, negative_cache_ttl: '1m' },
    });
    const gone = ownedId('team-a');
    const miss = await get(`${stack.base}/v1/responses/${gone}`, A);
    expect(miss.status).toBe(404);
    expect(JSON.parse(miss.body)).toEqual(notFound(gone));
    expect(seen(stack, 'responses_retrieve')).toEqual([1, 1]);
    await stack.settled(1);
    expect(await stack.metric('waybill_upstream_attempts_total', { model: '_lookup' })).toBe(2);
    expect(await stack.metric('waybill_upstream_attempts_total', { model: '_lookup', result: 'http_4xx' })).toBe(2);

    // Asked again within negative_cache_ttl: the same 404, nobody asked.
    expect((await get(`${stack.base}/v1/responses/${gone}`, A)).status).toBe(404);
    expect(seen(stack, 'responses_retrieve')).toEqual([1, 1]);
    // A junk id (not the tenant's) is no lookup either, refused before the limits (like any request the gateway refuses).
    expect((await get(`${stack.base}/v1/responses/resp_0123456789abcdef`, A)).status).toBe(404);
    expect(seen(stack, 'responses_retrieve')).toEqual([1, 1]);

    // The third admitted request of the minute is refused before any lookup.
    const limited = await get(`${stack.base}/v1/responses/${ownedId('team-a')}`, A);
    expect(limited.status).toBe(429);
    expect(JSON.parse(limited.body)).toMatchObject({ error: { code: 'rate_limited', type: 'rate_limit_error' } });
    expect(seen(stack, 'responses_retrieve')).toEqual([1, 1]);
    await stack.settled(4);
    expect(await stack.metric('waybill_upstream_attempts_total', { model: '_lookup' })).toBe(2);
    expect(await stack.metric('waybill_requests_total', { tenant: 'team-a', route: 'responses_retrieve', code: '429' })).toBe(1);
    expect(await stack.metric('waybill_rate_limited_total', { tenant: 'team-a', limit: 'requests' })).toBe(1);
  });

  it("one tenant's slow lookups are capped on their own: another tenant's real lookup still goes through", async () => {
    const held: Array<() => void> = [];
    const realId = ownedId('team-c');
    let lookupsSeen = 0;
    let onLookup = () => {};
    const upstream = (name: string) =>
      startScripted((req: IncomingMessage, res: ServerResponse) => {
        const id = decodeURIComponent(/^\/v1\/responses\/([^/?]+)/.exec(req.url ?? '')?.[1] ?? '');
        const answer = () => {
          if (id === realId && name === 'b') {
            res.writeHead(200, { 'content-type': 'application/json' });
            res.end(JSON.stringify({ id, object: 'response', model: MODEL, status: 'completed', output: [], usage: null }));
            return;
          }
          res.writeHead(404, { 'content-type': 'application/json' });
          res.end(JSON.stringify({ error: { message: `Response with id '${id}' not found.`, type: 'invalid_request_error', param: 'response_id', code: 404 } }));
        };
        if (id === realId) answer();
        else {
          // Team A's lookups hang until the test lets them go.
          held.push(answer);
          lookupsSeen++;
          onLookup();
        }
      });
    const a = await upstream('a');
    const b = await upstream('b');
    cleanups.push(() => a.close(), () => b.close());
    const stack = await startStack({
      sims: 0,
      extraUpstreams: [
        { name: 'a', url: a.url },
        { name: 'b', url: b.url },
      ],
      config: { health: { interval: '1h' }, retries: { max_attempts: 1 }, ...TENANTS, responses: { id_secret_env: SECRET_ENV, max_lookups_per_tenant: 4, lookup_timeout: '10s' } },
    });
    cleanups.push(() => stack.close());

    // 32 of team A's own ids no upstream answers yet: the gateway-wide cap of 32 lookups once.
    const slow = Array.from({ length: 32 }, () => get(`${stack.base}/v1/responses/${ownedId('team-a')}`, A));
    // Its first 4 lookups are in flight (2 GETs each); the other 28 requests are refused at once, in API shape.
    await new Promise<void>((resolve) => {
      onLookup = () => lookupsSeen >= 8 && resolve();
      onLookup();
    });
    const settled = await stack.settled(28);
    expect(settled.filter((s) => s.code === 429)).toHaveLength(28);

    const real = await get(`${stack.base}/v1/responses/${realId}`, C);
    expect(real.status).toBe(200);
    expect(JSON.parse(real.body)).toMatchObject({ id: realId });

    for (const release of held.splice(0)) release();
    const answers = await Promise.all(slow);
    expect(answers.filter((r) => r.status === 404)).toHaveLength(4);
    const refused = answers.filter((r) => r.status === 429);
    expect(refused).toHaveLength(28);
    expect(JSON.parse(refused[0]?.body ?? '{}')).toMatchObject({ error: { code: 'rate_limited', type: 'rate_limit_error', param: null } });
    expect(lookupsSeen).toBe(8);
    await stack.settled(33);
    expect(await stack.metric('waybill_upstream_attempts_total', { model: '_lookup' })).toBe(8 + 2);
  }, 10_000);
});

describe('a continuation (previous_response_id) goes where its response lives', () => {
  it('20 of 20 continuations succeed with two upstreams; a response that is gone is vLLM\'s 404, counted', async () => {
    const stack = await twoSims();
    const ids: string[] = [];
    for (let i = 0; i < 20; i++) {
      const created = await post(stack.base, '/v1/responses', { model: MODEL, input: `turn one of ${i}` }, C);
      expect(created.status).toBe(200);
      ids.push((JSON.parse(created.body) as { id: string }).id);
    }
    const continued = await Promise.all(ids.map((id) => post(stack.base, '/v1/responses', { model: MODEL, input: 'turn two', previous_response_id: id }, C)));
    expect(continued.map((r) => r.status)).toEqual(ids.map(() => 200));
    for (const [i, r] of continued.entries()) expect(JSON.parse(r.body)).toMatchObject({ previous_response_id: ids[i] });
    // Each went to its home, remembered: no lookup anywhere, and no simulator answered one 404.
    expect(total(seen(stack, 'responses_retrieve'))).toBe(0);
    expect(stack.sims.flatMap((sim) => sim.stats().recent.filter((r) => r.route === 'responses' && r.status !== 200))).toEqual([]);

    // Another replica knows no home: it finds each by a lookup, then sends the continuation there.
    const other = await replica(stack);
    const again = await Promise.all(ids.slice(0, 5).map((id) => post(other.base, '/v1/responses', { model: MODEL, input: 'turn three', previous_response_id: id }, C)));
    expect(again.map((r) => r.status)).toEqual([200, 200, 200, 200, 200]);

    // The tenant's own id that no upstream holds: vLLM's answer, without sending the request anywhere.
    const posted = total(seen(stack, 'responses'));
    const gone = ownedId('team-c');
    const lost = await post(stack.base, '/v1/responses', { model: MODEL, input: 'turn two', previous_response_id: gone }, C);
    expect(lost.status).toBe(404);
    expect(JSON.parse(lost.body)).toEqual(notFound(gone));
    expect(total(seen(stack, 'responses'))).toBe(posted);
    await stack.settled(41);
    expect(await stack.metric('waybill_requests_total', { route: 'responses', code: '404', outcome: 'rejected' })).toBe(1);
    expect(await stack.metric('waybill_requests_total', { route: 'responses', code: '200', outcome: 'delivered' })).toBe(40);
  });
});
