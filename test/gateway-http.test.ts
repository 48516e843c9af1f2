/**
 * The HTTP surface: non-stream requests, legacy completions, bad input, and the operational endpoints.
 */
import { readFileSync } from 'node:fs';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CHAT, post, startStack, withoutCreated, type Stack } from './helpers/stack.js';

let s: Stack;
let settledSoFar = 0;
beforeAll(async () => {
  s = await startStack();
});
afterAll(async () => {
  await s.close();
});

/** Waits for the next `n` logical requests to settle and returns them. */
async function nextSettled(n = 1) {
  const all = await s.settled(settledSoFar + n);
  const fresh = all.slice(settledSoFar, settledSoFar + n);
  settledSoFar += n;
  return fresh;
}

function simUrl(): string {
  return s.gateway.upstreams.upstreams[0]?.url.origin ?? '';
}

function expectOpenAIError(body: string, code: string, param: string | null = null) {
  const parsed = JSON.parse(body) as { error: Record<string, unknown> };
  expect(Object.keys(parsed.error).sort()).toEqual(['code', 'message', 'param', 'type']);
  expect(parsed.error['code']).toBe(code);
  expect(parsed.error['param']).toBe(param);
  expect(typeof parsed.error['message']).toBe('string');
}

describe('non-stream requests', () => {
  it('returns the upstream body unchanged and counts it delivered', async () => {
    const before = await s.metric('waybill_requests_total', { stream: 'false', outcome: 'delivered' });
    const upstream = await post(simUrl(), '/v1/chat/completions', CHAT, { 'x-request-id': 'ns-1' });
    const client = await post(s.base, '/v1/chat/completions', CHAT, { 'x-request-id': 'ns-1' });
    expect(client.status).toBe(200);
    expect(client.headers['x-request-id']).toBe('ns-1');
    expect(withoutCreated(client.body)).toBe(withoutCreated(upstream.body));
    const [settlement] = await nextSettled();
    expect(settlement).toMatchObject({ outcome: 'delivered', stream: false, ttftMs: undefined, finishReasons: ['stop'], slo: 'met' });
    expect(await s.metric('waybill_requests_total', { stream: 'false', outcome: 'delivered' })).toBe(before + 1);
  });

  it('serves legacy completions with a list of prompts: n × prompts choices', async () => {
    const body = { model: 'sim-model', prompt: ['a', 'b'], n: 2, stream: true };
    const client = await post(s.base, '/v1/completions', body);
    expect(client.status).toBe(200);
    expect(client.body.endsWith('data: [DONE]\n\n')).toBe(true);
    const [settlement] = await nextSettled();
    expect(settlement).toMatchObject({ route: 'completions', outcome: 'delivered', finishReasons: ['stop', 'stop', 'stop', 'stop'] });
  });

  it('passes an upstream 4xx through for non-stream requests', async () => {
    const client = await post(s.base, '/v1/chat/completions', CHAT, { 'x-sim-fault': 'status=400' });
    expect(client.status).toBe(400);
    expect(JSON.parse(client.body)).toMatchObject({ error: { code: 400 } });
    const [settlement] = await nextSettled();
    expect(settlement).toMatchObject({ outcome: 'rejected', code: 400, stream: false });
  });
});

describe('bad input gets an OpenAI-shaped error and is counted', () => {
  it('rejects invalid JSON with 400', async () => {
    const client = await post(s.base, '/v1/chat/completions', '{"model":');
    expect(client.status).toBe(400);
    expectOpenAIError(client.body, 'invalid_json');
    const [settlement] = await nextSettled();
    expect(settlement).toMatchObject({ outcome: 'rejected', code: 400, model: '_other', attempts: [] });
  });

  it('rejects a non-JSON content type with 415', async () => {
    const response = await request(`${s.base}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'text/plain' }, body: 'hi' });
    expect(response.statusCode).toBe(415);
    expectOpenAIError(await response.body.text(), 'unsupported_media_type');
    const [settlement] = await nextSettled();
    expect(settlement).toMatchObject({ outcome: 'rejected', code: 415 });
  });

  it('rejects a missing model with 400 and an unknown one with 404', async () => {
    const missing = await post(s.base, '/v1/chat/completions', { messages: [] });
    expect(missing.status).toBe(400);
    expectOpenAIError(missing.body, 'invalid_request', 'model');
    const unknown = await post(s.base, '/v1/chat/completions', { ...CHAT, model: 'gpt-9', stream: true });
    expect(unknown.status).toBe(404);
    expectOpenAIError(unknown.body, 'model_not_found', 'model');
    const [first, second] = await nextSettled(2);
    expect(first).toMatchObject({ code: 400, model: '_other' });
    expect(second).toMatchObject({ code: 404, model: '_other', stream: true, slo: 'excluded' });
    expect(await s.metric('waybill_requests_total', { model: '_other', code: '404', outcome: 'rejected', stream: 'true' })).toBe(1);
  });

  it('rejects bad stream and n values with 400 naming the field', async () => {
    const stream = await post(s.base, '/v1/chat/completions', { ...CHAT, stream: 'yes' });
    expectOpenAIError(stream.body, 'invalid_request', 'stream');
    const n = await post(s.base, '/v1/chat/completions', { ...CHAT, n: 0 });
    expectOpenAIError(n.body, 'invalid_request', 'n');
    // The body named a served model, so the rejection is counted under it, not under _other.
    const [first, second] = await nextSettled(2);
    expect(first).toMatchObject({ model: 'sim-model', code: 400, outcome: 'rejected' });
    expect(second).toMatchObject({ model: 'sim-model', code: 400, outcome: 'rejected' });
  });

  it('rejects a body over the limit with 413', async () => {
    const big = JSON.stringify({ ...CHAT, messages: [{ role: 'user', content: 'x'.repeat(17 * 1024 * 1024) }] });
    const client = await post(s.base, '/v1/chat/completions', big);
    expect(client.status).toBe(413);
    expectOpenAIError(client.body, 'body_too_large');
    const [settlement] = await nextSettled();
    expect(settlement).toMatchObject({ outcome: 'rejected', code: 413 });
  });

  it('answers unknown routes with an OpenAI-shaped 404, counted once under route="_other"', async () => {
    const labels = { model: '_other', route: '_other', stream: 'false', code: '404', outcome: 'rejected' };
    const before = await s.metric('waybill_requests_total', labels);
    const response = await request(`${s.base}/v1/no-such-route`, { method: 'POST', body: '{}', headers: { 'content-type': 'application/json' } });
    expect(response.statusCode).toBe(404);
    expectOpenAIError(await response.body.text(), 'not_found');
    expect(await s.metric('waybill_requests_total', labels)).toBe(before + 1);
  });
});

describe('operational endpoints', () => {
  it('lists the served models', async () => {
    const response = await request(`${s.base}/v1/models`);
    const body = (await response.body.json()) as { object: string; data: Array<{ id: string; object: string }> };
    expect(body.object).toBe('list');
    expect(body.data.map((m) => [m.id, m.object])).toEqual([['sim-model', 'model']]);
  });

  it('reports alive and ready', async () => {
    expect((await request(`${s.base}/healthz`)).statusCode).toBe(200);
    const ready = await request(`${s.base}/readyz`);
    expect(ready.statusCode).toBe(200);
    expect(await ready.body.json()).toMatchObject({ status: 'ready', pools: [{ name: 'sim', upstreams: [{ name: 'sim-0', healthy: true }] }] });
  });

  it('serves Prometheus text', async () => {
    const response = await request(`${s.base}/metrics`);
    expect(response.headers['content-type']).toMatch(/^text\/plain; version=0\.0\.4/);
    const text = await response.body.text();
    expect(text).toContain('# TYPE waybill_requests_total counter');
    // Created at zero at start-up for each served model, before any such request.
    // Per upstream of the model's pool (the replica slice), under its revision, so rate() sees each replica's first
    // request too.
    expect(text).toMatch(/waybill_slo_requests_total\{model="sim-model",tenant="_anonymous",prompt_len="64k\+",result="met",upstream="sim-0",revision="[^"]+"\} 0/);
    const { version } = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string };
    expect(text).toContain(`waybill_build_info{version="${version}",revision="unknown"} 1`);
  });

  it('observes each streamed attempt\'s first output per upstream', async () => {
    const before = await s.metric('waybill_upstream_first_output_seconds_count', { upstream: 'sim-0' });
    await post(s.base, '/v1/chat/completions', { ...CHAT, stream: true });
    await post(s.base, '/v1/chat/completions', CHAT);
    // The stream's attempt is observed; the non-stream one is not.
    expect(await s.metric('waybill_upstream_first_output_seconds_count', { upstream: 'sim-0' })).toBe(before + 1);
  });

  it('keeps a safe client request id and replaces an unsafe one', async () => {
    const kept = await post(s.base, '/v1/chat/completions', CHAT, { 'x-request-id': 'abc.DEF_1:2-3' });
    expect(kept.headers['x-request-id']).toBe('abc.DEF_1:2-3');
    const replaced = await post(s.base, '/v1/chat/completions', CHAT, { 'x-request-id': 'has space' });
    expect(replaced.headers['x-request-id']).toMatch(/^[0-9a-f-]{36}$/);
    const seen = s.sims[0]?.stats().recent.slice(-2).map((r) => r.headers['x-request-id']);
    expect(seen).toEqual(['abc.DEF_1:2-3', replaced.headers['x-request-id']]);
    await nextSettled(2);
  });
});

describe('readiness follows the upstreams', () => {
  it('is not ready when no upstream of a pool passes its health check', async () => {
    const dead = await startStack({ config: { health: { interval: '50ms' } } });
    try {
      dead.sims[0]?.setEngineDead(true);
      const upstream = dead.gateway.upstreams.upstreams[0];
      for (let i = 0; i < 100 && upstream?.healthy !== false; i++) await new Promise((r) => setTimeout(r, 20));
      const ready = await request(`${dead.base}/readyz`);
      expect(ready.statusCode).toBe(503);
      expect(await ready.body.json()).toMatchObject({ status: 'not_ready' });
    } finally {
      await dead.close();
    }
  });

  it('discovers models from the upstreams when none are configured', async () => {
    const open = await startStack({ sim: { models: ['alpha', 'beta'] }, discover: true });
    try {
      const response = await request(`${open.base}/v1/models`);
      const body = (await response.body.json()) as { data: Array<{ id: string }> };
      expect(body.data.map((m) => m.id)).toEqual(['alpha', 'beta']);
      const client = await post(open.base, '/v1/chat/completions', { ...CHAT, model: 'beta' });
      expect(client.status).toBe(200);
    } finally {
      await open.close();
    }
  });
});
