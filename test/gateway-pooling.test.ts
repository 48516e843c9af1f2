/**
 * vLLM's non-generation routes through the gateway, over real sockets: embeddings, pooling, classify, score,
 * rerank, tokenize and detokenize against the simulator (success, each failure shape, cancellation), the official
 * openai SDK's embeddings call, and a scripted upstream for the shapes the simulator is not asked to produce
 * (raw tensor bytes with their metadata header, a retried 503, an unknown route's FastAPI 404).
 */
import OpenAI from 'openai';
import { request } from 'undici';
import { describe, expect, it } from 'vitest';
import type { Settlement } from '../src/accounting/ledger.js';
import { useCleanups } from './helpers/cleanups.js';
import { startScriptedFor, type Handler } from './helpers/scripted.js';
import { post, startStack, type Stack } from './helpers/stack.js';

const cleanups = useCleanups();

async function simStack(config: Record<string, unknown> = {}): Promise<Stack> {
  const stack = await startStack({ config });
  cleanups.push(() => stack.close());
  return stack;
}

/** Sends one request and returns the client's view and the gateway's settlement of it. */
async function send(stack: Stack, path: string, body: unknown, headers: Record<string, string> = {}) {
  const count = stack.settlements.length + 1;
  const result = await post(stack.base, path, body, headers);
  const settlement = (await stack.settled(count))[count - 1] as Settlement;
  return { result, json: parseOrUndefined(result.body), settlement };
}

function parseOrUndefined(text: string): Record<string, unknown> | undefined {
  try {
    return JSON.parse(text) as Record<string, unknown>;
  } catch {
    return undefined;
  }
}

const ROUTES: Array<[path: string, route: string, body: Record<string, unknown>]> = [
  ['/v1/embeddings', 'embeddings', { model: 'sim-model', input: ['hello world', 'waybill'] }],
  ['/pooling', 'pooling', { model: 'sim-model', input: 'hello world' }],
  ['/classify', 'classify', { model: 'sim-model', input: ['good', 'bad'] }],
  ['/score', 'score', { model: 'sim-model', text_1: 'what is a waybill', text_2: ['a document', 'a fish'] }],
  ['/v1/score', 'score', { model: 'sim-model', text_1: 'what is a waybill', text_2: 'a document' }],
  ['/rerank', 'rerank', { model: 'sim-model', query: 'waybill', documents: ['a document', 'a fish', 'a ship'], top_n: 2 }],
  ['/v1/rerank', 'rerank', { model: 'sim-model', query: 'waybill', documents: ['a', 'b'] }],
  ['/v2/rerank', 'rerank', { model: 'sim-model', query: 'waybill', documents: ['a', 'b'] }],
  ['/tokenize', 'tokenize', { model: 'sim-model', prompt: 'hello world' }],
  ['/detokenize', 'detokenize', { model: 'sim-model', tokens: [1, 2, 3] }],
];

describe('every pooling route against the simulator', () => {
  it.each(ROUTES)('%s: delivered under route="%s", the body relayed unchanged, counted once', async (path, route, body) => {
    const stack = await simStack();
    const { result, json, settlement } = await send(stack, path, body);
    expect(result.status).toBe(200);
    expect(json).toBeDefined();
    expect(settlement).toMatchObject({ route, outcome: 'delivered', code: 200, stream: false, accepted: true, finishReasons: [], checks: [] });
    expect(settlement.attempts.map((a) => a.result)).toEqual(['ok']);
    const usage = json?.['usage'] as { prompt_tokens?: number } | undefined;
    if (route === 'tokenize' || route === 'detokenize') {
      expect(usage).toBeUndefined();
      expect(settlement.usage).toBeUndefined();
    } else {
      expect(settlement.usage?.promptTokens).toBe(usage?.prompt_tokens);
      expect(await stack.metric('waybill_prompt_tokens_total', { model: 'sim-model' })).toBe(usage?.prompt_tokens);
    }
    expect(await stack.metric('waybill_requests_total', { model: 'sim-model', route, code: '200', outcome: 'delivered', stream: 'false' })).toBe(1);
    expect(await stack.metric('waybill_requests_total', { route })).toBe(1);
    expect(await stack.metric('waybill_usage_missing_total')).toBe(0);
    expect(await stack.metric('waybill_output_checks_total')).toBe(0);
    expect(await stack.metric('waybill_requests_accepted_total', { route })).toBe(1);
  });

  it('an unknown model is 404 model_not_found from the gateway, never sent upstream', async () => {
    const stack = await simStack();
    const { result, settlement } = await send(stack, '/v1/embeddings', { model: 'nope', input: 'x' });
    expect(result.status).toBe(404);
    expect(JSON.parse(result.body)).toMatchObject({ error: { code: 'model_not_found', param: 'model' } });
    expect(settlement).toMatchObject({ route: 'embeddings', outcome: 'rejected', model: '_other', attempts: [] });
  });

  it('model left out: the one served model is used, as vLLM would', async () => {
    const stack = await simStack();
    const { result, settlement } = await send(stack, '/tokenize', { prompt: 'hello' });
    expect(result.status).toBe(200);
    expect(settlement).toMatchObject({ model: 'sim-model', route: 'tokenize', outcome: 'delivered' });
  });

  it("the upstream's validation error is relayed with its status and counted as rejected", async () => {
    const stack = await simStack();
    const { result, settlement } = await send(stack, '/v1/embeddings', { model: 'sim-model' });
    expect(result.status).toBe(400);
    expect(settlement).toMatchObject({ route: 'embeddings', outcome: 'rejected', code: 400 });
    expect(settlement.attempts.map((a) => a.result)).toEqual(['http_4xx']);
  });

  it('an upstream 500 is a failure, retried on another upstream when retry_on_500 is set', async () => {
    const stack = await startStack({ sims: 2, config: { retries: { retry_on_500: true, max_attempts: 2 }, health: { eject_after_failures: 100 } } });
    cleanups.push(() => stack.close());
    const { result, settlement } = await send(stack, '/v1/embeddings', { model: 'sim-model', input: 'x' }, { 'x-sim-fault': 'status=500' });
    // The fault header travels to every attempt: both fail, and the client gets the gateway's 502.
    expect(settlement.attempts.map((a) => a.result)).toEqual(['http_5xx', 'http_5xx']);
    expect(result.status).toBe(502);
    expect(settlement).toMatchObject({ route: 'embeddings', outcome: 'failed' });
  });
});

describe('cancellation', () => {
  it('a client that leaves a slow pooling request is counted once as client_cancelled, and the upstream is told', async () => {
    const stack = await simStack();
    const ended = stack.simEnded();
    const started = new Promise((resolve) => stack.sims[0]?.events.once('request-start', resolve));
    const controller = new AbortController();
    const pending = request(`${stack.base}/v1/embeddings`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sim-fault': 'stall_after=0' },
      body: JSON.stringify({ model: 'sim-model', input: 'x' }),
      signal: controller.signal,
    });
    // Abort once the simulator holds the request, not after a guessed delay.
    await started;
    controller.abort();
    await expect(pending).rejects.toThrow();
    const [settlement] = await stack.settled(1);
    expect(settlement).toMatchObject({ route: 'embeddings', outcome: 'client_cancelled', code: 499 });
    expect((await ended).end).toBe('client_disconnect');
  });
});

describe('the official openai SDK', () => {
  it('embeddings.create (base64 by default) decodes what the gateway relayed', async () => {
    const stack = await simStack();
    const client = new OpenAI({ baseURL: `${stack.base}/v1`, apiKey: 'unused', maxRetries: 0 });
    const response = await client.embeddings.create({ model: 'sim-model', input: ['hello', 'waybill'] });
    expect(response.data).toHaveLength(2);
    for (const item of response.data) {
      expect(Array.isArray(item.embedding)).toBe(true);
      expect(item.embedding.length).toBeGreaterThan(0);
      expect(item.embedding.every((v) => Number.isFinite(v))).toBe(true);
    }
    const [settlement] = await stack.settled(1);
    expect(settlement).toMatchObject({ route: 'embeddings', outcome: 'delivered' });
    // The same vectors as a float request: base64 is only an encoding.
    const floats = await client.embeddings.create({ model: 'sim-model', input: ['hello', 'waybill'], encoding_format: 'float' });
    expect(floats.data.map((d) => d.embedding.map((v) => Math.fround(v)))).toEqual(response.data.map((d) => d.embedding));
  });

  it('raises on a failure, with the status the gateway answered', async () => {
    const stack = await simStack();
    const client = new OpenAI({ baseURL: `${stack.base}/v1`, apiKey: 'unused', maxRetries: 0 });
    await expect(client.embeddings.create({ model: 'nope', input: 'x' })).rejects.toMatchObject({ status: 404 });
  });
});

describe('shapes from a scripted upstream', () => {
  async function scriptedStack(handler: Handler, config: Record<string, unknown> = {}): Promise<Stack> {
    const upstream = await startScriptedFor(cleanups, handler);
    const stack = await startStack({ sims: 0, extraUpstreams: [{ name: 'scripted', url: upstream.url }], config: { health: { interval: '1h' }, ...config } });
    cleanups.push(() => stack.close());
    return stack;
  }

  it('raw tensor bytes: delivered byte for byte, with the metadata header relayed, and no usage counted', async () => {
    const bytes = Buffer.from(new Float32Array([0.5, -1, 2]).buffer);
    const metadata = JSON.stringify({
      id: 'embd-1',
      created: 1,
      model: 'sim-model',
      data: [{ index: 0, embed_dtype: 'float32', endianness: 'little', start: 0, end: 12, shape: [3] }],
      usage: { prompt_tokens: 3, total_tokens: 3 },
    });
    const stack = await scriptedStack((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/octet-stream', metadata });
      res.end(bytes);
    });
    const response = await request(`${stack.base}/v1/embeddings`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'sim-model', input: 'abc', encoding_format: 'bytes' }),
    });
    expect(response.statusCode).toBe(200);
    expect(response.headers['content-type']).toBe('application/octet-stream');
    expect(response.headers['metadata']).toBe(metadata);
    expect(Buffer.from(await response.body.arrayBuffer()).equals(bytes)).toBe(true);
    const [settlement] = await stack.settled(1);
    expect(settlement).toMatchObject({ route: 'embeddings', outcome: 'delivered', usage: undefined });
    expect(await stack.metric('waybill_usage_missing_total')).toBe(1);
  });

  it("a route the model does not offer: FastAPI's 404 relayed as a rejection, not a gateway 404", async () => {
    const stack = await scriptedStack((_req, res) => {
      res.writeHead(404, { 'content-type': 'application/json' });
      res.end('{"detail":"Not Found"}');
    });
    const { result, settlement } = await send(stack, '/rerank', { model: 'sim-model', query: 'q', documents: ['d'] });
    expect(result.status).toBe(404);
    expect(settlement).toMatchObject({ route: 'rerank', outcome: 'rejected', code: 404 });
    expect(settlement.attempts.map((a) => a.result)).toEqual(['http_4xx']);
  });

  it('a 503 before any byte is retried and the second answer delivered; counted as one request of two attempts', async () => {
    let calls = 0;
    const stack = await scriptedStack((_req, res) => {
      calls++;
      if (calls === 1) {
        res.writeHead(503, { 'content-type': 'application/json' });
        res.end('{"error":{"message":"busy","type":"ServiceUnavailable","param":null,"code":503}}');
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"id":"score-1","object":"list","created":1,"model":"sim-model","data":[{"index":0,"object":"score","score":0.5}],"usage":{"prompt_tokens":7,"total_tokens":7,"completion_tokens":0,"prompt_tokens_details":null}}');
    });
    const { result, settlement } = await send(stack, '/score', { model: 'sim-model', text_1: 'a', text_2: 'b' });
    expect(result.status).toBe(200);
    expect(settlement.attempts.map((a) => a.result)).toEqual(['http_5xx', 'ok']);
    expect(settlement).toMatchObject({ outcome: 'delivered', usage: { promptTokens: 7 } });
    expect(await stack.metric('waybill_requests_total', { route: 'score' })).toBe(1);
  });

  it('a 200 that is not JSON is a protocol failure (502), not a delivery', async () => {
    const stack = await scriptedStack((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/html' });
      res.end('<html>login</html>');
    });
    const { result, settlement } = await send(stack, '/classify', { model: 'sim-model', input: 'x' });
    expect(result.status).toBe(502);
    expect(settlement).toMatchObject({ route: 'classify', outcome: 'failed' });
  });

  it('several models served and none named: 400, never a guess', async () => {
    const upstream = await startScriptedFor(cleanups, (_req, res) => res.end('{}'));
    const stack = await startStack({
      sims: 0,
      config: {
        health: { interval: '1h' },
        pools: [
          { name: 'a', models: ['m1'], upstreams: [{ url: upstream.url }] },
          { name: 'b', models: ['m2'], upstreams: [{ url: upstream.url, name: 'b0' }] },
        ],
      },
    });
    cleanups.push(() => stack.close());
    const { result } = await send(stack, '/tokenize', { prompt: 'x' });
    expect(result.status).toBe(400);
    expect(JSON.parse(result.body)).toMatchObject({ error: { code: 'invalid_request', param: 'model' } });
    expect(upstream.requests()).toBe(0);
  });
});
