import { once } from 'node:events';
import { request as httpRequest } from 'node:http';
import { describe, expect, it } from 'vitest';
import { drawFault, FAULT_KINDS } from '../src/sim/faults.js';
import { createRandom } from '../src/util/prng.js';
import { resolveSimOptions } from '../src/sim/options.js';
import { prefillDelayMs, shapeAnswer } from '../src/sim/plan.js';
import type { GenerationRequest } from '../src/sim/request.js';
import type { RequestRecord, SimOptions } from '../src/sim/server.js';
import { OPERATIONAL_PATHS, ROUTE_NAMES } from '../src/sim/stats.js';
import { choiceText, estimateTokens, tokenText } from '../src/sim/wire.js';
import { sendFresh as send, type Reply } from './helpers/one-request.js';
import { nextEnd } from './helpers/sim-records.js';
import { useSimulators } from './helpers/simulators.js';

// ---- harness ----

const FAST: Partial<SimOptions> = { ttftMs: 2, itlMs: 1, jitter: 0, outputTokens: 4 };
const start = useSimulators(FAST);

/** The data of each event, for LF framing without comments. */
function dataOf(text: string): string[] {
  expect(text.endsWith('\n\n')).toBe(true);
  return text
    .slice(0, -2)
    .split('\n\n')
    .map((event) => {
      expect(event.startsWith('data: ')).toBe(true);
      return event.slice('data: '.length);
    });
}

type Chunk = {
  id: string;
  object: string;
  created: number;
  model: string;
  choices: {
    index: number;
    delta?: { role?: string; content?: string };
    text?: string;
    logprobs: null;
    finish_reason: string | null;
    stop_reason?: null;
  }[];
  usage?: { prompt_tokens: number; total_tokens: number; completion_tokens: number; prompt_tokens_details?: { cached_tokens: number } };
};

function chunksOf(text: string): { chunks: Chunk[]; done: boolean } {
  const data = dataOf(text);
  const done = data.at(-1) === '[DONE]';
  const json = done ? data.slice(0, -1) : data;
  return {
    done,
    chunks: json.map((d) => {
      // Compact JSON: re-serialising gives the same bytes (and key order).
      expect(JSON.stringify(JSON.parse(d))).toBe(d);
      return JSON.parse(d) as Chunk;
    }),
  };
}

const chat = (extra: Record<string, unknown> = {}): Record<string, unknown> => ({
  model: 'sim-model',
  messages: [{ role: 'user', content: 'Say hello to the simulator' }],
  stream: true,
  ...extra,
});
const PROMPT_TOKENS = estimateTokens('Say hello to the simulator'.length);

// ---- chat streams ----

describe('chat streaming', () => {
  it('sends role, deltas, one finish chunk, usage and [DONE] in that order (n = 1)', async () => {
    const { sim, url } = await start();
    const ended = nextEnd(sim);
    const reply = await send(url, '/v1/chat/completions', {
      headers: { 'x-request-id': 'req-1' },
      body: chat({ stream_options: { include_usage: true } }),
    });
    expect(reply.status).toBe(200);
    expect(reply.headers['content-type']).toBe('text/event-stream; charset=utf-8');
    expect(reply.headers['transfer-encoding']).toBe('chunked');
    expect(reply.headers['keep-alive']).toBeUndefined();
    expect(reply.complete).toBe(true);

    const { chunks, done } = chunksOf(reply.text);
    expect(done).toBe(true);
    const head = { id: 'chatcmpl-req-1', object: 'chat.completion.chunk', model: 'sim-model' };
    expect(chunks).toHaveLength(6);
    for (const chunk of chunks) expect(chunk).toMatchObject(head);
    expect(chunks[0]?.choices).toEqual([
      { index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null },
    ]);
    for (let t = 0; t < 3; t++) {
      expect(chunks[1 + t]?.choices).toEqual([
        { index: 0, delta: { content: tokenText(0, t) }, logprobs: null, finish_reason: null },
      ]);
    }
    expect(chunks[4]?.choices).toEqual([
      { index: 0, delta: { content: tokenText(0, 3) }, logprobs: null, finish_reason: 'stop', stop_reason: null },
    ]);
    expect(chunks[5]?.choices).toEqual([]);
    expect(chunks[5]?.usage).toEqual({ prompt_tokens: PROMPT_TOKENS, total_tokens: PROMPT_TOKENS + 4, completion_tokens: 4 });

    const record = await ended;
    expect(record).toEqual({
      seq: 1,
      requestId: 'req-1',
      route: 'chat_completions',
      path: '/v1/chat/completions',
      model: 'sim-model',
      stream: true,
      n: 1,
      includeUsage: true,
      headers: { 'x-request-id': 'req-1' },
      fault: null,
      end: 'completed',
      status: 200,
      outputEventsSent: 4,
      completionTokensSent: 4,
      promptTokens: PROMPT_TOKENS,
    });
  });

  it('sends no usage chunk unless asked, or forced by forceIncludeUsage', async () => {
    const plain = await start();
    const withoutUsage = chunksOf((await send(plain.url, '/v1/chat/completions', { body: chat() })).text);
    expect(withoutUsage.chunks.some((c) => c.usage !== undefined)).toBe(false);
    expect(withoutUsage.chunks).toHaveLength(5);

    const forced = await start({ forceIncludeUsage: true });
    const withUsage = chunksOf((await send(forced.url, '/v1/chat/completions', { body: chat() })).text);
    expect(withUsage.chunks.at(-1)?.usage?.completion_tokens).toBe(4);
  });

  it('interleaves n = 2: role chunks first, one finish per index, usage last with summed tokens', async () => {
    const { url } = await start({ outputTokens: 6 });
    const reply = await send(url, '/v1/chat/completions', { body: chat({ n: 2, stream_options: { include_usage: true } }) });
    const { chunks, done } = chunksOf(reply.text);
    expect(done).toBe(true);
    expect(chunks.slice(0, 2).map((c) => c.choices[0]?.delta)).toEqual([
      { role: 'assistant', content: '' },
      { role: 'assistant', content: '' },
    ]);
    expect(chunks.slice(0, 2).map((c) => c.choices[0]?.index)).toEqual([0, 1]);
    const outputs = chunks.slice(2, -1);
    expect(outputs).toHaveLength(12);
    for (const c of outputs) expect(c.choices).toHaveLength(1);
    const finishes = outputs.filter((c) => c.choices[0]?.finish_reason !== null);
    expect(finishes.map((c) => c.choices[0]?.index).sort()).toEqual([0, 1]);
    for (const f of finishes) expect(f.choices[0]).toHaveProperty('stop_reason', null);
    // Each index's finish chunk is its last output; texts reassemble per index.
    for (const index of [0, 1]) {
      const mine = outputs.filter((c) => c.choices[0]?.index === index);
      expect(mine.at(-1)?.choices[0]?.finish_reason).toBe('stop');
      expect(mine.map((c) => c.choices[0]?.delta?.content).join('')).toBe(choiceText(index, 0, 6));
    }
    // The indices really interleave (seeded order), rather than running one after the other.
    const order = outputs.map((c) => c.choices[0]?.index);
    expect(order.indexOf(1)).toBeLessThan(order.lastIndexOf(0));
    expect(chunks.at(-1)?.usage).toEqual({ prompt_tokens: PROMPT_TOKENS, total_tokens: PROMPT_TOKENS + 12, completion_tokens: 12 });
  });

  it('caps at max_tokens (max_completion_tokens first) with finish_reason length', async () => {
    const { url } = await start({ outputTokens: 10 });
    const capped = chunksOf((await send(url, '/v1/chat/completions', { body: chat({ max_tokens: 3 }) })).text);
    expect(capped.chunks).toHaveLength(4);
    expect(capped.chunks.at(-1)?.choices[0]?.finish_reason).toBe('length');
    const both = chunksOf(
      (await send(url, '/v1/chat/completions', { body: chat({ max_tokens: 3, max_completion_tokens: 2 }) })).text,
    );
    expect(both.chunks).toHaveLength(3);
    const roomy = chunksOf((await send(url, '/v1/chat/completions', { body: chat({ max_tokens: 50 }) })).text);
    expect(roomy.chunks).toHaveLength(11);
    expect(roomy.chunks.at(-1)?.choices[0]?.finish_reason).toBe('stop');
  });

  it("emits 'request-start' once a request is accepted, before its 'request-end'", async () => {
    const { sim, url } = await start();
    const seen: string[] = [];
    sim.events.on('request-start', (r: RequestRecord) => seen.push(`start ${r.seq} ${r.stream}`));
    sim.events.on('request-end', (r: RequestRecord) => seen.push(`end ${r.seq} ${r.end}`));
    await send(url, '/v1/chat/completions', { body: chat() });
    await send(url, '/v1/chat/completions', { body: chat({ stream: false }) });
    await send(url, '/v1/chat/completions', { body: chat({ model: 'nope' }) });
    expect(seen).toEqual(['start 1 true', 'end 1 completed', 'start 2 false', 'end 2 completed', 'end 3 rejected']);
  });

  it('runs itl_ms = 0 streams without the 1 ms timer clamp', async () => {
    const { url } = await start({ itlMs: 0, outputTokens: 5000 });
    const t0 = Date.now();
    const reply = await send(url, '/v1/chat/completions', { body: chat() });
    expect(reply.text.endsWith('data: [DONE]\n\n')).toBe(true);
    expect(dataOf(reply.text)).toHaveLength(5002);
    // With setTimeout(0) this would take at least 5 s.
    expect(Date.now() - t0).toBeLessThan(4000);
  });

  it('sends nothing between the 200 headers and the first token', async () => {
    const { url } = await start({ ttftMs: 300 });
    const t0 = Date.now();
    let firstChunkAt = 0;
    let headersAt = 0;
    await new Promise<void>((resolve, reject) => {
      const req = httpRequest(`${url}/v1/chat/completions`, { method: 'POST', agent: false, headers: { 'content-type': 'application/json' } }, (res) => {
        headersAt = Date.now() - t0;
        res.once('data', () => {
          firstChunkAt = Date.now() - t0;
        });
        res.on('end', resolve);
        res.resume();
      });
      req.on('error', reject);
      req.end(JSON.stringify(chat()));
    });
    // Flushed headers arrive on their own, long before the first event; unflushed ones would share its packet.
    expect(firstChunkAt).toBeGreaterThanOrEqual(295);
    expect(firstChunkAt - headersAt).toBeGreaterThanOrEqual(100);
  });
});

// ---- legacy completions and non-streaming ----

describe('legacy completions and non-streaming bodies', () => {
  it('streams text_completion chunks without a role chunk; a prompt list gives index = choice + prompt_idx * n', async () => {
    const { url } = await start({ outputTokens: 2 });
    const reply = await send(url, '/v1/completions', {
      headers: { 'x-request-id': 'c1' },
      body: { model: 'sim-model', prompt: ['first', 'second'], n: 2, stream: true, stream_options: { include_usage: true } },
    });
    const { chunks, done } = chunksOf(reply.text);
    expect(done).toBe(true);
    const outputs = chunks.slice(0, -1);
    expect(outputs).toHaveLength(8);
    for (const c of chunks) expect(c).toMatchObject({ id: 'cmpl-c1', object: 'text_completion', model: 'sim-model' });
    for (const c of outputs) {
      expect(Object.keys(c.choices[0] ?? {})).toEqual(['index', 'text', 'logprobs', 'finish_reason', 'stop_reason']);
      expect(c.choices[0]?.delta).toBeUndefined();
    }
    for (const index of [0, 1, 2, 3]) {
      const mine = outputs.filter((c) => c.choices[0]?.index === index);
      expect(mine.map((c) => c.choices[0]?.finish_reason)).toEqual([null, 'stop']);
      expect(mine.map((c) => c.choices[0]?.text).join('')).toBe(choiceText(index, 0, 2));
    }
    const prompt = estimateTokens(5) + estimateTokens(6);
    expect(chunks.at(-1)?.usage).toEqual({ prompt_tokens: prompt, total_tokens: prompt + 8, completion_tokens: 8 });
  });

  it('answers stream: false with a chat.completion body and usage', async () => {
    const { sim, url } = await start();
    const ended = nextEnd(sim);
    const reply = await send(url, '/v1/chat/completions', { headers: { 'x-request-id': 'ns' }, body: chat({ stream: false, n: 2 }) });
    expect(reply.status).toBe(200);
    expect(reply.headers['content-type']).toBe('application/json');
    const body = JSON.parse(reply.text) as Record<string, unknown>;
    expect(body).toMatchObject({
      id: 'chatcmpl-ns',
      object: 'chat.completion',
      model: 'sim-model',
      choices: [
        { index: 0, message: { role: 'assistant', content: choiceText(0, 0, 4) }, logprobs: null, finish_reason: 'stop', stop_reason: null },
        { index: 1, message: { role: 'assistant', content: choiceText(1, 0, 4) }, logprobs: null, finish_reason: 'stop', stop_reason: null },
      ],
      usage: { prompt_tokens: PROMPT_TOKENS, total_tokens: PROMPT_TOKENS + 8, completion_tokens: 8 },
    });
    expect(typeof body.created).toBe('number');
    expect(await ended).toMatchObject({ stream: false, end: 'completed', status: 200, outputEventsSent: 0, completionTokensSent: 8 });
  });

  it('answers a non-streaming legacy completion with text choices', async () => {
    const { url } = await start({ outputTokens: 3 });
    const reply = await send(url, '/v1/completions', { body: { model: 'sim-model', prompt: [1, 2, 3, 4, 5], max_tokens: 2 } });
    expect(JSON.parse(reply.text)).toMatchObject({
      object: 'text_completion',
      choices: [{ index: 0, text: choiceText(0, 0, 2), logprobs: null, finish_reason: 'length', stop_reason: null }],
      usage: { prompt_tokens: 5, total_tokens: 7, completion_tokens: 2 },
    });
  });
});

// ---- prefill ----

interface Timed {
  status: number;
  /** Milliseconds from sending to the status line and headers, and to the first body byte. */
  headersAt: number;
  firstByteAt: number;
  text: string;
}

/** One request, timing its headers and its first body byte. */
function timed(url: string, path: string, body: unknown, headers: Record<string, string> = {}): Promise<Timed> {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    let headersAt = 0;
    let firstByteAt = 0;
    let text = '';
    const req = httpRequest(`${url}${path}`, { method: 'POST', agent: false, headers: { 'content-type': 'application/json', ...headers } }, (res) => {
      headersAt = performance.now() - t0;
      res.on('data', (chunk: Buffer) => {
        if (text === '') firstByteAt = performance.now() - t0;
        text += chunk.toString('utf8');
      });
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headersAt, firstByteAt, text }));
    });
    req.on('error', reject);
    req.end(JSON.stringify(body));
  });
}

const generation = (promptTokens: number, extra: Partial<GenerationRequest> = {}): GenerationRequest => ({
  route: 'chat_completions',
  model: 'sim-model',
  stream: true,
  n: 1,
  includeUsage: true,
  maxTokens: null,
  promptTokens,
  prompts: 1,
  promptInputs: [],
  cacheSalt: null,
  ...extra,
});

describe('prefill: the first token waits longer for a longer prompt', () => {
  const NONE = { noUsage: false, framing: 'lf', comments: false, multilineData: false } as const;

  it('adds prefillMsPer1kTokens per 1 000 of the prompt tokens usage reports, less cached ones, on top of the TTFT', () => {
    const options = resolveSimOptions({ ttftMs: 50, prefillMsPer1kTokens: 100 });
    const long = shapeAnswer(generation(25_000), NONE, options, 'r', 0);
    expect(long.usage.promptTokens).toBe(25_000);
    expect([long.prefillMs, long.ttftMs]).toEqual([2500, 2550]);
    // n does not multiply it (one prompt, prefilled once); a list of prompts adds up, as its usage does.
    expect(shapeAnswer(generation(25_000, { n: 4 }), NONE, options, 'r', 0).prefillMs).toBe(2500);
    const list = shapeAnswer(generation(3000, { route: 'completions', prompts: 3 }), NONE, options, 'r', 0);
    expect([list.usage.promptTokens, list.prefillMs]).toEqual([3000, 300]);
    // Prefix-cached tokens are not prefilled again.
    const cached = shapeAnswer(generation(5000), NONE, resolveSimOptions({ prefillMsPer1kTokens: 100, promptTokensDetails: true, cachedTokens: 1000 }), 'r', 0);
    expect([cached.usage.cachedTokens, cached.prefillMs]).toEqual([1000, 400]);
    // Whole milliseconds: a short prompt adds nothing, so a zero TTFT stays a zero delay.
    expect(shapeAnswer(generation(7), { ...NONE, ttftMs: 0 }, resolveSimOptions({}), 'r', 0).ttftMs).toBe(0);
    expect(prefillDelayMs({ promptTokens: 24, completionTokens: 1, cachedTokens: null }, 20)).toBe(0);
    expect(prefillDelayMs({ promptTokens: 1500, completionTokens: 1, cachedTokens: null }, 20)).toBe(30);
    // The header's modifiers: ttft_ms replaces the base, prefill is still added; prefill_ms_per_1k_tokens replaces the option.
    expect(shapeAnswer(generation(5000), { ...NONE, ttftMs: 10 }, options, 'r', 0).ttftMs).toBe(510);
    expect(shapeAnswer(generation(5000), { ...NONE, prefillMsPer1kTokens: 0 }, options, 'r', 0).ttftMs).toBe(50);
    expect(shapeAnswer(generation(5000), { ...NONE, prefillMsPer1kTokens: 40 }, options, 'r', 0).ttftMs).toBe(250);
    expect(resolveSimOptions({}).prefillMsPer1kTokens).toBe(20);
    expect(() => resolveSimOptions({ prefillMsPer1kTokens: -1 })).toThrow(/prefillMsPer1kTokens must be a number >= 0/);
  });

  it('streams: the 200 and headers at once, the first token after the prefill, chat and legacy completions alike', async () => {
    const { url } = await start({ prefillMsPer1kTokens: 100 });
    // 3 000 prompt tokens: 12 000 characters at the simulator's 4 a token, or 3 000 token ids. 300 ms of prefill.
    const [chatReply, legacy, short] = await Promise.all([
      timed(url, '/v1/chat/completions', chat({ messages: [{ role: 'user', content: 'x'.repeat(12_000) }], stream_options: { include_usage: true } })),
      timed(url, '/v1/completions', { model: 'sim-model', prompt: Array.from({ length: 3000 }, (_, i) => i % 1000), stream: true, stream_options: { include_usage: true } }),
      timed(url, '/v1/chat/completions', chat()),
    ]);
    for (const reply of [chatReply, legacy]) {
      expect(reply.status).toBe(200);
      expect(reply.firstByteAt).toBeGreaterThanOrEqual(295);
      // Flushed headers arrive on their own, long before the first event (vLLM sends its 200 before prefill).
      expect(reply.firstByteAt - reply.headersAt).toBeGreaterThanOrEqual(150);
      const { chunks, done } = chunksOf(reply.text);
      expect(done).toBe(true);
      expect(chunks.at(-1)?.usage?.prompt_tokens).toBe(3000);
    }
    // A short prompt is not held back behind them: no queue, and its own prefill rounds to 0 ms.
    expect(short.firstByteAt).toBeLessThan(chatReply.firstByteAt);
  });

  it('non-streaming bodies wait for the prefill too; the per-request header overrides the option', async () => {
    const { url } = await start({ prefillMsPer1kTokens: 100 });
    const tokenIds = [Array.from({ length: 1000 }, () => 7), Array.from({ length: 1500 }, () => 8)];
    const [legacy, chatBody, overridden] = await Promise.all([
      timed(url, '/v1/completions', { model: 'sim-model', prompt: tokenIds }),
      timed(url, '/v1/chat/completions', chat({ stream: false, messages: [{ role: 'user', content: 'y'.repeat(10_000) }] })),
      timed(url, '/v1/chat/completions', chat({ messages: [{ role: 'user', content: 'y'.repeat(10_000) }] }), {
        'x-sim-fault': 'prefill_ms_per_1k_tokens=0',
      }),
    ]);
    // 2 500 tokens each: 250 ms of prefill.
    expect(JSON.parse(legacy.text)).toMatchObject({ object: 'text_completion', usage: { prompt_tokens: 2500 } });
    expect(JSON.parse(chatBody.text)).toMatchObject({ object: 'chat.completion', usage: { prompt_tokens: 2500 } });
    expect(legacy.headersAt).toBeGreaterThanOrEqual(245);
    expect(chatBody.headersAt).toBeGreaterThanOrEqual(245);
    expect(overridden.firstByteAt).toBeLessThan(chatBody.headersAt);
  });

  it('a client that leaves during the prefill is recorded at once and leaves no timer behind', async () => {
    const { sim, url } = await start({ prefillMsPer1kTokens: 1000 });
    const timers = (): number => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;
    const before = timers();
    const started = once(sim.events, 'request-start');
    const ended = nextEnd(sim);
    let leave!: () => void;
    const closed = new Promise<void>((resolve) => {
      // 60 000 tokens: one minute of prefill.
      const req = httpRequest(`${url}/v1/chat/completions`, { method: 'POST', agent: false, headers: { 'content-type': 'application/json' } }, (res) => {
        res.on('close', resolve);
      });
      req.on('error', () => resolve());
      leave = () => req.destroy();
      req.end(JSON.stringify(chat({ messages: [{ role: 'user', content: 'z'.repeat(240_000) }] })));
    });
    await started;
    expect(timers()).toBe(before + 1);
    expect(sim.stats().inflight).toBe(1);
    leave();
    await closed;
    expect(await ended).toMatchObject({ end: 'client_disconnect', status: 200, outputEventsSent: 0 });
    expect(timers()).toBe(before);
    expect(sim.stats()).toMatchObject({ inflight: 0, clientDisconnects: 1, tokens: { prompt: 60_000, completion: 0 } });
  });
});

// ---- errors before streaming ----

describe('errors before streaming', () => {
  it('rejects invalid JSON, missing messages, unknown models, stream_options without stream and unknown routes like vLLM', async () => {
    const { sim, url } = await start();
    const invalidJson = await send(url, '/v1/chat/completions', { body: '{"model":' });
    expect(invalidJson.status).toBe(400);
    expect(JSON.parse(invalidJson.text)).toEqual({ error: { message: 'JSON decode error', type: 'BadRequestError', param: null, code: 400 } });

    const missing = await send(url, '/v1/chat/completions', { body: { model: 'sim-model' } });
    expect(missing.status).toBe(400);
    expect(JSON.parse(missing.text)).toMatchObject({ error: { type: 'BadRequestError', param: 'messages', code: 400 } });

    const unknownModel = await send(url, '/v1/chat/completions', { body: chat({ model: 'gpt-9' }) });
    expect(unknownModel.status).toBe(404);
    expect(JSON.parse(unknownModel.text)).toEqual({
      error: { message: 'The model `gpt-9` does not exist.', type: 'NotFoundError', param: 'model', code: 404 },
    });

    const options = await send(url, '/v1/chat/completions', { body: chat({ stream: false, stream_options: { include_usage: true } }) });
    expect(options.status).toBe(400);

    const route = await send(url, '/v2/embed', { body: { texts: ['x'] } });
    expect(route.status).toBe(404);
    expect(JSON.parse(route.text)).toEqual({ detail: 'Not Found' });

    const stats = sim.stats();
    expect(stats.byStatus).toEqual({ '400': 3, '404': 2 });
    expect(stats.recent.map((r) => r.end)).toEqual(['rejected', 'rejected', 'rejected', 'rejected', 'rejected']);
    expect(stats.recent.map((r) => r.model)).toEqual([null, 'sim-model', 'gpt-9', 'sim-model', null]);
    expect(stats.tokens).toEqual({ prompt: 0, completion: 0 });
  });

  it('with an API key answers 401 {"error":"Unauthorized"} (a string) on /v1, and leaves /health open', async () => {
    const { sim, url } = await start({ apiKey: 'secret-key' });
    const denied = await send(url, '/v1/chat/completions', { body: chat() });
    expect(denied.status).toBe(401);
    expect(denied.text).toBe('{"error":"Unauthorized"}');
    expect((await send(url, '/v1/models')).status).toBe(401);
    expect((await send(url, '/health')).status).toBe(200);
    const ended = nextEnd(sim);
    const allowed = await send(url, '/v1/chat/completions', { headers: { authorization: 'Bearer secret-key' }, body: chat() });
    expect(allowed.status).toBe(200);
    expect((await ended).headers).toEqual({ authorization: 'present' });
    const served = await send(url, '/sim/stats');
    expect(served.text).not.toContain('secret-key');
  });
});

// ---- faults ----

describe('x-sim-fault', () => {
  const stream = (url: string, fault: string, extra: Record<string, unknown> = {}, headers: Record<string, string> = {}): Promise<Reply> =>
    send(url, '/v1/chat/completions', { headers: { 'x-sim-fault': fault, ...headers }, body: chat(extra) });

  it('status=<code> answers before streaming, string-shaped for 401 and 503, object-shaped otherwise', async () => {
    const { sim, url } = await start();
    const s503 = await stream(url, 'status=503');
    expect(s503.status).toBe(503);
    expect(s503.text).toBe('{"error":"Service Unavailable"}');
    const s401 = await stream(url, 'status=401');
    expect(s401.text).toBe('{"error":"Unauthorized"}');
    const s429 = await stream(url, 'status=429');
    expect(s429.status).toBe(429);
    expect(JSON.parse(s429.text)).toEqual({ error: { message: 'Too Many Requests', type: 'RateLimitError', param: null, code: 429 } });
    const s500 = await stream(url, 'status=500');
    expect(JSON.parse(s500.text)).toEqual({ error: { message: 'Internal server error', type: 'InternalServerError', param: null, code: 500 } });
    expect(s500.headers.connection).toBe('close');
    const stats = sim.stats();
    expect(stats.faultsInjected.status).toBe(4);
    expect(stats.byStatus).toEqual({ '401': 1, '429': 1, '500': 1, '503': 1 });
    expect(stats.recent.map((r) => [r.fault, r.end])).toEqual(Array(4).fill(['status', 'fault']));
  });

  it('error_before_output: 200, then only an error event in json.dumps style, then [DONE]', async () => {
    const { sim, url } = await start();
    const ended = nextEnd(sim);
    const reply = await stream(url, 'error_before_output');
    expect(reply.status).toBe(200);
    expect(reply.text).toBe(
      'data: {"error": {"message": "Token id 151936 is out of vocabulary", "type": "BadRequestError", "param": null, "code": 400}}\n\n' +
        'data: [DONE]\n\n',
    );
    expect(await ended).toMatchObject({ fault: 'error_before_output', end: 'fault', status: 200, outputEventsSent: 0 });
    const custom = await stream(url, 'error_before_output=500');
    expect(custom.text).toContain('"type": "InternalServerError", "param": null, "code": 500}}');
  });

  it('error_after=<k>: k output events, then the error event and [DONE]; error_code sets the code', async () => {
    const { sim, url } = await start({ outputTokens: 8 });
    const ended = nextEnd(sim);
    const reply = await stream(url, 'error_after=2', { stream_options: { include_usage: true } });
    const data = dataOf(reply.text);
    expect(data).toHaveLength(5);
    expect(JSON.parse(data[0] ?? '')).toMatchObject({ choices: [{ delta: { role: 'assistant' } }] });
    expect(JSON.parse(data[2] ?? '')).toMatchObject({ choices: [{ delta: { content: tokenText(0, 1) } }] });
    expect(data[3]).toBe('{"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}');
    expect(data[4]).toBe('[DONE]');
    expect(await ended).toMatchObject({ fault: 'error_after', end: 'fault', outputEventsSent: 2, completionTokensSent: 2 });

    const coded = dataOf((await stream(url, 'error_after=0; error_code=503')).text);
    expect(coded).toEqual([
      '{"error": {"message": "Service Unavailable", "type": "ServiceUnavailableError", "param": null, "code": 503}}',
      '[DONE]',
    ]);
  });

  it('reset_after=<k>: the client sees a transport error after k output events; k = 0 right after the headers', async () => {
    const { sim, url } = await start({ outputTokens: 8 });
    const ended = nextEnd(sim);
    const reply = await stream(url, 'reset_after=2');
    expect(reply.status).toBe(200);
    expect(reply.error).not.toBeNull();
    expect(reply.complete).toBe(false);
    expect(reply.text).not.toContain('[DONE]');
    expect(await ended).toMatchObject({ fault: 'reset_after', end: 'fault', status: 200, outputEventsSent: 2 });

    const early = await stream(url, 'reset_after=0');
    expect(early.error).not.toBeNull();
    expect(early.text).toBe('');
  });

  it('reset_before_response: no response at all', async () => {
    const { sim, url } = await start();
    const ended = nextEnd(sim);
    const reply = await stream(url, 'reset_before_response');
    expect(reply.status).toBe(0);
    expect(reply.error?.code).toMatch(/ECONNRESET|EPIPE/);
    expect(await ended).toMatchObject({ fault: 'reset_before_response', end: 'fault', status: 0 });
    expect(sim.stats().byStatus).toEqual({});
  });

  it('stall_after=<k>: no bytes after k output events; the client leaving counts a clientDisconnect', async () => {
    const { sim, url } = await start({ outputTokens: 8 });
    const ended = nextEnd(sim);
    let sawFirstOutput!: () => void;
    const firstOutput = new Promise<void>((resolve) => (sawFirstOutput = resolve));
    let received = '';
    let destroy!: () => void;
    const destroyed = new Promise<void>((resolve) => {
      const req = httpRequest(`${url}/v1/chat/completions`, {
        method: 'POST',
        agent: false,
        headers: { 'content-type': 'application/json', 'x-sim-fault': 'stall_after=1' },
      }, (res) => {
        res.on('data', (chunk: Buffer) => {
          received += chunk.toString('utf8');
          if (received.includes(tokenText(0, 0))) sawFirstOutput();
        });
        res.on('close', resolve);
      });
      req.on('error', () => resolve());
      destroy = () => req.destroy();
      req.end(JSON.stringify(chat()));
    });
    await firstOutput;
    const atStall = received;
    // Absence can only be observed over time: 100 ms is 100 inter-token intervals of this simulator.
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(received).toBe(atStall);
    expect(dataOf(received)).toHaveLength(2);
    expect(sim.stats().inflight).toBe(1);
    destroy();
    await destroyed;
    expect(await ended).toMatchObject({ fault: 'stall_after', end: 'client_disconnect', status: 200, outputEventsSent: 1 });
    const stats = sim.stats();
    expect(stats.clientDisconnects).toBe(1);
    expect(stats.inflight).toBe(0);
  });

  it('end_after=<k>: a clean end of the body after k output events, no finish chunk, no [DONE]', async () => {
    const { sim, url } = await start({ outputTokens: 8 });
    const ended = nextEnd(sim);
    const reply = await stream(url, 'end_after=3');
    expect(reply.complete).toBe(true);
    expect(reply.error).toBeNull();
    const { chunks, done } = chunksOf(reply.text);
    expect(done).toBe(false);
    expect(chunks).toHaveLength(4);
    expect(chunks.every((c) => c.choices[0]?.finish_reason === null)).toBe(true);
    expect(await ended).toMatchObject({ fault: 'end_after', end: 'fault', outputEventsSent: 3 });
  });

  it('no_done: a normal answer that ends cleanly without [DONE]', async () => {
    const { url } = await start();
    const reply = await stream(url, 'no_done', { stream_options: { include_usage: true } });
    expect(reply.complete).toBe(true);
    const { chunks, done } = chunksOf(reply.text);
    expect(done).toBe(false);
    expect(chunks.at(-2)?.choices[0]?.finish_reason).toBe('stop');
    expect(chunks.at(-1)?.usage?.completion_tokens).toBe(4);
  });

  it('drop_finish: choice 0 never gets a finish chunk; its last content arrives in a normal delta', async () => {
    const { url } = await start();
    const { chunks, done } = chunksOf((await stream(url, 'drop_finish', { n: 2 })).text);
    expect(done).toBe(true);
    const zero = chunks.filter((c) => c.choices[0]?.index === 0);
    expect(zero.every((c) => c.choices[0]?.finish_reason === null)).toBe(true);
    expect(zero.map((c) => c.choices[0]?.delta?.content ?? '').join('')).toBe(choiceText(0, 0, 4));
    expect(chunks.filter((c) => c.choices[0]?.index === 1).at(-1)?.choices[0]?.finish_reason).toBe('stop');
  });

  it('malformed_after=<k>: one event that is not JSON, then the stream continues to [DONE]', async () => {
    const { sim, url } = await start();
    const ended = nextEnd(sim);
    const reply = await stream(url, 'malformed_after=1');
    const data = dataOf(reply.text);
    expect(data[2]).toBe('{"id":"broken');
    expect(reply.text).toContain('data: {"id":"broken\n\n');
    expect(data).toHaveLength(7);
    expect(data.at(-1)).toBe('[DONE]');
    expect(await ended).toMatchObject({ fault: 'malformed_after', end: 'fault', outputEventsSent: 4 });
  });

  it('oversized_after=<k>: one content event of exactly oversized_bytes bytes of JSON', async () => {
    const { url } = await start();
    const reply = await stream(url, 'oversized_after=2; oversized_bytes=70000');
    const data = dataOf(reply.text);
    expect(data).toHaveLength(7);
    expect(Buffer.byteLength(data[3] ?? '')).toBe(70000);
    expect(JSON.parse(data[3] ?? '')).toMatchObject({ choices: [{ index: 0, finish_reason: null }] });
    expect(data.at(-1)).toBe('[DONE]');
  });

  it('data_after_done: one more chunk event after [DONE]', async () => {
    const { url } = await start();
    const data = dataOf((await stream(url, 'data_after_done')).text);
    expect(data.at(-2)).toBe('[DONE]');
    expect(JSON.parse(data.at(-1) ?? '')).toMatchObject({ object: 'chat.completion.chunk', choices: [{ index: 0 }] });
  });

  it('framing=crlf and framing=cr change every line ending', async () => {
    const { url } = await start();
    const crlf = (await stream(url, 'framing=crlf')).text;
    expect(crlf.endsWith('data: [DONE]\r\n\r\n')).toBe(true);
    expect(crlf.replaceAll('\r\n', '')).not.toMatch(/[\r\n]/);
    expect(crlf.split('\r\n\r\n')).toHaveLength(7);
    const cr = (await stream(url, 'framing=cr')).text;
    expect(cr).not.toContain('\n');
    expect(cr.split('\r\r').filter((e) => e !== '')).toHaveLength(6);
  });

  it('comments and multiline_data keep the same events under a different surface', async () => {
    const { url } = await start();
    const plain = dataOf((await stream(url, '')).text).map((d) => d.replace(/"created":\d+/, ''));
    const commented = (await stream(url, 'comments')).text;
    expect(commented.startsWith('data: ')).toBe(true);
    expect(commented.match(/^: ping$/gm)).toHaveLength(5);
    const multiline = (await stream(url, 'multiline_data')).text;
    const joined = multiline
      .slice(0, -2)
      .split('\n\n')
      .map((event) => event.split('\n').map((line) => line.slice('data: '.length)).join('\n'));
    expect(multiline.split('\n\n')[0]?.split('\n')).toHaveLength(2);
    expect(joined.at(-1)).toBe('[DONE]');
    const reparsed = joined.map((d) => (d === '[DONE]' ? d : JSON.stringify(JSON.parse(d)).replace(/"created":\d+/, '')));
    expect(reparsed.map((d) => d.replace(/"id":"chatcmpl-[0-9a-f]+"/, ''))).toEqual(
      plain.map((d) => d.replace(/"id":"chatcmpl-[0-9a-f]+"/, '')),
    );
  });

  it('modifiers: finish_reason, tokens, tokens_per_event, cached_tokens and no_usage', async () => {
    const { url } = await start();
    const shaped = chunksOf(
      (await stream(url, 'finish_reason=tool_calls; tokens=5; tokens_per_event=2; cached_tokens=3', {
        stream_options: { include_usage: true },
      })).text,
    ).chunks;
    expect(shaped.slice(1, -1).map((c) => c.choices[0]?.delta?.content)).toEqual([
      choiceText(0, 0, 2),
      choiceText(0, 2, 2),
      choiceText(0, 4, 1),
    ]);
    expect(shaped.at(-2)?.choices[0]?.finish_reason).toBe('tool_calls');
    expect(shaped.at(-1)?.usage).toEqual({
      prompt_tokens: PROMPT_TOKENS,
      total_tokens: PROMPT_TOKENS + 5,
      completion_tokens: 5,
      prompt_tokens_details: { cached_tokens: 3 },
    });
    const silent = chunksOf((await stream(url, 'no_usage', { stream_options: { include_usage: true } })).text).chunks;
    expect(silent.some((c) => c.usage !== undefined)).toBe(false);
  });

  it('rejects a bad directive with a 400 naming it', async () => {
    const { url } = await start();
    for (const [header, name] of [
      ['explode', 'explode'],
      ['error_after=x', 'error_after'],
      ['status=200', 'status'],
      ['no_done; drop_finish', 'drop_finish'],
      ['framing=tabs', 'framing'],
      ['error_code=503', 'error_code'],
    ] as const) {
      const reply = await stream(url, header);
      expect(reply.status).toBe(400);
      const body = JSON.parse(reply.text) as { error: { message: string; param: string } };
      expect(body.error.param).toBe('x-sim-fault');
      expect(body.error.message).toContain(`'${name}'`);
    }
  });

  it('applies the faults that make sense without a stream to stream: false, and ignores the rest', async () => {
    const { sim, url } = await start();
    const failed = await stream(url, 'error_after=1', { stream: false });
    expect(failed.status).toBe(500);
    expect(JSON.parse(failed.text)).toMatchObject({ error: { type: 'InternalServerError', code: 500 } });
    const ended = nextEnd(sim);
    const ignored = await stream(url, 'no_done', { stream: false });
    expect(ignored.status).toBe(200);
    expect(await ended).toMatchObject({ fault: null, end: 'completed' });
  });
});

// ---- disconnects, health, models, metrics, stats ----

describe('client disconnects and the control endpoints', () => {
  it('counts a client that leaves mid-stream, at once, and stops generating for it', async () => {
    const { sim, url } = await start({ outputTokens: 1000, itlMs: 2 });
    const ended = nextEnd(sim);
    const reply = await send(url, '/v1/chat/completions', {
      body: chat(),
      onChunk: (received) => received.split('\n\n').length > 4,
    });
    expect(reply.complete).toBe(false);
    const record = await ended;
    expect(record).toMatchObject({ end: 'client_disconnect', status: 200, fault: null });
    expect(record.outputEventsSent).toBeLessThan(1000);
    const stats = sim.stats();
    expect(stats.clientDisconnects).toBe(1);
    expect(stats.completed).toBe(0);
    expect(stats.inflight).toBe(0);
    expect(stats.tokens.completion).toBe(record.completionTokensSent);
    const metrics = (await send(url, '/metrics')).text;
    expect(metrics).toContain('vllm:request_success_total{model_name="sim-model",engine="0",finished_reason="stop"} 0.0');
    expect(metrics).toContain('vllm:num_requests_running{model_name="sim-model",engine="0"} 0.0');
  });

  it('/health is 200 with an empty body, 503 when the engine is dead; /v1/models stays 200', async () => {
    const { sim, url } = await start({ models: ['alpha', 'beta'] });
    const healthy = await send(url, '/health');
    expect([healthy.status, healthy.text]).toEqual([200, '']);
    sim.setEngineDead(true);
    expect((await send(url, '/health')).status).toBe(503);
    const dead = await send(url, '/v1/chat/completions', { body: chat({ model: 'alpha' }) });
    expect(dead.status).toBe(500);
    expect(dead.headers.connection).toBe('close');
    expect(JSON.parse(dead.text)).toMatchObject({ error: { type: 'InternalServerError', param: null, code: 500 } });
    const models = await send(url, '/v1/models');
    expect(models.status).toBe(200);
    const list = JSON.parse(models.text) as { object: string; data: Record<string, unknown>[] };
    expect(list.object).toBe('list');
    expect(list.data.map((m) => m.id)).toEqual(['alpha', 'beta']);
    expect(list.data[0]).toMatchObject({ object: 'model', owned_by: 'vllm', root: 'alpha', max_model_len: 131072 });
    sim.setEngineDead(false);
    expect((await send(url, '/health')).status).toBe(200);
  });

  it('/metrics is Prometheus text with vLLM names, labels and values', async () => {
    const { sim, url } = await start();
    const ended = nextEnd(sim);
    await send(url, '/v1/chat/completions', { body: chat({ n: 2 }) });
    await ended;
    await send(url, '/v1/chat/completions', { headers: { 'x-sim-fault': 'finish_reason=length; tokens=2' }, body: chat() });
    const reply = await send(url, '/metrics');
    expect(reply.headers['content-type']).toBe('text/plain; version=0.0.4; charset=utf-8');
    const labels = 'model_name="sim-model",engine="0"';
    expect(reply.text).toContain('# TYPE vllm:num_requests_running gauge\n');
    expect(reply.text).toContain('# TYPE vllm:prompt_tokens_total counter\n');
    expect(reply.text).toContain(`vllm:num_requests_waiting{${labels}} 0.0\n`);
    expect(reply.text).toContain(`vllm:prompt_tokens_total{${labels}} ${2 * PROMPT_TOKENS}.0\n`);
    expect(reply.text).toContain(`vllm:generation_tokens_total{${labels}} 10.0\n`);
    expect(reply.text).toContain(`vllm:request_success_total{${labels},finished_reason="stop"} 2.0\n`);
    expect(reply.text).toContain(`vllm:request_success_total{${labels},finished_reason="length"} 1.0\n`);
    expect(reply.text).toContain('# HELP vllm:request_success_total ');
  });

  it('keeps stats by value, serves them at GET /sim/stats, and resets them', async () => {
    const { sim, url } = await start();
    await send(url, '/v1/chat/completions', {
      headers: { 'x-request-id': 'a', traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', tracestate: 'k=v' },
      body: chat({ stream_options: { include_usage: false } }),
    });
    await send(url, '/v1/completions', { body: { prompt: 'abcdefgh', stream: false } });
    await send(url, '/v1/chat/completions', { headers: { 'x-sim-fault': 'error_after=1' }, body: chat() });
    await send(url, '/health');
    await send(url, '/nope');

    const stats = sim.stats();
    expect({ ...stats, recent: undefined }).toEqual({
      requests: 4,
      byRoute: { ...Object.fromEntries(ROUTE_NAMES.map((r) => [r, 0])), chat_completions: 2, completions: 1, other: 1 },
      operational: { ...Object.fromEntries(OPERATIONAL_PATHS.map((p) => [p, 0])), '/health': 1 },
      inflight: 0,
      completed: 2,
      clientDisconnects: 0,
      faultsInjected: { ...Object.fromEntries(FAULT_KINDS.map((k) => [k, 0])), error_after: 1 },
      tokens: { prompt: 2 * PROMPT_TOKENS + 2, completion: 4 + 4 + 1 },
      byStatus: { '200': 4, '404': 1 },
      recent: undefined,
    });
    expect(stats.recent.map((r) => [r.seq, r.route, r.end, r.status])).toEqual([
      [1, 'chat_completions', 'completed', 200],
      [2, 'completions', 'completed', 200],
      [3, 'chat_completions', 'fault', 200],
      [4, 'other', 'rejected', 404],
    ]);
    expect(stats.recent[0]).toMatchObject({
      requestId: 'a',
      includeUsage: false,
      headers: { 'x-request-id': 'a', traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', tracestate: 'k=v' },
    });
    expect(JSON.parse((await send(url, '/sim/stats')).text)).toEqual(sim.stats());
    sim.resetStats();
    expect(sim.stats()).toMatchObject({ requests: 0, completed: 0, recent: [], byStatus: {}, tokens: { prompt: 0, completion: 0 } });
  });

  it("counts a gateway's own reads (vLLM's operational paths) apart from requests, by path, with no record", async () => {
    const { sim, url } = await start({ apiKey: 'k' });
    const auth = { authorization: 'Bearer k' };
    const health = await send(url, '/health');
    const ping = await send(url, '/ping', { body: {} });
    const version = await send(url, '/version');
    const load = await send(url, '/load');
    const models = await send(url, '/v1/models', { headers: auth });
    const unauthorized = await send(url, '/v1/models');
    const metrics = await send(url, '/metrics');
    expect([health.status, ping.status, version.status, load.status, models.status, unauthorized.status, metrics.status]).toEqual([200, 200, 200, 200, 200, 401, 200]);
    expect(JSON.parse(version.text)).toEqual({ version: 'waybill-sim' });
    expect(JSON.parse(load.text)).toEqual({ server_load: 0 });
    const stats = sim.stats();
    expect(stats.requests).toBe(0);
    expect(stats.byRoute.other).toBe(0);
    expect(stats.recent).toEqual([]);
    expect(stats.operational).toEqual({ '/health': 1, '/ping': 1, '/version': 1, '/load': 1, '/metrics': 1, '/v1/models': 2 });
    sim.resetStats();
    expect(sim.stats().operational['/v1/models']).toBe(0);
  });
});

// ---- seeded randomness ----

describe('random faults', () => {
  async function faultMix(seed: number): Promise<(string | null)[]> {
    const { sim, url } = await start({ seed, faultRate: 0.5, faultKinds: ['status', 'error_after', 'no_done', 'end_after'] });
    for (let i = 0; i < 24; i++) await send(url, '/v1/chat/completions', { body: chat() });
    const stats = sim.stats();
    expect(stats.faultsInjected.status + stats.faultsInjected.error_after + stats.faultsInjected.no_done + stats.faultsInjected.end_after).toBe(
      stats.recent.filter((r) => r.fault !== null).length,
    );
    return stats.recent.map((r) => r.fault);
  }

  it('draws the same mix for the same seed, and a different one for another seed', async () => {
    const first = await faultMix(7);
    const again = await faultMix(7);
    const other = await faultMix(8);
    expect(again).toEqual(first);
    expect(other).not.toEqual(first);
    const faulted = first.filter((f) => f !== null).length;
    expect(faulted).toBeGreaterThan(3);
    expect(faulted).toBeLessThan(21);
  });

  it('draws k in [0, outputTokens) and only kinds listed', () => {
    const random = createRandom(3);
    for (let i = 0; i < 200; i++) {
      const fault = drawFault(random, 1, ['stall_after', 'malformed_after'], 5);
      expect(fault?.kind === 'stall_after' || fault?.kind === 'malformed_after').toBe(true);
      if (fault !== null && 'after' in fault) expect(fault.after).toBeGreaterThanOrEqual(0);
      if (fault !== null && 'after' in fault) expect(fault.after).toBeLessThan(5);
    }
  });
});
