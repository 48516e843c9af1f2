/**
 * The simulator's non-generation routes over real sockets, no gateway: embeddings, pooling, classify, score,
 * rerank, tokenize and detokenize — each answer's shape by value, each refusal's status, body and connection
 * handling, the fault header, the binary encodings decoded back to the floats, and the stats and /metrics they feed.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import type { RequestRecord, SimOptions } from '../src/sim/server.js';
import { ROUTE_NAMES } from '../src/sim/stats.js';
import { SimTokenizer } from '../src/sim/tokens.js';
import { minifloatBits, pythonFloat } from '../src/sim/vectors.js';
import { estimateTokens } from '../src/sim/wire.js';
import { sendKeptAlive as send, type Reply, type Send } from './helpers/one-request.js';
import { nextEnd } from './helpers/sim-records.js';
import { useSimulators } from './helpers/simulators.js';

// ---- harness ----

const FAST: Partial<SimOptions> = { ttftMs: 2, itlMs: 1, jitter: 0, prefillMsPer1kTokens: 0 };
const start = useSimulators(FAST);

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function json<T = Record<string, unknown>>(reply: Reply): T {
  return JSON.parse(reply.text) as T;
}

interface Usage {
  prompt_tokens: number;
  total_tokens: number;
  completion_tokens?: number;
  prompt_tokens_details?: null;
}
interface VectorList {
  id: string;
  object: string;
  created: number;
  model: string;
  data: { index: number; object: string; embedding?: number[] | string; data?: number[] | string }[];
  usage: Usage;
}

const poolingUsage = (p: number): Usage => ({ prompt_tokens: p, total_tokens: p, completion_tokens: 0, prompt_tokens_details: null });
const tokensOf = (text: string): number => estimateTokens(text.length);

async function embed(url: string, input: unknown, extra: Record<string, unknown> = {}): Promise<number[][]> {
  const reply = await send(url, '/v1/embeddings', { body: { input, ...extra } });
  expect(reply.status).toBe(200);
  return json<VectorList>(reply).data.map((d) => d.embedding as number[]);
}

function float32s(bytes: Buffer, littleEndian = true): number[] {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  return Array.from({ length: bytes.length / 4 }, (_, i) => view.getFloat32(i * 4, littleEndian));
}

/** A reference decoder for the small float formats (independent of the encoder under test). */
function decodeMinifloat(bits: number, expBits: number, manBits: number): number {
  const bias = 2 ** (expBits - 1) - 1;
  const sign = bits >= 2 ** (expBits + manBits) ? -1 : 1;
  const exp = Math.floor(bits / 2 ** manBits) % 2 ** expBits;
  const man = bits % 2 ** manBits;
  if (exp === 0) return sign * man * 2 ** (1 - bias - manBits);
  return sign * (1 + man / 2 ** manBits) * 2 ** (exp - bias);
}

function cosine(a: readonly number[], b: readonly number[]): number {
  let dot = 0;
  let na = 0;
  let nb = 0;
  a.forEach((x, i) => {
    const y = b[i] ?? 0;
    dot += x * y;
    na += x * x;
    nb += y * y;
  });
  return Math.fround(dot / (Math.sqrt(na) * Math.sqrt(nb)));
}

// ---- embeddings ----

describe('POST /v1/embeddings', () => {
  it('answers vLLM’s EmbeddingResponse by value: ids, key order, float32 vectors, pooling usage', async () => {
    const { sim, url } = await start({ models: ['sim-model', 'alias'] });
    const ended = nextEnd(sim);
    const reply = await send(url, '/v1/embeddings', { headers: { 'x-request-id': 'req-7' }, body: { model: 'alias', input: ['hello', 'waybill'] }, watchClose: true });
    expect(reply.status).toBe(200);
    expect(reply.headers['content-type']).toBe('application/json');
    expect(reply.headers['content-length']).toBe(String(reply.raw.length));
    expect(reply.closed).toBe(false);
    const body = json<VectorList>(reply);
    expect(Object.keys(body)).toEqual(['id', 'object', 'created', 'model', 'data', 'usage']);
    // The served model's first name, whatever alias was asked (vLLM's models.model_name()).
    expect(body).toMatchObject({ id: 'embd-req-7', object: 'list', model: 'sim-model', usage: poolingUsage(tokensOf('hello') + tokensOf('waybill')) });
    expect(Math.abs(body.created - Date.now() / 1000)).toBeLessThan(5);
    expect(body.data.map((d) => Object.keys(d))).toEqual([['index', 'object', 'embedding'], ['index', 'object', 'embedding']]);
    expect(body.data.map((d) => [d.index, d.object])).toEqual([[0, 'embedding'], [1, 'embedding']]);
    for (const { embedding } of body.data) {
      const values = embedding as number[];
      expect(values).toHaveLength(8);
      expect(values.every((v) => Math.fround(v) === v)).toBe(true);
      expect(values.reduce((s, v) => s + v * v, 0)).toBeCloseTo(1, 5);
    }
    expect(await ended).toMatchObject({
      route: 'embeddings',
      path: '/v1/embeddings',
      requestId: 'req-7',
      model: 'alias',
      end: 'completed',
      status: 200,
      fault: null,
      promptTokens: 4,
      completionTokensSent: 0,
    });
  });

  it('is deterministic per input and seed; token ids and messages count as the chat route counts them', async () => {
    const { url } = await start();
    const [batch, single, again] = [await embed(url, ['hello', 'waybill']), await embed(url, 'hello'), await embed(url, ['waybill'])];
    expect(single[0]).toEqual(batch[0]);
    expect(again[0]).toEqual(batch[1]);
    expect(batch[0]).not.toEqual(batch[1]);
    const other = await start({ seed: 2 });
    expect((await embed(other.url, 'hello'))[0]).not.toEqual(single[0]);

    const ids = await send(url, '/v1/embeddings', { body: { input: [[1, 2, 3], [4, 5]] } });
    expect(json<VectorList>(ids).usage).toEqual(poolingUsage(5));
    expect(json<VectorList>(ids).data).toHaveLength(2);
    const flat = await send(url, '/v1/embeddings', { body: { input: [7, 8, 9, 10] } });
    expect(json<VectorList>(flat).usage).toEqual(poolingUsage(4));
    expect(json<VectorList>(flat).data).toHaveLength(1);
    const messages = [{ role: 'user', content: 'Say hello' }, { role: 'user', content: [{ type: 'text', text: ' to the simulator' }] }];
    const chatLike = await send(url, '/v1/embeddings', { body: { messages } });
    expect(json<VectorList>(chatLike).usage).toEqual(poolingUsage(tokensOf('Say hello to the simulator')));
    const chat = await send(url, '/v1/chat/completions', { body: { messages } });
    expect(json<{ usage: Usage }>(chat).usage.prompt_tokens).toBe(json<VectorList>(chatLike).usage.prompt_tokens);
  });

  it('gives a 16-hex id without X-Request-Id, the record’s id', async () => {
    const { sim, url } = await start();
    const ended = nextEnd(sim);
    const body = json<VectorList>(await send(url, '/v1/embeddings', { body: { input: 'x' } }));
    expect(body.id).toMatch(/^embd-[0-9a-f]{16}$/);
    expect(`embd-${(await ended).requestId}`).toBe(body.id);
  });

  it('honours dimensions (a Matryoshka cut, renormalised) and use_activation: false (raw values)', async () => {
    const { url } = await start();
    const [full] = await embed(url, 'hello');
    const [cut] = await embed(url, 'hello', { dimensions: 3 });
    expect(cut).toHaveLength(3);
    expect((cut ?? []).reduce((s, v) => s + v * v, 0)).toBeCloseTo(1, 5);
    const norm = Math.sqrt((full ?? []).slice(0, 3).reduce((s, v) => s + v * v, 0));
    (cut ?? []).forEach((v, i) => expect(v).toBeCloseTo((full?.[i] ?? 0) / norm, 5));
    expect((await embed(url, 'hello', { dimensions: 100 }))[0]).toHaveLength(8);
    const [raw] = await embed(url, 'hello', { use_activation: false });
    expect((raw ?? []).reduce((s, v) => s + v * v, 0)).not.toBeCloseTo(1, 3);
    const wide = await start({ embeddingDimensions: 32 });
    expect((await embed(wide.url, 'hello'))[0]).toHaveLength(32);

    const zero = await send(url, '/v1/embeddings', { body: { input: 'hello', dimensions: 0 }, watchClose: true });
    expect([zero.status, zero.closed]).toEqual([400, true]);
    expect(json(zero)).toEqual({ error: { message: 'Dimensions must be greater than 0', type: 'BadRequestError', param: null, code: 400 } });
  });

  it('base64 (what openai-node sends by default) is the little-endian float32 bytes of the float answer', async () => {
    const { url } = await start();
    const floats = await embed(url, ['hello', 'waybill']);
    const reply = await send(url, '/v1/embeddings', { body: { input: ['hello', 'waybill'], encoding_format: 'base64' } });
    const body = json<VectorList>(reply);
    expect(body.usage).toEqual(poolingUsage(4));
    const decoded = body.data.map((d) => float32s(Buffer.from(d.embedding as string, 'base64')));
    expect(decoded).toEqual(floats);
    // endianness and embed_dtype apply to base64 too.
    const big = json<VectorList>(await send(url, '/v1/embeddings', { body: { input: 'hello', encoding_format: 'base64', endianness: 'big' } }));
    expect(float32s(Buffer.from(big.data[0]?.embedding as string, 'base64'), false)).toEqual(floats[0]);
    const half = json<VectorList>(await send(url, '/v1/embeddings', { body: { input: 'hello', encoding_format: 'base64', embed_dtype: 'float16' } }));
    const halfBytes = Buffer.from(half.data[0]?.embedding as string, 'base64');
    expect(halfBytes).toHaveLength(16);
    (floats[0] ?? []).forEach((v, i) => expect(Math.abs(decodeMinifloat(halfBytes.readUInt16LE(i * 2), 5, 10) - v)).toBeLessThanOrEqual(Math.abs(v) * 2 ** -11));
  });

  it('bytes: raw float32 in an application/octet-stream chunked body, described by a `metadata` header', async () => {
    const { url } = await start();
    const floats = await embed(url, ['hello', 'waybill']);
    const reply = await send(url, '/v1/embeddings', { headers: { 'x-request-id': 'b-1' }, body: { input: ['hello', 'waybill'], encoding_format: 'bytes' } });
    expect(reply.status).toBe(200);
    expect(reply.headers['content-type']).toBe('application/octet-stream');
    expect(reply.headers['transfer-encoding']).toBe('chunked');
    expect(reply.headers['content-length']).toBeUndefined();
    const header = reply.headers['metadata'] as string;
    // json.dumps with Python's default separators.
    expect(header).toContain('"id": "embd-b-1", "created": ');
    const metadata = JSON.parse(header) as { id: string; created: number; model: string; data: { index: number; embed_dtype: string; endianness: string; start: number; end: number; shape: number[] }[]; usage: Usage };
    expect(Object.keys(metadata)).toEqual(['id', 'created', 'model', 'data', 'usage']);
    expect(metadata).toMatchObject({ id: 'embd-b-1', model: 'sim-model', usage: { prompt_tokens: 4, total_tokens: 4 } });
    expect(Object.keys(metadata.usage)).toEqual(['prompt_tokens', 'total_tokens']);
    expect(metadata.data).toEqual([
      { index: 0, embed_dtype: 'float32', endianness: 'native', start: 0, end: 32, shape: [8] },
      { index: 1, embed_dtype: 'float32', endianness: 'native', start: 32, end: 64, shape: [8] },
    ]);
    expect(reply.raw).toHaveLength(64);
    expect(metadata.data.map((d) => float32s(reply.raw.subarray(d.start, d.end)))).toEqual(floats);

    const only = await send(url, '/v1/embeddings', { body: { input: ['hello', 'waybill'], encoding_format: 'bytes_only' } });
    expect(only.headers['metadata']).toBeUndefined();
    expect(only.headers['content-type']).toBe('application/octet-stream');
    expect(only.raw.equals(reply.raw)).toBe(true);

    const bf16 = await send(url, '/v1/embeddings', { body: { input: 'hello', encoding_format: 'bytes', embed_dtype: 'bfloat16', endianness: 'big' } });
    expect(JSON.parse(bf16.headers['metadata'] as string)).toMatchObject({ data: [{ embed_dtype: 'bfloat16', endianness: 'big', start: 0, end: 16, shape: [8] }] });
    (floats[0] ?? []).forEach((v, i) => expect(Math.abs(decodeMinifloat(bf16.raw.readUInt16BE(i * 2), 8, 7) - v)).toBeLessThanOrEqual(Math.abs(v) * 2 ** -8));
    const fp8 = await send(url, '/v1/embeddings', { body: { input: 'hello', encoding_format: 'bytes_only', embed_dtype: 'fp8_e4m3' } });
    expect(fp8.raw).toHaveLength(8);
    (floats[0] ?? []).forEach((v, i) => expect(Math.abs(decodeMinifloat(fp8.raw.readUInt8(i), 4, 3) - v)).toBeLessThanOrEqual(Math.max(Math.abs(v) * 2 ** -4, 2 ** -10)));
  });
});

// ---- pooling, classify ----

describe('POST /pooling and /classify', () => {
  it('/pooling: the embedding under `data`, object "pooling", id pooling-…; dimensions refused', async () => {
    const { url } = await start();
    const [vector] = await embed(url, 'hello');
    const reply = await send(url, '/pooling', { headers: { 'x-request-id': 'p' }, body: { input: 'hello' } });
    const body = json<VectorList>(reply);
    expect(body).toEqual({ id: 'pooling-p', object: 'list', created: body.created, model: 'sim-model', data: [{ index: 0, object: 'pooling', data: vector }], usage: poolingUsage(2) });
    const bytes = await send(url, '/pooling', { body: { input: 'hello', encoding_format: 'bytes' } });
    expect(float32s(bytes.raw)).toEqual(vector);
    const classified = json<VectorList>(await send(url, '/pooling', { body: { input: ['good'], task: 'classify' } }));
    const classify = json<{ data: { probs: number[] }[] }>(await send(url, '/classify', { body: { input: ['good'] } }));
    expect(classified.data[0]?.data).toEqual(classify.data[0]?.probs);

    const dims = await send(url, '/pooling', { body: { input: 'hello', dimensions: 4 } });
    expect([dims.status, json(dims)]).toEqual([400, { error: { message: 'dimensions is currently not supported', type: 'BadRequestError', param: null, code: 400 } }]);
    const task = await send(url, '/pooling', { body: { input: 'hello', task: 'token_embed' } });
    expect(task.status).toBe(400);
    const badTask = await send(url, '/pooling', { body: { input: 'hello', task: 'nope' } });
    expect(json(badTask)).toMatchObject({ error: { type: 'Bad Request', code: 400 } });
  });

  it('/classify: {index, label, probs, num_classes} per input, label the argmax', async () => {
    const { url } = await start();
    const reply = await send(url, '/classify', { headers: { 'x-request-id': 'c' }, body: { input: ['good', 'bad', 'indifferent'] } });
    const body = json<{ id: string; object: string; model: string; data: { index: number; label: string; probs: number[]; num_classes: number }[]; usage: Usage }>(reply);
    expect(Object.keys(body)).toEqual(['id', 'object', 'created', 'model', 'data', 'usage']);
    expect(body).toMatchObject({ id: 'classify-c', object: 'list', model: 'sim-model', usage: poolingUsage(1 + 1 + 3) });
    body.data.forEach((item, index) => {
      expect(Object.keys(item)).toEqual(['index', 'label', 'probs', 'num_classes']);
      expect(item.index).toBe(index);
      expect(item.num_classes).toBe(2);
      expect((item.probs[0] ?? 0) + (item.probs[1] ?? 0)).toBeCloseTo(1, 6);
      expect(item.label).toBe((item.probs[0] ?? 0) >= (item.probs[1] ?? 0) ? 'LABEL_0' : 'LABEL_1');
    });
  });
});

// ---- score, rerank ----

describe('POST /score and /rerank', () => {
  it('scores are the cosines of the embeddings; usage counts each pair as query + 1 + document', async () => {
    const { sim, url } = await start();
    const [q, d1, d2] = await embed(url, ['what is a waybill', 'a document', 'a fish']);
    const reply = await send(url, '/score', { headers: { 'x-request-id': 's' }, body: { text_1: 'what is a waybill', text_2: ['a document', 'a fish'] } });
    const body = json<{ data: { index: number; object: string; score: number }[]; usage: Usage }>(reply);
    expect(Object.keys(body)).toEqual(['id', 'object', 'created', 'model', 'data', 'usage']);
    expect(body).toMatchObject({ id: 'score-s', object: 'list', model: 'sim-model' });
    expect(body.data).toEqual([
      { index: 0, object: 'score', score: cosine(q ?? [], d1 ?? []) },
      { index: 1, object: 'score', score: cosine(q ?? [], d2 ?? []) },
    ]);
    const pairTokens = (doc: string): number => tokensOf('what is a waybill') + 1 + tokensOf(doc);
    expect(body.usage).toEqual(poolingUsage(pairTokens('a document') + pairTokens('a fish')));

    for (const [a, b] of [['queries', 'documents'], ['queries', 'items'], ['data_1', 'data_2']]) {
      const same = json<{ data: unknown }>(await send(url, '/v1/score', { body: { [a as string]: 'what is a waybill', [b as string]: ['a document', 'a fish'] } }));
      expect(same.data).toEqual(body.data);
    }
    const pairwise = json<{ data: { score: number }[]; usage: Usage }>(await send(url, '/score', { body: { queries: ['a document', 'a fish'], documents: ['a fish', 'a document'] } }));
    expect(pairwise.data.map((d) => d.score)).toEqual([cosine(d1 ?? [], d2 ?? []), cosine(d2 ?? [], d1 ?? [])]);
    expect(pairwise.usage.prompt_tokens).toBe(2 * (tokensOf('a document') + 1 + tokensOf('a fish')));

    // The engine encodes each text once: its prompt-token counter is not usage's.
    const metrics = (await send(url, '/metrics')).text;
    // Six requests over the same three texts (5 + 3 + 2 tokens), each text encoded once per request.
    const engineTokens = 6 * (5 + 3 + 2);
    expect(metrics).toContain(`vllm:prompt_tokens_total{model_name="sim-model",engine="0"} ${engineTokens}.0\n`);
    expect(sim.stats().byRoute.score).toBe(5);
  });

  it('refuses score inputs vLLM refuses', async () => {
    const { url } = await start();
    const lengths = await send(url, '/score', { body: { queries: ['a', 'b'], documents: ['a', 'b', 'c'] }, watchClose: true });
    expect([lengths.status, lengths.closed]).toEqual([400, true]);
    expect(json(lengths)).toEqual({ error: { message: 'Input lengths must be either 1:1, 1:N or N:N', type: 'BadRequestError', param: null, code: 400 } });
    const empty = await send(url, '/score', { body: { queries: 'a', documents: [] } });
    expect(json(empty)).toMatchObject({ error: { message: 'At least one text_pair element must be given' } });
    const missing = await send(url, '/score', { body: { queries: 'a' }, watchClose: true });
    expect([missing.status, missing.closed]).toEqual([400, false]);
    expect(json(missing)).toMatchObject({ error: { type: 'Bad Request', param: null, code: 400 } });
    const image = await send(url, '/score', { body: { queries: 'a', documents: [{ content: [{ type: 'image_url', image_url: { url: 'x' } }] }] } });
    expect(json(image)).toMatchObject({ error: { message: 'MultiModalParam is not supported for SimModel', type: 'BadRequestError' } });
  });

  it('rerank: results sorted by relevance, cut to top_n, documents echoed; 2-key usage, no object or created', async () => {
    const { url } = await start();
    const documents = ['a document', 'a fish', 'a ship', 'the waybill of a ship', 'cargo'];
    const scores = json<{ data: { score: number }[] }>(await send(url, '/score', { body: { queries: 'waybill', documents } })).data.map((d) => d.score);
    const order = scores.map((score, index) => ({ score, index })).sort((a, b) => b.score - a.score);

    const reply = await send(url, '/rerank', { headers: { 'x-request-id': 'r' }, body: { query: 'waybill', documents, top_n: 3 } });
    const body = json<{ id: string; model: string; usage: Usage; results: { index: number; document: { text: string; multi_modal: null }; relevance_score: number }[] }>(reply);
    expect(Object.keys(body)).toEqual(['id', 'model', 'usage', 'results']);
    const usage = documents.reduce((s, d) => s + tokensOf('waybill') + 1 + tokensOf(d), 0);
    expect(body).toEqual({
      id: 'score-r',
      model: 'sim-model',
      usage: { prompt_tokens: usage, total_tokens: usage },
      results: order.slice(0, 3).map(({ index, score }) => ({ index, document: { text: documents[index], multi_modal: null }, relevance_score: score })),
    });
    for (const path of ['/v1/rerank', '/v2/rerank']) {
      const all = json<typeof body>(await send(url, path, { body: { query: 'waybill', documents, top_n: 0 } }));
      expect(all.results.map((r) => r.index)).toEqual(order.map((o) => o.index));
    }
    const many = json<typeof body>(await send(url, '/rerank', { body: { query: 'waybill', documents: 'cargo', top_n: 9 } }));
    expect(many.results).toHaveLength(1);
    const badTopN = await send(url, '/rerank', { body: { query: 'waybill', documents, top_n: null } });
    expect(json(badTopN)).toMatchObject({ error: { type: 'Bad Request' } });
    const listQuery = await send(url, '/rerank', { body: { query: ['a', 'b'], documents } });
    expect(listQuery.status).toBe(400);
  });
});

// ---- tokenize, detokenize ----

describe('POST /tokenize and /detokenize', () => {
  it('tokenize counts what usage bills (ceil(chars / 4)), and detokenize gives the text back', async () => {
    const { sim, url } = await start();
    const text = 'hello world, héllo 日本 🙂\n\ttabs';
    const reply = await send(url, '/tokenize', { body: { model: 'sim-model', prompt: text } });
    const body = json<{ count: number; max_model_len: number; tokens: number[]; token_strs: null }>(reply);
    expect(Object.keys(body)).toEqual(['count', 'max_model_len', 'tokens', 'token_strs']);
    expect(body).toMatchObject({ count: tokensOf(text), max_model_len: 131072, token_strs: null });
    expect(body.tokens).toHaveLength(body.count);
    const embedded = json<VectorList>(await send(url, '/v1/embeddings', { body: { input: text } }));
    expect(embedded.usage.prompt_tokens).toBe(body.count);

    const back = await send(url, '/detokenize', { body: { tokens: body.tokens } });
    expect(json(back)).toEqual({ prompt: text });
    // The ids are token ids like any other: a completion counts them exactly.
    const completion = json<{ usage: Usage }>(await send(url, '/v1/completions', { body: { prompt: body.tokens } }));
    expect(completion.usage.prompt_tokens).toBe(body.count);

    const strs = json<{ token_strs: string[] }>(await send(url, '/tokenize', { body: { prompt: 'abcdefghij', return_token_strs: true } }));
    expect(strs.token_strs).toEqual(['abcd', 'efgh', 'ij']);
    const empty = json<{ count: number; tokens: number[] }>(await send(url, '/tokenize', { body: { prompt: '' } }));
    expect(empty).toMatchObject({ count: 1, tokens: [0] });
    expect(json(await send(url, '/detokenize', { body: { tokens: [0, 2 ** 31 - 1] } }))).toEqual({ prompt: '' });

    const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Say hello to the simulator' }];
    const chatTokens = json<{ count: number }>(await send(url, '/tokenize', { body: { messages } }));
    const chat = json<{ usage: Usage }>(await send(url, '/v1/chat/completions', { body: { messages } }));
    expect(chatTokens.count).toBe(chat.usage.prompt_tokens);

    // No usage, no engine: no prompt tokens, nothing in /metrics.
    const records = sim.stats().recent.filter((r) => r.route === 'tokenize' || r.route === 'detokenize');
    expect(records.map((r) => [r.route, r.promptTokens, r.end])).toEqual([
      ['tokenize', null, 'completed'],
      ['detokenize', null, 'completed'],
      ['tokenize', null, 'completed'],
      ['tokenize', null, 'completed'],
      ['detokenize', null, 'completed'],
      ['tokenize', null, 'completed'],
    ]);
  });

  it('round-trips any text, and counts it as estimateTokens does', () => {
    const tokenizer = new SimTokenizer();
    fc.assert(
      fc.property(fc.string({ unit: 'binary', maxLength: 64 }), (text) => {
        const ids = tokenizer.encode(text);
        expect(ids).toHaveLength(estimateTokens(text.length));
        expect(ids.every((id) => Number.isInteger(id) && id >= 0 && id < 2 ** 31)).toBe(true);
        expect(tokenizer.decode(ids)).toBe(text);
      }),
    );
  });

  it('refuses what vLLM refuses: unknown model (404, param model, connection kept), bad or overflowing ids', async () => {
    const { url } = await start();
    const model = await send(url, '/tokenize', { body: { model: 'gpt-9', prompt: 'x' }, watchClose: true });
    expect([model.status, model.closed]).toEqual([404, false]);
    expect(json(model)).toEqual({ error: { message: 'The model `gpt-9` does not exist.', type: 'NotFoundError', param: 'model', code: 404 } });
    expect((await send(url, '/detokenize', { body: { model: 'gpt-9', tokens: [1] } })).status).toBe(404);
    expect(json(await send(url, '/tokenize', { body: { prompt: 3 } }))).toMatchObject({ error: { type: 'Bad Request', code: 400 } });
    expect(json(await send(url, '/tokenize', { body: {} }))).toMatchObject({ error: { type: 'Bad Request', code: 400 } });
    expect(json(await send(url, '/detokenize', { body: { tokens: [-1] } }))).toMatchObject({ error: { type: 'Bad Request', code: 400 } });
    const overflow = await send(url, '/detokenize', { body: { tokens: [2 ** 32] } });
    expect(json(overflow)).toEqual({ error: { message: 'out of range integral type conversion attempted', type: 'Bad Request', param: null, code: 400 } });
  });
});

// ---- errors ----

describe('refusals, as vLLM answers them', () => {
  it('malformed JSON, wrong content type and schema errors: FastAPI’s 400 "Bad Request", connection kept', async () => {
    const { sim, url } = await start();
    const cases: [string, Send, string][] = [
      ['/v1/embeddings', { body: '{"input":' }, 'JSON decode error'],
      ['/classify', { body: '{"input":"x"}', headers: { 'content-type': 'text/plain' } }, "Unsupported Media Type: Only 'application/json' is allowed"],
      ['/v1/embeddings', { body: { model: 'sim-model' } }, 'input: Field required'],
      ['/v1/embeddings', { body: { input: [1, 'a'] } }, 'input: Input should be a valid string, a list of strings, a list of integers or a list of lists of integers'],
      ['/v1/embeddings', { body: { input: 'x', encoding_format: 'hex' } }, "encoding_format: Input should be 'float', 'base64', 'bytes', 'bytes_only'"],
      ['/pooling', { body: { input: 'x', model: 3 } }, 'model: Input should be a valid string'],
      ['/v1/embeddings', { body: { input: 'x', truncate_prompt_tokens: -2 } }, 'truncate_prompt_tokens: Input should be greater than or equal to -1'],
      ['/rerank', { body: '[1]' }, 'Input should be a valid dictionary or object to extract fields from'],
    ];
    for (const [path, options, message] of cases) {
      const reply = await send(url, path, { ...options, watchClose: true });
      expect([path, reply.status, json(reply), reply.closed]).toEqual([path, 400, { error: { message, type: 'Bad Request', param: null, code: 400 } }, false]);
    }
    expect(sim.stats().recent.map((r) => r.end)).toEqual(new Array<string>(cases.length).fill('rejected'));
    expect(sim.stats().tokens.prompt).toBe(0);
  });

  it('an unknown model is 404 NotFoundError with param null, and the connection closes after it (a raised error)', async () => {
    const { sim, url } = await start();
    for (const [path, body] of [
      ['/v1/embeddings', { model: 'gpt-9', input: 'x' }],
      ['/pooling', { model: 'gpt-9', input: 'x' }],
      ['/classify', { model: 'gpt-9', input: 'x' }],
      ['/score', { model: 'gpt-9', text_1: 'x', text_2: 'y' }],
      ['/rerank', { model: 'gpt-9', query: 'x', documents: ['y'] }],
    ] as const) {
      const reply = await send(url, path, { body, watchClose: true });
      expect([path, reply.status, reply.headers.connection, reply.closed]).toEqual([path, 404, 'keep-alive', true]);
      expect(json(reply)).toEqual({ error: { message: 'The model `gpt-9` does not exist.', type: 'NotFoundError', param: null, code: 404 } });
    }
    expect(sim.stats().recent.map((r) => [r.model, r.status, r.end])).toEqual(new Array(5).fill(['gpt-9', 404, 'rejected']));
    // "" is no model at all, as for vLLM.
    expect((await send(url, '/v1/embeddings', { body: { model: '', input: 'x' } })).status).toBe(200);
  });

  it('handler checks: no prompt, prompt too long (param input_tokens), truncation', async () => {
    const { url } = await start();
    const none = await send(url, '/v1/embeddings', { body: { input: [] }, watchClose: true });
    expect([none.status, none.closed, json(none)]).toEqual([400, true, { error: { message: 'You must pass at least one prompt', type: 'BadRequestError', param: null, code: 400 } }]);
    const long = new Array<number>(131_073).fill(5);
    const tooLong = await send(url, '/v1/embeddings', { body: { input: long }, watchClose: true });
    expect([tooLong.status, tooLong.closed]).toEqual([400, true]);
    expect(json(tooLong)).toMatchObject({ error: { type: 'BadRequestError', param: 'input_tokens', code: 400 } });
    const truncated = json<VectorList>(await send(url, '/v1/embeddings', { body: { input: long, truncate_prompt_tokens: 10 } }));
    expect(truncated.usage).toEqual(poolingUsage(10));
    expect(json<VectorList>(await send(url, '/v1/embeddings', { body: { input: long, truncate_prompt_tokens: -1 } })).usage).toEqual(poolingUsage(131_072));
    const over = await send(url, '/v1/embeddings', { body: { input: 'x', truncate_prompt_tokens: 131_073 } });
    expect(json(over)).toMatchObject({ error: { type: 'BadRequestError', code: 400 } });
    const zero = await send(url, '/classify', { body: { input: 'x', truncate_prompt_tokens: 0 } });
    expect(json(zero)).toMatchObject({ error: { message: 'The decoder prompt cannot be empty' } });
  });

  it('a dead engine: 500 on the engine routes, tokenize and detokenize still answer', async () => {
    const { sim, url } = await start();
    sim.setEngineDead(true);
    const dead = await send(url, '/v1/embeddings', { body: { input: 'x' } });
    expect([dead.status, dead.headers.connection]).toEqual([500, 'close']);
    expect(json(dead)).toMatchObject({ error: { type: 'InternalServerError', code: 500 } });
    expect((await send(url, '/rerank', { body: { query: 'x', documents: ['y'] } })).status).toBe(500);
    expect((await send(url, '/tokenize', { body: { prompt: 'x' } })).status).toBe(200);
    expect((await send(url, '/detokenize', { body: { tokens: [1] } })).status).toBe(200);
  });

  it('routes, methods and the API key as vLLM has them', async () => {
    const { url } = await start({ apiKey: 'k' });
    expect((await send(url, '/v1/embeddings', { body: { input: 'x' } })).status).toBe(401);
    expect((await send(url, '/v1/score', { body: { text_1: 'x', text_2: 'y' } })).status).toBe(401);
    const v2 = await send(url, '/v2/rerank', { body: { query: 'x', documents: ['y'] } });
    expect([v2.status, json(v2)]).toEqual([401, { error: 'Unauthorized' }]);
    const authorized = { authorization: 'Bearer k' };
    expect((await send(url, '/v2/rerank', { headers: authorized, body: { query: 'x', documents: ['y'] } })).status).toBe(200);
    for (const path of ['/pooling', '/classify', '/score', '/rerank', '/tokenize']) {
      const body = path === '/score' ? { text_1: 'x', text_2: 'y' } : path === '/rerank' ? { query: 'x', documents: ['y'] } : path === '/tokenize' ? { prompt: 'x' } : { input: 'x' };
      expect([path, (await send(url, path, { body })).status]).toEqual([path, 200]);
    }
    const get = await send(url, '/rerank');
    expect([get.status, get.headers.allow, json(get)]).toEqual([405, 'POST', { detail: 'Method Not Allowed' }]);
    const unknown = await send(url, '/embed', { body: { input: 'x' } });
    expect([unknown.status, json(unknown)]).toEqual([404, { detail: 'Not Found' }]);
  });
});

// ---- faults and timing ----

describe('x-sim-fault on the non-generation routes', () => {
  it('status: that status at once, with vLLM’s body for it', async () => {
    const { sim, url } = await start({ ttftMs: 5_000 });
    const failed = await send(url, '/v1/embeddings', { headers: { 'x-sim-fault': 'status=500' }, body: { input: 'x' } });
    expect([failed.status, failed.headers.connection]).toEqual([500, 'close']);
    expect(json(failed)).toEqual({ error: { message: 'Internal server error', type: 'InternalServerError', param: null, code: 500 } });
    expect(failed.ms).toBeLessThan(1_000);
    const busy = await send(url, '/rerank', { headers: { 'x-sim-fault': 'status=503' }, body: { query: 'x', documents: ['y'] } });
    expect([busy.status, json(busy)]).toEqual([503, { error: 'Service Unavailable' }]);
    const stats = sim.stats();
    expect(stats.faultsInjected.status).toBe(2);
    expect(stats.recent.map((r) => [r.route, r.fault, r.end, r.status])).toEqual([
      ['embeddings', 'status', 'fault', 500],
      ['rerank', 'status', 'fault', 503],
    ]);
  });

  it('error_before_output and error_after: the error status after the engine time (there is no decode)', async () => {
    const { url } = await start({ ttftMs: 60 });
    const before = await send(url, '/classify', { headers: { 'x-sim-fault': 'error_before_output' }, body: { input: 'x' } });
    expect([before.status, json(before)]).toEqual([400, { error: { message: 'Bad Request', type: 'BadRequestError', param: null, code: 400 } }]);
    expect(before.ms).toBeGreaterThanOrEqual(55);
    const after = await send(url, '/score', { headers: { 'x-sim-fault': 'error_after=3; error_code=503' }, body: { text_1: 'x', text_2: 'y' } });
    expect([after.status, json(after)]).toEqual([503, { error: { message: 'Service Unavailable', type: 'ServiceUnavailableError', param: null, code: 503 } }]);
    expect(after.ms).toBeGreaterThanOrEqual(55);
  });

  it('resets: before the body is read, at once (reset_after=0) or at the engine time', async () => {
    const { sim, url } = await start({ ttftMs: 30 });
    for (const directive of ['reset_before_response', 'reset_after=0', 'reset_after=2']) {
      const ended = nextEnd(sim);
      const reply = await send(url, '/v1/embeddings', { headers: { 'x-sim-fault': directive }, body: { input: 'x' } });
      expect([directive, reply.status, reply.error?.code]).toEqual([directive, 0, 'ECONNRESET']);
      expect(await ended).toMatchObject({ end: 'fault', status: 0 });
    }
    expect(sim.stats().faultsInjected).toMatchObject({ reset_before_response: 1, reset_after: 2 });
  });

  it('stall_after: no answer until the client leaves; stream-only faults are ignored', async () => {
    const { sim, url } = await start();
    const ended = nextEnd(sim);
    const reply = await send(url, '/tokenize', { headers: { 'x-sim-fault': 'stall_after=0' }, body: { prompt: 'x' }, leaveAfterMs: 80 });
    expect(reply.status).toBe(0);
    expect(await ended).toMatchObject({ route: 'tokenize', fault: 'stall_after', end: 'client_disconnect', status: 0 });
    const ignored = nextEnd(sim);
    expect((await send(url, '/v1/embeddings', { headers: { 'x-sim-fault': 'no_done' }, body: { input: 'x' } })).status).toBe(200);
    expect(await ignored).toMatchObject({ fault: null, end: 'completed' });
    const bad = await send(url, '/v1/embeddings', { headers: { 'x-sim-fault': 'bogus' }, body: { input: 'x' } });
    expect(json(bad)).toMatchObject({ error: { type: 'BadRequestError', param: 'x-sim-fault', code: 400 } });
  });

  it('timing: ttft plus the prefill of what the engine encodes; ttft_ms and prefill_ms_per_1k_tokens override', async () => {
    const { url } = await start({ ttftMs: 0, prefillMsPer1kTokens: 100_000 });
    // 4 tokens at 100 ms each.
    const slow = await send(url, '/v1/embeddings', { body: { input: [1, 2, 3, 4] } });
    expect(slow.ms).toBeGreaterThanOrEqual(390);
    const none = await send(url, '/v1/embeddings', { headers: { 'x-sim-fault': 'prefill_ms_per_1k_tokens=0' }, body: { input: [1, 2, 3, 4] } });
    expect(none.ms).toBeLessThan(300);
    // Tokenize never reaches the engine: no ttft, no prefill (it would be 10 s here), unless asked.
    expect((await send(url, '/tokenize', { body: { prompt: 'x'.repeat(400) } })).ms).toBeLessThan(2_000);
    const asked = await send(url, '/tokenize', { headers: { 'x-sim-fault': 'ttft_ms=120' }, body: { prompt: 'x' } });
    expect(asked.ms).toBeGreaterThanOrEqual(115);
  });

  it('random faults reach the engine routes only', async () => {
    const { sim, url } = await start({ faultRate: 1, faultKinds: ['status'] });
    const failed = await send(url, '/v1/embeddings', { body: { input: 'x' } });
    expect([500, 503]).toContain(failed.status);
    expect((await send(url, '/tokenize', { body: { prompt: 'x' } })).status).toBe(200);
    expect(sim.stats().faultsInjected.status).toBe(1);
  });
});

// ---- disconnects, stats, metrics ----

describe('disconnects, stats and /metrics', () => {
  it('a client that leaves before the answer ends the request at once and cancels its timer', async () => {
    const { sim, url } = await start({ ttftMs: 150 });
    const ended = nextEnd(sim);
    const reply = await send(url, '/rerank', { body: { query: 'x', documents: ['y', 'z'] }, leaveAfterMs: 30 });
    expect(reply.error?.message).toBe('left');
    const record = await ended;
    expect(record).toMatchObject({ route: 'rerank', end: 'client_disconnect', status: 0, promptTokens: 6 });
    expect(sim.stats()).toMatchObject({ inflight: 0, clientDisconnects: 1, completed: 0 });
    await delay(250); // past the engine time: nothing fires, nothing is counted
    const metrics = (await send(url, '/metrics')).text;
    expect(metrics).toContain('vllm:request_success_total{model_name="sim-model",engine="0",finished_reason="stop"} 0.0');
    expect(metrics).toContain('vllm:num_requests_waiting{model_name="sim-model",engine="0"} 0.0');
    expect(sim.stats().recent).toHaveLength(1);
  });

  it('counts every route under its own name, with the path, usage tokens and engine counters', async () => {
    const { sim, url } = await start();
    const starts: RequestRecord[] = [];
    sim.events.on('request-start', (r: RequestRecord) => starts.push(r));
    await send(url, '/v1/embeddings', { body: { input: ['ab', 'cd'] } });
    await send(url, '/pooling', { body: { input: 'ab' } });
    await send(url, '/classify', { body: { input: 'ab' } });
    await send(url, '/score', { body: { text_1: 'ab', text_2: 'cd' } });
    await send(url, '/v1/score', { body: { text_1: 'ab', text_2: 'cd' } });
    await send(url, '/rerank', { body: { query: 'ab', documents: ['cd', 'ef'] } });
    await send(url, '/v2/rerank', { body: { query: 'ab', documents: ['cd'] } });
    await send(url, '/tokenize', { body: { prompt: 'ab' } });
    await send(url, '/detokenize', { body: { tokens: [1] } });
    const stats = sim.stats();
    expect(stats.byRoute).toEqual({
      ...Object.fromEntries(ROUTE_NAMES.map((r) => [r, 0])),
      embeddings: 1,
      pooling: 1,
      classify: 1,
      score: 2,
      rerank: 2,
      tokenize: 1,
      detokenize: 1,
    });
    expect(stats.recent.map((r) => [r.route, r.path, r.promptTokens, r.end, r.status])).toEqual([
      ['embeddings', '/v1/embeddings', 2, 'completed', 200],
      ['pooling', '/pooling', 1, 'completed', 200],
      ['classify', '/classify', 1, 'completed', 200],
      ['score', '/score', 3, 'completed', 200],
      ['score', '/v1/score', 3, 'completed', 200],
      ['rerank', '/rerank', 6, 'completed', 200],
      ['rerank', '/v2/rerank', 3, 'completed', 200],
      ['tokenize', '/tokenize', null, 'completed', 200],
      ['detokenize', '/detokenize', null, 'completed', 200],
    ]);
    expect(starts.map((r) => r.route)).toEqual(stats.recent.map((r) => r.route));
    expect(stats).toMatchObject({ completed: 9, inflight: 0, tokens: { prompt: 2 + 1 + 1 + 3 + 3 + 6 + 3, completion: 0 } });
    const metrics = (await send(url, '/metrics')).text;
    const labels = 'model_name="sim-model",engine="0"';
    // Engine requests: 2 + 1 + 1 + 2 + 2 + 3 + 2 (each text once); engine tokens likewise.
    expect(metrics).toContain(`vllm:request_success_total{${labels},finished_reason="stop"} 13.0\n`);
    expect(metrics).toContain(`vllm:prompt_tokens_total{${labels}} 13.0\n`);
    expect(metrics).toContain(`vllm:generation_tokens_total{${labels}} 0.0\n`);
  });
});

// ---- encodings ----

describe('number formats', () => {
  it('writes floats as Python’s repr does', () => {
    const cases: [number, string][] = [
      [1, '1.0'],
      [-2.5, '-2.5'],
      [0.1, '0.1'],
      [0.0001, '0.0001'],
      [5e-5, '5e-05'],
      [1.5e-7, '1.5e-07'],
      [1e16, '1e+16'],
      [123456789012345680, '1.2345678901234568e+17'],
      [1234.5, '1234.5'],
      [0, '0.0'],
      [Math.fround(0.1), '0.10000000149011612'],
    ];
    for (const [value, repr] of cases) expect([value, pythonFloat(value)]).toEqual([value, repr]);
  });

  it('casts to the small float formats with round-to-nearest-even, subnormals kept', () => {
    expect(minifloatBits(1, 5, 10)).toBe(0x3c00);
    expect(minifloatBits(-2, 5, 10)).toBe(0xc000);
    expect(minifloatBits(0.1, 5, 10)).toBe(0x2e66);
    expect(minifloatBits(2 ** -24, 5, 10)).toBe(1);
    expect(minifloatBits(2 ** -14, 5, 10)).toBe(0x0400);
    expect(minifloatBits(1 + 2 ** -11, 5, 10)).toBe(0x3c00); // a tie rounds to even
    expect(minifloatBits(1 + 3 * 2 ** -11, 5, 10)).toBe(0x3c02);
    expect(minifloatBits(1, 8, 7)).toBe(0x3f80);
    expect(minifloatBits(-0.5, 8, 7)).toBe(0xbf00);
    expect(minifloatBits(1, 4, 3)).toBe(0x38);
    expect(minifloatBits(1, 5, 2)).toBe(0x3c);
    expect(minifloatBits(-0, 5, 10)).toBe(0x8000);
  });
});
