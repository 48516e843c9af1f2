/**
 * Client SDK retries (issue 22, item 13): every HTTP request stays one logical request, and the ones the SDK sent as
 * its own retries (`x-stainless-retry-count` ≥ 1) are counted in waybill_client_retries_total{model,route} and named
 * in the request's log line, so user calls = requests − client retries. Over real sockets, with the official SDKs.
 */
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { clientRetryOf } from '../src/http/client-retry.js';
import { requestLogLine } from '../src/telemetry/request-log.js';
import { useCleanups } from './helpers/cleanups.js';
import { startScripted } from './helpers/scripted.js';
import { post, startStack, type Stack } from './helpers/stack.js';

const cleanups = useCleanups();

/** A gateway whose one upstream answers every generation request 503 (Waybill itself does not retry: 1 attempt). */
async function failing(): Promise<{ stack: Stack; hits: () => number }> {
  const upstream = await startScripted((_req, res) => {
    res.writeHead(503, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ error: { message: 'busy', type: 'ServiceUnavailable', param: null, code: 503 } }));
  });
  cleanups.push(() => upstream.close());
  const stack = await startStack({
    sims: 0,
    extraUpstreams: [{ name: 'scripted', url: upstream.url }],
    config: { health: { interval: '1h', eject_after_failures: 1000 }, retries: { max_attempts: 1 } },
  });
  cleanups.push(() => stack.close());
  return { stack, hits: upstream.requests };
}

describe('x-stainless-retry-count', () => {
  it('is read as a small non-negative integer; anything else is ignored', () => {
    expect(clientRetryOf({ 'x-stainless-retry-count': '0' })).toBe(0);
    expect(clientRetryOf({ 'x-stainless-retry-count': '2' })).toBe(2);
    expect(clientRetryOf({ 'x-stainless-retry-count': '100' })).toBe(100);
    for (const bad of ['', '-1', '1.5', '+1', ' 1', '1e2', '101', '999', 'abc', '0x1']) expect(clientRetryOf({ 'x-stainless-retry-count': bad }), bad).toBeUndefined();
    expect(clientRetryOf({ 'x-stainless-retry-count': ['1', '2'] })).toBeUndefined();
    expect(clientRetryOf({})).toBeUndefined();
  });

  it("the openai SDK's default retries against a failing upstream: 3 requests, 2 client retries, 1 user call", async () => {
    const { stack, hits } = await failing();
    // SDK defaults (maxRetries 2), but the shortest timeout keeps the test bounded should something hang.
    const client = new OpenAI({ baseURL: `${stack.base}/v1`, apiKey: 'unused', timeout: 20_000 });
    await expect(client.chat.completions.create({ model: 'sim-model', messages: [{ role: 'user', content: 'hi' }], stream: true })).rejects.toMatchObject({ status: 502 });
    const settled = await stack.settled(3);
    expect(hits()).toBe(3);
    expect(settled.map((s) => s.clientRetry)).toEqual([0, 1, 2]);
    const labels = { model: 'sim-model', route: 'chat_completions' };
    expect(await stack.metric('waybill_requests_total', labels)).toBe(3);
    expect(await stack.metric('waybill_client_retries_total', labels)).toBe(2);
    // The log line names each one's retry count.
    expect(settled.map((s) => requestLogLine(s, 'r', undefined).client_retry)).toEqual([0, 1, 2]);
  });

  it('the Anthropic SDK sends it too: its retries on /v1/messages are counted on route messages', async () => {
    const { stack, hits } = await failing();
    const client = new Anthropic({ baseURL: stack.base, apiKey: 'unused', maxRetries: 1, timeout: 20_000 });
    await expect(client.messages.create({ model: 'sim-model', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] })).rejects.toMatchObject({ status: 502 });
    await stack.settled(2);
    expect(hits()).toBe(2);
    expect(await stack.metric('waybill_requests_total', { model: 'sim-model', route: 'messages' })).toBe(2);
    expect(await stack.metric('waybill_client_retries_total', { model: 'sim-model', route: 'messages' })).toBe(1);
  });

  it("requests Waybill refuses itself count their client's retries too; values not believed count none", async () => {
    const { stack } = await failing();
    // A body Waybill refuses (400) before any upstream: answered by the gateway.
    await post(stack.base, '/v1/chat/completions', { model: 'sim-model' }, { 'x-stainless-retry-count': '1' });
    for (const bad of ['abc', '-1', '1000']) await post(stack.base, '/v1/chat/completions', { model: 'sim-model' }, { 'x-stainless-retry-count': bad });
    const settled = await stack.settled(4);
    expect(settled.map((s) => s.clientRetry)).toEqual([1, undefined, undefined, undefined]);
    expect(await stack.metric('waybill_client_retries_total', { model: 'sim-model', route: 'chat_completions' })).toBe(1);
    expect(await stack.metric('waybill_requests_total', { model: 'sim-model', route: 'chat_completions', code: '400' })).toBe(4);
  });
});
