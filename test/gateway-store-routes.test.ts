/**
 * The routes that read or act on what one vLLM process holds — `GET /v1/responses/{id}` (stream or not) and its
 * `/cancel` — plus `/v1/messages/count_tokens` and the operator's pass-through allow-list, over real sockets against
 * two scripted upstreams that keep a response store of their own, as vLLM does with
 * VLLM_ENABLE_RESPONSES_API_STORE=1 (docs/routes.md): each request must reach the process holding the response.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { request } from 'undici';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.js';
import { useCleanups } from './helpers/cleanups.js';
import { startScripted, type Scripted } from './helpers/scripted.js';
import { settledAfter } from './helpers/settle.js';
import { eventData, post, startStack, type Stack } from './helpers/stack.js';

const cleanups = useCleanups();

const SSE = { 'content-type': 'text/event-stream; charset=utf-8' };
const JSON_TYPE = { 'content-type': 'application/json' };
const named = (type: string, data: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ ...data, type })}\n\n`;

function stored(id: string, status: string): Record<string, unknown> {
  return {
    id,
    object: 'response',
    model: 'sim-model',
    status,
    output: status === 'queued' ? [] : [{ id: 'm1', type: 'message', role: 'assistant', status: 'completed', content: [{ type: 'output_text', text: 'Hi', annotations: [] }] }],
    usage: status === 'queued' ? null : { input_tokens: 7, input_tokens_details: { cached_tokens: 0 }, output_tokens: 2, total_tokens: 9 },
  };
}

/** A replayed background stream: output events, then response.completed unless `hang`. */
function replay(id: string, hang: boolean): string {
  let text =
    named('response.output_item.added', { item: { id: 'm1', type: 'message', role: 'assistant', status: 'in_progress', content: [] }, output_index: 0, sequence_number: 4 }) +
    named('response.output_text.delta', { content_index: 0, delta: 'Hi', item_id: 'm1', output_index: 0, sequence_number: 5 });
  if (!hang) text += named('response.completed', { response: stored(id, 'completed'), sequence_number: 6 });
  return text;
}

const gone = new Set<string>();
const slow = (() => {
  let seen = () => {};
  let release = () => {};
  const state = {
    seenOnce: new Promise<void>((resolve) => (seen = resolve)),
    released: new Promise<void>((resolve) => (release = resolve)),
    seen: () => seen(),
    release: () => release(),
  };
  return state;
})();

interface Seen {
  method: string;
  url: string;
}

/** An upstream holding the responses whose ids end in its own name (`resp_a`, `resp_hang_a`…). */
async function storeUpstream(name: string, seen: Seen[]): Promise<Scripted> {
  const upstream = await startScripted((req: IncomingMessage, res: ServerResponse) => {
    const url = req.url ?? '';
    seen.push({ method: req.method ?? '', url });
    const path = url.split('?')[0] ?? '';
    const match = /^\/v1\/responses\/([^/]+)(\/cancel)?$/.exec(path);
    if (req.method === 'POST' && path === '/v1/responses') {
      // A background request: answered at once with the queued response, held by this upstream.
      res.writeHead(200, JSON_TYPE);
      res.end(JSON.stringify(stored(`resp_${name}`, 'queued')));
      return;
    }
    if (match !== null) {
      const id = decodeURIComponent(match[1] ?? '');
      // Upstream a is failing for these ids: an error, which says nothing about where the response lives.
      if (id.startsWith('resp_err') && name === 'a') {
        res.writeHead(503, JSON_TYPE);
        res.end('{"error":"Service Unavailable"}');
        return;
      }
      // Held until the test releases it: a lookup the client does not wait for.
      if (id.startsWith('resp_slow')) {
        slow.seen();
        void slow.released.then(() => {
          res.writeHead(404, JSON_TYPE);
          res.end('{"error":{"message":"not found","type":"NotFoundError","param":null,"code":404}}');
        });
        return;
      }
      // Answered once, then gone (the process restarted): 404 from then on.
      if (id.startsWith('resp_gone') && id.endsWith(`_${name}`)) {
        const first = !gone.has(id);
        gone.add(id);
        if (!first || url.includes('probe-done')) {
          res.writeHead(404, JSON_TYPE);
          res.end('{"error":{"message":"not found","type":"NotFoundError","param":null,"code":404}}');
          return;
        }
      }
      if (!id.endsWith(`_${name}`)) {
        res.writeHead(404, JSON_TYPE);
        res.end(JSON.stringify({ error: { message: `Response with id '${id}' not found.`, type: 'NotFoundError', param: null, code: 404 } }));
        return;
      }
      if (match[2] !== undefined) {
        if (id.startsWith('resp_done')) {
          res.writeHead(400, JSON_TYPE);
          res.end(JSON.stringify({ error: { message: 'Cannot cancel a synchronous response.', type: 'BadRequestError', param: null, code: 400 } }));
          return;
        }
        res.writeHead(200, JSON_TYPE);
        res.end(JSON.stringify(stored(id, 'cancelled')));
        return;
      }
      if (url.includes('stream=true')) {
        res.writeHead(200, SSE);
        const hang = id.startsWith('resp_hang');
        if (hang) res.write(replay(id, true));
        else res.end(replay(id, false));
        return;
      }
      res.writeHead(200, JSON_TYPE);
      res.end(JSON.stringify(stored(id, 'completed')));
      return;
    }
    if (path === '/v1/messages/count_tokens') {
      res.writeHead(200, JSON_TYPE);
      res.end(JSON.stringify({ input_tokens: 11, context_management: { original_input_tokens: 11 } }));
      return;
    }
    if (path === '/v2/embed' || path === '/version') {
      res.writeHead(200, JSON_TYPE);
      res.end(JSON.stringify({ upstream: name, method: req.method, url }));
      return;
    }
    res.writeHead(404, JSON_TYPE);
    res.end('{"detail":"Not Found"}');
  });
  cleanups.push(() => upstream.close());
  return upstream;
}

interface Store {
  stack: Stack;
  seenA: Seen[];
  seenB: Seen[];
}

async function gateway(config: Record<string, unknown> = {}): Promise<Store> {
  const seenA: Seen[] = [];
  const seenB: Seen[] = [];
  const a = await storeUpstream('a', seenA);
  const b = await storeUpstream('b', seenB);
  const stack = await startStack({
    sims: 0,
    extraUpstreams: [
      { name: 'a', url: a.url },
      { name: 'b', url: b.url },
    ],
    config: { health: { interval: '1h' }, retries: { max_attempts: 1 }, ...config },
  });
  cleanups.push(() => stack.close());
  return { stack, seenA, seenB };
}

async function get(base: string, path: string): Promise<{ status: number; body: string }> {
  const response = await request(`${base}${path}`);
  return { status: response.statusCode, body: await response.body.text() };
}

describe('stored responses: GET /v1/responses/{id} and /cancel', () => {
  it('a background request is an acknowledgement (no choice, nothing to check); its id is then read from the upstream that holds it, and only that one', async () => {
    const { stack, seenA, seenB } = await gateway();
    const created = await post(stack.base, '/v1/responses', { model: 'sim-model', input: 'Hi', background: true });
    expect(created.status).toBe(200);
    const id = (JSON.parse(created.body) as { id: string }).id;
    const home = id.endsWith('_a') ? seenA : seenB;
    const other = home === seenA ? seenB : seenA;
    const s1 = await settledAfter(stack, 1);
    expect(s1).toMatchObject({ route: 'responses', outcome: 'delivered', finishReasons: [], accepted: true, checks: [] });

    const before = other.length;
    const read = await get(stack.base, `/v1/responses/${id}`);
    expect(read.status).toBe(200);
    expect(JSON.parse(read.body)).toMatchObject({ id, status: 'completed' });
    // Remembered from the acknowledgement: straight to its home, no lookup anywhere.
    expect(other.length).toBe(before);
    expect(home.at(-1)).toEqual({ method: 'GET', url: `/v1/responses/${id}` });
    const s2 = await settledAfter(stack, 2);
    expect(s2).toMatchObject({ route: 'responses_retrieve', outcome: 'delivered', code: 200, stream: false, usage: undefined });
    expect(await stack.metric('waybill_requests_total', { route: 'responses_retrieve', stream: 'false', code: '200', outcome: 'delivered' })).toBe(1);
    // The stored usage was generated (and would be counted) by the creating request, never by a read.
    expect(await stack.metric('waybill_prompt_tokens_total')).toBe(0);
    expect(await stack.metric('waybill_usage_missing_total')).toBe(0);
  });

  it('an id this gateway never relayed is asked of every upstream at once; the one that holds it answers', async () => {
    const { stack, seenA, seenB } = await gateway();
    const read = await get(stack.base, '/v1/responses/resp_x_b');
    expect(read.status).toBe(200);
    expect(JSON.parse(read.body)).toMatchObject({ id: 'resp_x_b' });
    // The lookup (one GET each), then the request itself at the holder.
    expect(seenA).toEqual([{ method: 'GET', url: '/v1/responses/resp_x_b' }]);
    expect(seenB).toEqual([
      { method: 'GET', url: '/v1/responses/resp_x_b' },
      { method: 'GET', url: '/v1/responses/resp_x_b' },
    ]);
    // Learned: the next read goes straight there.
    await get(stack.base, '/v1/responses/resp_x_b');
    expect(seenA).toHaveLength(1);
    expect(seenB).toHaveLength(3);
  });

  it('an id no upstream holds is a 404, counted once under its route', async () => {
    const { stack } = await gateway();
    const read = await get(stack.base, '/v1/responses/resp_nobody');
    expect(read.status).toBe(404);
    expect(JSON.parse(read.body)).toMatchObject({ error: { code: 'not_found', param: 'response_id' } });
    const s = await settledAfter(stack, 1);
    expect(s).toMatchObject({ route: 'responses_retrieve', outcome: 'rejected', code: 404 });
    expect(await stack.metric('waybill_requests_total', { route: 'responses_retrieve', code: '404' })).toBe(1);
  });

  it('?stream=true replays with the query passed on; delivered at response.completed, its usage not counted again', async () => {
    const { stack, seenB } = await gateway();
    const read = await get(stack.base, '/v1/responses/resp_s_b?stream=true&starting_after=3');
    expect(read.status).toBe(200);
    expect(seenB.at(-1)).toEqual({ method: 'GET', url: '/v1/responses/resp_s_b?stream=true&starting_after=3' });
    const events = eventData(read.body).map((data) => (JSON.parse(data) as { type: string }).type);
    expect(events).toEqual(['response.output_item.added', 'response.output_text.delta', 'response.completed']);
    const s = await settledAfter(stack, 1);
    expect(s).toMatchObject({ route: 'responses_retrieve', stream: true, outcome: 'delivered', finishReasons: ['stop'], usage: undefined });
    expect(await stack.metric('waybill_completion_tokens_total')).toBe(0);
  });

  it('a replayed background stream that hangs open (its task died) is ended by the idle timeout: an error event the SDKs raise on, counted', async () => {
    const { stack } = await gateway({ timeouts: { idle: '150ms' } });
    const read = await get(stack.base, '/v1/responses/resp_hang_a?stream=true');
    expect(read.status).toBe(200);
    const last = JSON.parse(eventData(read.body).at(-1) ?? '{}') as Record<string, unknown>;
    expect(last).toMatchObject({ type: 'error', error: { code: 'stream_timeout' }, sequence_number: 6 });
    const s = await settledAfter(stack, 1);
    expect(s).toMatchObject({ route: 'responses_retrieve', stream: true, outcome: 'timeout', code: 200 });
  });

  it('/cancel reaches the holder; its refusal is relayed with vLLM message', async () => {
    const { stack, seenA } = await gateway();
    const cancelled = await post(stack.base, '/v1/responses/resp_run_a/cancel', '');
    expect(cancelled.status).toBe(200);
    expect(JSON.parse(cancelled.body)).toMatchObject({ id: 'resp_run_a', status: 'cancelled' });
    expect(seenA.at(-1)).toEqual({ method: 'POST', url: '/v1/responses/resp_run_a/cancel' });
    const refused = await request(`${stack.base}/v1/responses/resp_done_a/cancel`, { method: 'POST' });
    expect(refused.statusCode).toBe(400);
    expect(JSON.parse(await refused.body.text())).toMatchObject({ error: { message: 'Cannot cancel a synchronous response.' } });
    await stack.settled(2);
    expect(await stack.metric('waybill_requests_total', { route: 'responses_cancel', code: '200', outcome: 'delivered' })).toBe(1);
    expect(await stack.metric('waybill_requests_total', { route: 'responses_cancel', code: '400', outcome: 'rejected' })).toBe(1);
  });

  it('an upstream answering an error is no home: the one answering 2xx is, and a home that later answers 404 is forgotten', async () => {
    const { stack, seenA, seenB } = await gateway();
    const read = await get(stack.base, '/v1/responses/resp_err_b');
    expect(read.status).toBe(200);
    expect(seenB.at(-1)).toEqual({ method: 'GET', url: '/v1/responses/resp_err_b' });

    // Found at b by the lookup (which b answers once), then the request itself finds it gone: 404, and forgotten.
    expect((await get(stack.base, '/v1/responses/resp_gone_b')).status).toBe(404);
    const before = seenA.length;
    expect((await get(stack.base, '/v1/responses/resp_gone_b')).status).toBe(404);
    // Asked everywhere again, not sent straight to the old home.
    expect(seenA.length).toBe(before + 1);
    await stack.settled(3);
    expect(await stack.metric('waybill_requests_total', { route: 'responses_retrieve', code: '404' })).toBe(2);
  });

  it('a client that leaves during the lookup is counted once as cancelled and never proxied', async () => {
    const { stack, seenA, seenB } = await gateway({ responses: { lookup_timeout: '300ms' } });
    const controller = new AbortController();
    const pending = request(`${stack.base}/v1/responses/resp_slow_b`, { signal: controller.signal }).catch((error: unknown) => error);
    await slow.seenOnce;
    controller.abort();
    const [settlement] = await stack.settled(1);
    expect(settlement).toMatchObject({ route: 'responses_retrieve', outcome: 'client_cancelled', code: 499 });
    slow.release();
    await pending;
    // Only the lookups (one per upstream) reached the upstreams.
    await new Promise((resolve) => setImmediate(resolve));
    expect([...seenA, ...seenB].filter((s) => s.url === '/v1/responses/resp_slow_b')).toHaveLength(2);
    expect(await stack.metric('waybill_inflight_requests')).toBe(0);
    expect(await stack.metric('waybill_requests_total', { route: 'responses_retrieve' })).toBe(1);
  });

  it('?stream is read as FastAPI reads it: the last value, as a pydantic boolean', async () => {
    const { stack } = await gateway();
    await get(stack.base, '/v1/responses/resp_s_b?stream=yes');
    await get(stack.base, '/v1/responses/resp_s_b?stream=true&stream=false');
    const settled = await stack.settled(2);
    expect(settled.map((s) => s.stream)).toEqual([true, false]);
  });

  it('an id that is not a plain token never reaches an upstream', async () => {
    const { stack, seenA, seenB } = await gateway();
    const read = await get(stack.base, `/v1/responses/${'x'.repeat(300)}`);
    expect(read.status).toBe(404);
    expect(JSON.parse(read.body)).toMatchObject({ error: { code: 'not_found' } });
    const spaced = await get(stack.base, '/v1/responses/resp%20a');
    expect(spaced.status).toBe(404);
    const dots = await get(stack.base, '/v1/responses/..%2E');
    expect(dots.status).toBe(404);
    expect(seenA.length + seenB.length).toBe(0);
    await stack.settled(3);
    expect(await stack.metric('waybill_requests_total', { route: 'responses_retrieve', code: '404', outcome: 'rejected' })).toBe(3);
  });
});

describe('/v1/messages/count_tokens', () => {
  it('is proxied and counted under its own route, with no tokens counted; the gateway answers it in Anthropic shape', async () => {
    const { stack } = await gateway();
    const counted = await post(stack.base, '/v1/messages/count_tokens', { model: 'sim-model', messages: [{ role: 'user', content: 'Hi' }] });
    expect(counted.status).toBe(200);
    expect(JSON.parse(counted.body)).toEqual({ input_tokens: 11, context_management: { original_input_tokens: 11 } });
    expect(await settledAfter(stack, 1)).toMatchObject({ route: 'count_tokens', outcome: 'delivered', usage: undefined });

    const refused = await post(stack.base, '/v1/messages/count_tokens', 'model=sim-model', { 'content-type': 'text/plain' });
    expect(refused.status).toBe(415);
    expect(JSON.parse(refused.body)).toMatchObject({ type: 'error', error: { type: 'invalid_request_error' } });
    await stack.settled(2);
    expect(await stack.metric('waybill_requests_total', { route: 'count_tokens' })).toBe(2);
    expect(await stack.metric('waybill_prompt_tokens_total')).toBe(0);
  });
});

describe('pass-through allow-list', () => {
  it('listed paths and methods are proxied (query included) and counted as passthrough; anything else is 404 _other', async () => {
    const { stack } = await gateway({
      passthrough: {
        paths: [{ path: '/v2/embed' }, { path: '/version', methods: ['GET'] }],
      },
    });
    const embed = await post(stack.base, '/v2/embed', { model: 'sim-model', texts: ['a'] });
    expect(embed.status).toBe(200);
    expect(JSON.parse(embed.body)).toMatchObject({ method: 'POST', url: '/v2/embed' });
    const version = await get(stack.base, '/version?verbose=1');
    expect(version.status).toBe(200);
    expect(JSON.parse(version.body)).toMatchObject({ method: 'GET', url: '/version?verbose=1' });
    const wrongMethod = await get(stack.base, '/v2/embed');
    expect(wrongMethod.status).toBe(404);
    const unlisted = await post(stack.base, '/invocations', { model: 'sim-model' });
    expect(unlisted.status).toBe(404);
    await stack.settled(4);
    expect(await stack.metric('waybill_requests_total', { route: 'passthrough', code: '200', outcome: 'delivered' })).toBe(2);
    expect(await stack.metric('waybill_requests_total', { route: '_other', code: '404' })).toBe(2);
  });

  it('a path Waybill serves itself, or a model nobody serves, is refused at start-up', () => {
    const base = { pools: [{ name: 'p', models: ['m'], upstreams: [{ url: 'http://127.0.0.1:1' }] }] };
    expect(() => parseConfig({ ...base, passthrough: { paths: [{ path: '/v1/responses/x' }] } })).toThrow(/passthrough\.paths\.0\.path/);
    expect(() => parseConfig({ ...base, passthrough: { paths: [{ path: '/v2/embed', model: 'nope' }] } })).toThrow(/passthrough\.paths\.0\.model/);
    expect(() => parseConfig({ ...base, passthrough: { paths: [{ path: '/v2/{id}' }] } })).toThrow(/passthrough/);
  });
});
