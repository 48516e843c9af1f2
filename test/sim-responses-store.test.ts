/**
 * The simulator's Responses store — vLLM's VLLM_ENABLE_RESPONSES_API_STORE=1, the `responsesStore` option — on real
 * sockets, against what vLLM@52a31cce does (docs/simulator.md, `openai/responses/serving.py`): `store` keeps the
 * final response, `background` answers `queued` at once and generates detached from the connection, GET replays a
 * background stream's buffered events (and hangs open when its task died or was cancelled), /cancel stops a queued
 * response; plus `/v1/messages/count_tokens`. Without the option: `store` silently false, `background` a 400.
 */
import { request as httpRequest, type IncomingHttpHeaders } from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import { parseSimArgs } from '../src/sim/main.js';
import { RESPONSES_STORE_LIMIT, ResponseStore, StoredResponse } from '../src/sim/response-store.js';
import { readResponsesRequest, type ResponsesAnswer } from '../src/sim/responses.js';
import { createSimulator, type SimOptions, type Simulator } from '../src/sim/server.js';
import { choiceText } from '../src/sim/wire.js';
import { RESPONSES_STREAM_NAMES, responsesUsage } from './fixtures/vllm-responses.js';
import { endedOf, endOf, nextEnd } from './helpers/sim-records.js';

// ---- harness ----

const FAST: Partial<SimOptions> = { ttftMs: 2, itlMs: 1, jitter: 0, outputTokens: 4, prefillMsPer1kTokens: 0 };
let sims: Simulator[] = [];
const lives: Live[] = [];

afterEach(async () => {
  for (const live of lives.splice(0)) live.destroy();
  await Promise.all(sims.map((s) => s.close()));
  sims = [];
});

/** With the store on unless `responsesStore` says otherwise (null: the default). */
async function start(options: Partial<Omit<SimOptions, 'responsesStore'>> & { responsesStore?: boolean | null } = {}): Promise<{ sim: Simulator; url: string }> {
  const { responsesStore = true, ...rest } = options;
  const sim = createSimulator({ ...FAST, ...rest, ...(responsesStore === null ? {} : { responsesStore }) });
  sims.push(sim);
  const { url } = await sim.listen(0);
  return { sim, url };
}

interface Ended {
  /** The body ended with its chunked terminator (or its content-length). */
  complete: boolean;
  /** A transport error: a reset or a truncated body. */
  error: Error | null;
}

/** One request on its own connection (agent: false), read as it comes: a cut or a hang is never hidden. */
interface Live {
  readonly head: Promise<{ status: number; headers: IncomingHttpHeaders }>;
  readonly ended: Promise<Ended>;
  text(): string;
  isEnded(): boolean;
  /** Resolves with the body so far once it satisfies `predicate` (rejects if the body ends first). */
  until(predicate: (text: string) => boolean): Promise<string>;
  destroy(): void;
}

function open(url: string, method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Live {
  let text = '';
  let ended = false;
  let resolveHead: (head: { status: number; headers: IncomingHttpHeaders }) => void = () => undefined;
  let resolveEnded: (end: Ended) => void = () => undefined;
  const head = new Promise<{ status: number; headers: IncomingHttpHeaders }>((resolve) => (resolveHead = resolve));
  const endedPromise = new Promise<Ended>((resolve) => (resolveEnded = resolve));
  const waiters: Array<{ predicate: (text: string) => boolean; resolve: (text: string) => void; reject: (error: Error) => void }> = [];
  const check = (): void => {
    for (const waiter of waiters.filter((w) => w.predicate(text))) {
      waiters.splice(waiters.indexOf(waiter), 1);
      waiter.resolve(text);
    }
  };
  const finish = (end: Ended): void => {
    if (ended) return;
    ended = true;
    resolveHead({ status: 0, headers: {} }); // no-op once the head came
    resolveEnded(end);
    for (const waiter of waiters.splice(0)) waiter.reject(new Error(`ended before the expected text; got: ${text}`));
  };
  const payload = body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body);
  const req = httpRequest(
    `${url}${path}`,
    { method, agent: false, headers: { ...(payload === undefined ? {} : { 'content-type': 'application/json' }), ...headers } },
    (res) => {
      resolveHead({ status: res.statusCode ?? 0, headers: res.headers });
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        text += chunk;
        check();
      });
      res.on('end', () => finish({ complete: res.complete, error: null }));
      res.on('error', (error) => finish({ complete: false, error }));
      res.on('close', () => finish({ complete: res.complete, error: res.complete ? null : new Error('aborted') }));
    },
  );
  req.on('error', (error) => finish({ complete: false, error }));
  req.end(payload);
  const live: Live = {
    head,
    ended: endedPromise,
    text: () => text,
    isEnded: () => ended,
    until(predicate) {
      if (predicate(text)) return Promise.resolve(text);
      if (ended) return Promise.reject(new Error(`already ended; got: ${text}`));
      return new Promise((resolve, reject) => waiters.push({ predicate, resolve, reject }));
    },
    destroy: () => req.destroy(),
  };
  lives.push(live);
  return live;
}

interface Reply {
  status: number;
  headers: IncomingHttpHeaders;
  text: string;
  complete: boolean;
  error: Error | null;
}

async function call(url: string, method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<Reply> {
  const live = open(url, method, path, body, headers);
  const { status, headers: responseHeaders } = await live.head;
  const { complete, error } = await live.ended;
  return { status, headers: responseHeaders, text: live.text(), complete, error };
}

const postResponses = (url: string, body: Record<string, unknown>, headers: Record<string, string> = {}): Promise<Reply> =>
  call(url, 'POST', '/v1/responses', { model: 'sim-model', input: 'Say hello, world', ...body }, headers);
const getResponse = (url: string, id: string, query = ''): Promise<Reply> => call(url, 'GET', `/v1/responses/${id}${query}`);
const cancel = (url: string, id: string): Promise<Reply> => call(url, 'POST', `/v1/responses/${id}/cancel`);

interface Named {
  name: string;
  data: Record<string, unknown>;
}

/** The complete named events of an LF-framed stream. */
function eventsOf(text: string): Named[] {
  const end = text.lastIndexOf('\n\n');
  if (end < 0) return [];
  return text
    .slice(0, end)
    .split('\n\n')
    .map((block) => {
      const match = /^event: ([^\n]+)\ndata: ([^\n]*)$/.exec(block);
      expect(match, block).not.toBeNull();
      return { name: match?.[1] ?? '', data: JSON.parse(match?.[2] ?? 'null') as Record<string, unknown> };
    });
}

const names = (events: Named[]): string[] => events.map((e) => e.name);
const sequence = (events: Named[]): unknown[] => events.map((e) => e.data.sequence_number);
const countOf = (name: string) => (text: string): number => eventsOf(text).filter((e) => e.name === name).length;
const deltas = countOf('response.output_text.delta');
const range = (from: number, to: number): number[] => Array.from({ length: to - from }, (_, i) => from + i);

/** ceil(16 chars / 4) */
const PROMPT_TOKENS = 4;
const NOT_FOUND = (id: string) => ({ error: { message: `Response with id '${id}' not found.`, type: 'invalid_request_error', param: 'response_id', code: 404 } });
const CANNOT_CANCEL = { error: { message: 'Cannot cancel a synchronous response.', type: 'invalid_request_error', param: 'response_id', code: 400 } };

function metricValue(text: string, series: string): number {
  const line = text.split('\n').find((l) => l.startsWith(series));
  return Number(line?.slice(line.lastIndexOf(' ') + 1));
}

// ---- without the store (vLLM's default) ----

describe('without responsesStore (vLLM without VLLM_ENABLE_RESPONSES_API_STORE)', () => {
  it('is off by default: store is silently false, background is a 400, GET and /cancel find nothing', async () => {
    const { sim, url } = await start({ responsesStore: null });
    const answered = await postResponses(url, { store: true });
    expect(answered.status).toBe(200);
    const id = (JSON.parse(answered.text) as { id: string }).id;
    expect(JSON.parse((await getResponse(url, id)).text)).toEqual(NOT_FOUND(id));
    const cancelled = await cancel(url, id);
    expect(cancelled.status).toBe(404);
    expect(JSON.parse(cancelled.text)).toEqual(NOT_FOUND(id));

    const background = await postResponses(url, { background: true });
    expect(background.status).toBe(400);
    expect(JSON.parse(background.text)).toMatchObject({ error: { type: 'invalid_request_error', param: 'background', code: 400 } });
    expect(sim.stats().byRoute).toMatchObject({ responses: 2, responses_retrieve: 1, responses_cancel: 1 });
  });
});

// ---- store ----

describe('store (default true): the final response is kept', () => {
  it('a non-streaming answer is stored as sent; GET answers it, /cancel refuses it; store: false keeps nothing', async () => {
    const { sim, url } = await start();
    const answered = await postResponses(url, {});
    const id = (JSON.parse(answered.text) as { id: string }).id;
    const read = await getResponse(url, id);
    expect(read.status).toBe(200);
    expect(read.headers['content-type']).toBe('application/json');
    expect(read.text).toBe(answered.text);
    expect(JSON.parse(read.text)).toMatchObject({ status: 'completed', background: false, usage: responsesUsage(PROMPT_TOKENS, 4) });

    const refused = await cancel(url, id);
    expect(refused.status).toBe(400);
    expect(JSON.parse(refused.text)).toEqual(CANNOT_CANCEL);

    const unstored = JSON.parse((await postResponses(url, { store: false })).text) as { id: string };
    expect((await getResponse(url, unstored.id)).status).toBe(404);

    const missing = await getResponse(url, 'resp_nobody');
    expect(missing.status).toBe(404);
    expect(JSON.parse(missing.text)).toEqual(NOT_FOUND('resp_nobody'));
    const records = sim.stats().recent.filter((r) => r.route === 'responses_retrieve');
    expect(records.map((r) => [r.responseId, r.end, r.status])).toEqual([
      [id, 'completed', 200],
      [unstored.id, 'rejected', 404],
      ['resp_nobody', 'rejected', 404],
    ]);
    expect(sim.stats().recent.find((r) => r.route === 'responses_cancel')).toMatchObject({ responseId: id, end: 'rejected', status: 400 });
  });

  it('a stream is stored at its end as response.completed carries it; GET ?stream=true of it is a 200, then the connection is cut', async () => {
    const { sim, url } = await start();
    const streamed = await postResponses(url, { stream: true });
    const events = eventsOf(streamed.text);
    const completed = events.at(-1)?.data.response as { id: string };
    expect(events.at(-1)?.name).toBe('response.completed');
    const read = await getResponse(url, completed.id);
    expect(JSON.parse(read.text)).toEqual(completed);

    // Only a background stream has buffered events: vLLM's generator raises after the 200.
    const ended = nextEnd(sim);
    const replay = await getResponse(url, completed.id, '?stream=true');
    expect(replay.status).toBe(200);
    expect(replay.headers['content-type']).toBe('text/event-stream; charset=utf-8');
    expect(replay.text).toBe('');
    expect(replay.complete).toBe(false);
    expect(await ended).toMatchObject({ route: 'responses_retrieve', stream: true, end: 'rejected', status: 200, responseId: completed.id });
  });

  it('a stream cut by an engine error, or abandoned by its client, stores nothing', async () => {
    const { sim, url } = await start();
    const cut = await postResponses(url, { stream: true }, { 'x-sim-fault': 'error_after=2' });
    expect(cut.complete).toBe(false);
    const id = (eventsOf(cut.text)[0]?.data.response as { id: string }).id;
    expect((await getResponse(url, id)).status).toBe(404);

    const live = open(url, 'POST', '/v1/responses', { model: 'sim-model', input: 'Say hello, world', stream: true }, { 'x-sim-fault': 'itl_ms=20' });
    const left = (eventsOf(await live.until((text) => deltas(text) >= 1))[0]?.data.response as { id: string }).id;
    const ended = endOf(sim, (r) => r.route === 'responses');
    live.destroy();
    expect(await ended).toMatchObject({ responseId: left, end: 'client_disconnect' });
    expect((await getResponse(url, left)).status).toBe(404);
  });

  it('previous_response_id continues a stored response: its prompt and output count toward the prompt; an unknown id is a 404', async () => {
    const { url } = await start();
    const first = JSON.parse((await postResponses(url, {})).text) as { id: string };
    const next = JSON.parse((await postResponses(url, { previous_response_id: first.id })).text) as { previous_response_id: string; usage: { input_tokens: number } };
    expect(next.previous_response_id).toBe(first.id);
    const chars = 'Say hello, world'.length * 2 + choiceText(0, 0, 4).length;
    expect(next.usage.input_tokens).toBe(Math.ceil(chars / 4));

    const unknown = await postResponses(url, { previous_response_id: 'resp_gone' });
    expect(unknown.status).toBe(404);
    expect(JSON.parse(unknown.text)).toEqual(NOT_FOUND('resp_gone'));
  });

  it('is bounded: past its limit the oldest response whose generation is not running is forgotten', () => {
    const answer = (id: string): ResponsesAnswer => {
      const read = readResponsesRequest({ input: 'x', request_id: id }, ['sim-model'], { model: null, stream: false, n: 1, includeUsage: null }, false, { contextChars: () => 0 });
      if (!read.ok) throw new Error(read.refusal.body);
      return { request: read.request, id, createdAt: 0, tokens: 1, finishReason: 'stop', promptTokens: 1, cachedTokens: 0, usage: true };
    };
    expect(RESPONSES_STORE_LIMIT).toBe(10_000);
    const store = new ResponseStore(2);
    const running = new StoredResponse(answer('a'), 'queued', null);
    running.task = { cancel: () => undefined };
    store.put(running);
    store.put(new StoredResponse(answer('b'), 'queued', null));
    store.put(new StoredResponse(answer('c'), 'queued', null));
    expect([store.get('a'), store.get('b'), store.get('c')].map((e) => e?.id)).toEqual(['a', undefined, 'c']);
    expect(store.size).toBe(2);
  });
});

// ---- background ----

describe('background: true', () => {
  it('answers at once with the queued response, runs the generation detached, and stores its final response', async () => {
    const { sim, url } = await start();
    const ended = endOf(sim, (r) => r.route === 'responses');
    const ack = await postResponses(url, { background: true }, { 'x-sim-fault': 'ttft_ms=50' });
    expect(ack.status).toBe(200);
    expect(ack.headers['content-type']).toBe('application/json');
    const queued = JSON.parse(ack.text) as Record<string, unknown>;
    expect(queued).toMatchObject({ object: 'response', status: 'queued', output: [], usage: null, background: true, incomplete_details: null });
    expect(String(queued.id)).toMatch(/^resp_[0-9a-f]{16}$/);
    // The generation is still waiting for its first token: what GET sees is the acknowledgement itself.
    expect((await getResponse(url, String(queued.id))).text).toBe(ack.text);

    const record = await ended;
    expect(record).toMatchObject({ route: 'responses', responseId: queued.id, end: 'completed', status: 200, stream: false, outputEventsSent: 4, completionTokensSent: 4, promptTokens: PROMPT_TOKENS });
    const final = JSON.parse((await getResponse(url, String(queued.id))).text) as Record<string, unknown>;
    expect(final).toMatchObject({ id: queued.id, created_at: queued.created_at, status: 'completed', background: true, usage: responsesUsage(PROMPT_TOKENS, 4) });
    expect(final.output).toMatchObject([{ type: 'message', content: [{ type: 'output_text', text: choiceText(0, 0, 4) }] }]);
    expect(sim.stats()).toMatchObject({ inflight: 0, completed: 3, byStatus: { 200: 3 }, tokens: { prompt: PROMPT_TOKENS, completion: 4 } });
    const metrics = (await call(url, 'GET', '/metrics')).text;
    expect(metricValue(metrics, 'vllm:request_success_total{model_name="sim-model",engine="0",finished_reason="stop"}')).toBe(1);
    expect(metricValue(metrics, 'vllm:generation_tokens_total')).toBe(4);

    // A length-capped generation ends incomplete.
    const capped = JSON.parse((await postResponses(url, { background: true, max_output_tokens: 2 })).text) as { id: string };
    await endedOf(sim, (r) => r.responseId === capped.id && r.route === 'responses');
    expect(JSON.parse((await getResponse(url, capped.id)).text)).toMatchObject({ status: 'incomplete', incomplete_details: { reason: 'max_output_tokens' } });
  });

  it('with stream: the connection replays the buffered events from sequence number 0 and ends at response.completed; the status goes queued → completed, never in_progress', async () => {
    const { sim, url } = await start();
    const live = open(url, 'POST', '/v1/responses', { model: 'sim-model', input: 'Say hello, world', background: true, stream: true }, { 'x-sim-fault': 'itl_ms=50' });
    expect((await live.head).headers['content-type']).toBe('text/event-stream; charset=utf-8');
    const mid = eventsOf(await live.until((text) => deltas(text) >= 1));
    const id = (mid[0]?.data.response as { id: string }).id;
    // Mid-generation: the events say in_progress, the store still says queued.
    expect(mid[0]?.data.response).toMatchObject({ status: 'in_progress', background: true, output: [], usage: null });
    expect(JSON.parse((await getResponse(url, id)).text)).toMatchObject({ status: 'queued' });

    const end = await live.ended;
    expect(end).toEqual({ complete: true, error: null });
    const events = eventsOf(live.text());
    expect(names(events)).toEqual(RESPONSES_STREAM_NAMES);
    expect(sequence(events)).toEqual(range(0, 12));
    const completed = events.at(-1)?.data.response as Record<string, unknown>;
    expect(completed).toMatchObject({ id, status: 'completed', background: true, usage: responsesUsage(PROMPT_TOKENS, 4) });
    expect(JSON.parse((await getResponse(url, id)).text)).toEqual(completed);
    expect(sim.stats().recent.find((r) => r.route === 'responses')).toMatchObject({ responseId: id, stream: true, end: 'completed' });
  });

  it('GET ?stream=true&starting_after=N replays the events after sequence number N (Python indexing included); the whole buffer without it', async () => {
    const { sim, url } = await start();
    const streamed = eventsOf((await postResponses(url, { background: true, stream: true })).text);
    const id = (streamed[0]?.data.response as { id: string }).id;

    const ended = nextEnd(sim);
    const after5 = await getResponse(url, id, '?stream=true&starting_after=5');
    expect(after5.complete).toBe(true);
    const replayed = eventsOf(after5.text);
    expect(sequence(replayed)).toEqual(range(6, 12));
    expect(replayed.map((e) => e.data)).toEqual(streamed.slice(6).map((e) => e.data));
    expect(await ended).toMatchObject({ route: 'responses_retrieve', responseId: id, stream: true, end: 'completed', status: 200 });

    expect(eventsOf((await getResponse(url, id, '?stream=1')).text).map((e) => e.data)).toEqual(streamed.map((e) => e.data));
    // starting_after=-3: vLLM's deque[-2], deque[-1] (response.completed), then it returns.
    expect(sequence(eventsOf((await getResponse(url, id, '?stream=true&starting_after=-3')).text))).toEqual([10, 11]);
    // deque[-100] raises IndexError after the 200: the connection is cut.
    const cut = await getResponse(url, id, '?stream=true&starting_after=-101');
    expect([cut.status, cut.text, cut.complete]).toEqual([200, '', false]);
    // stream=false (or absent): the stored JSON.
    expect(JSON.parse((await getResponse(url, id, '?stream=false&starting_after=3')).text)).toMatchObject({ id, status: 'completed' });

    const invalid = await getResponse(url, id, '?stream=maybe');
    expect(invalid.status).toBe(400);
    expect(JSON.parse(invalid.text)).toMatchObject({ error: { type: 'Bad Request', code: 400 } });
    expect((await getResponse(url, id, '?starting_after=x')).status).toBe(400);
  });

  it('a client that leaves does not stop the generation', async () => {
    const { sim, url } = await start();
    const ended = endOf(sim, (r) => r.route === 'responses');
    const live = open(url, 'POST', '/v1/responses', { model: 'sim-model', input: 'Say hello, world', background: true, stream: true }, { 'x-sim-fault': 'itl_ms=10' });
    const id = (eventsOf(await live.until((text) => deltas(text) >= 1))[0]?.data.response as { id: string }).id;
    live.destroy();
    expect(await ended).toMatchObject({ responseId: id, end: 'completed', outputEventsSent: 4 });
    expect(sim.stats().clientDisconnects).toBe(0);
    expect(JSON.parse((await getResponse(url, id)).text)).toMatchObject({ status: 'completed' });
    // The whole stream is still there to replay.
    expect(names(eventsOf((await getResponse(url, id, '?stream=true')).text))).toEqual(RESPONSES_STREAM_NAMES);
  });

  it('an engine error kills the task: the status stays queued for ever, and every stream of it stays open and idle until its client leaves', async () => {
    const { sim, url } = await start();
    const died = endOf(sim, (r) => r.route === 'responses');
    const live = open(url, 'POST', '/v1/responses', { model: 'sim-model', input: 'Say hello, world', background: true, stream: true }, { 'x-sim-fault': 'error_after=2' });
    const record = await died;
    expect(record).toMatchObject({ end: 'fault', fault: 'error_after', status: 200, outputEventsSent: 2 });
    const id = String(record.responseId);
    const buffered = await live.until((text) => deltas(text) === 2);
    expect(names(eventsOf(buffered))).toEqual(RESPONSES_STREAM_NAMES.slice(0, 6));

    expect(JSON.parse((await getResponse(url, id)).text)).toMatchObject({ id, status: 'queued', output: [], usage: null });
    // A replay of it hangs the same way: its request does not end until the client leaves.
    const replay = open(url, 'GET', `/v1/responses/${id}?stream=true&starting_after=1`);
    expect(sequence(eventsOf(await replay.until((text) => deltas(text) === 2)))).toEqual(range(2, 6));
    expect(sim.stats().inflight).toBe(1);
    expect(live.isEnded()).toBe(false);
    expect(live.text()).toBe(buffered);
    const left = nextEnd(sim);
    replay.destroy();
    expect(await left).toMatchObject({ route: 'responses_retrieve', end: 'client_disconnect', status: 200 });

    // Queued for ever, so still cancellable (there is no task left to stop).
    expect(JSON.parse((await cancel(url, id)).text)).toMatchObject({ id, status: 'cancelled' });
    expect(live.isEnded()).toBe(false);
    live.destroy();
    expect(sim.stats().faultsInjected.error_after).toBe(1);
  });

  it('without stream, an engine error leaves the response queued too', async () => {
    const { sim, url } = await start();
    const queued = JSON.parse((await postResponses(url, { background: true }, { 'x-sim-fault': 'error_before_output' })).text) as { id: string };
    expect(await endedOf(sim, (r) => r.responseId === queued.id && r.route === 'responses')).toMatchObject({ end: 'fault', outputEventsSent: 0 });
    expect(JSON.parse((await getResponse(url, queued.id)).text)).toMatchObject({ status: 'queued' });
  });

  it('/cancel stops a queued response: the response is cancelled, its generation aborted, its stream left hanging', async () => {
    const { sim, url } = await start();
    const live = open(url, 'POST', '/v1/responses', { model: 'sim-model', input: 'Say hello, world', background: true, stream: true }, { 'x-sim-fault': 'itl_ms=50; tokens=100' });
    const id = (eventsOf(await live.until((text) => deltas(text) >= 1))[0]?.data.response as { id: string }).id;
    const stopped = endOf(sim, (r) => r.route === 'responses');
    const cancelled = await cancel(url, id);
    expect(cancelled.status).toBe(200);
    const body = JSON.parse(cancelled.text) as Record<string, unknown>;
    expect(body).toMatchObject({ id, status: 'cancelled', output: [], usage: null, background: true });
    const record = await stopped;
    expect(record).toMatchObject({ end: 'cancelled', status: 200 });
    expect(record.outputEventsSent).toBeLessThan(100);
    expect(JSON.parse((await getResponse(url, id)).text)).toEqual(body);
    expect(JSON.parse((await cancel(url, id)).text)).toEqual(CANNOT_CANCEL);
    const seen = live.text();
    expect(live.isEnded()).toBe(false);
    expect(seen).not.toContain('response.completed');
    expect(deltas(seen)).toBe(record.outputEventsSent);
    live.destroy();

    // A stalled generation (queued for ever) is cancelled the same way, without a stream.
    const stalled = JSON.parse((await postResponses(url, { background: true }, { 'x-sim-fault': 'stall_after=0' })).text) as { id: string };
    const ended = endOf(sim, (r) => r.responseId === stalled.id && r.route === 'responses');
    expect(JSON.parse((await cancel(url, stalled.id)).text)).toMatchObject({ status: 'cancelled' });
    expect(await ended).toMatchObject({ end: 'cancelled', fault: 'stall_after' });
    expect(sim.stats()).toMatchObject({ inflight: 0, clientDisconnects: 0 });
    const metrics = (await call(url, 'GET', '/metrics')).text;
    expect(metricValue(metrics, 'vllm:request_success_total{model_name="sim-model",engine="0",finished_reason="stop"}')).toBe(0);
    expect(metricValue(metrics, 'vllm:num_requests_running')).toBe(0);
  });

  it('honours status and reset_before_response on the request; stream-only faults are ignored', async () => {
    const { sim, url } = await start();
    const refused = await postResponses(url, { background: true }, { 'x-sim-fault': 'status=503' });
    expect(refused.status).toBe(503);
    const ignored = JSON.parse((await postResponses(url, { background: true }, { 'x-sim-fault': 'malformed_after=1' })).text) as { id: string };
    expect(await endedOf(sim, (r) => r.responseId === ignored.id && r.route === 'responses')).toMatchObject({ end: 'completed', fault: null });
    // The framing modifiers shape the request's own replay, not what is buffered.
    const framed = await postResponses(url, { background: true, stream: true }, { 'x-sim-fault': 'framing=crlf' });
    expect(framed.text.endsWith('\r\n\r\n')).toBe(true);
    const id = /"id":"(resp_[0-9a-f]{16})"/.exec(framed.text)?.[1] ?? '';
    expect(names(eventsOf((await getResponse(url, id, '?stream=true')).text))).toEqual(RESPONSES_STREAM_NAMES);
  });
});

// ---- the stored-response routes ----

describe('GET /v1/responses/{id} and POST …/cancel', () => {
  it('take their method only, need the API key, and honour the status and reset_before_response faults', async () => {
    const { sim, url } = await start({ apiKey: 'k' });
    const auth = { authorization: 'Bearer k' };
    const wrong = await call(url, 'POST', '/v1/responses/resp_x', undefined, auth);
    expect([wrong.status, wrong.headers.allow, wrong.text]).toEqual([405, 'GET', '{"detail":"Method Not Allowed"}']);
    expect((await call(url, 'GET', '/v1/responses/resp_x/cancel', undefined, auth)).headers.allow).toBe('POST');
    expect((await call(url, 'GET', '/v1/responses/resp_x')).status).toBe(401);
    expect((await call(url, 'GET', '/v1/responses/resp_x/input_items', undefined, auth)).status).toBe(404);

    const unavailable = await call(url, 'GET', '/v1/responses/resp_x', undefined, { ...auth, 'x-sim-fault': 'status=503' });
    expect([unavailable.status, unavailable.text]).toEqual([503, '{"error":"Service Unavailable"}']);
    const reset = await call(url, 'POST', '/v1/responses/resp_x/cancel', undefined, { ...auth, 'x-sim-fault': 'reset_before_response' });
    expect(reset.error).not.toBeNull();
    // The id is percent-decoded, as Starlette decodes path parameters.
    expect(JSON.parse((await call(url, 'GET', '/v1/responses/resp%5Fy', undefined, auth)).text)).toEqual(NOT_FOUND('resp_y'));
    expect(sim.stats().byRoute).toMatchObject({ responses_retrieve: 4, responses_cancel: 2, other: 1 });
    expect(sim.stats().faultsInjected).toMatchObject({ status: 1, reset_before_response: 1 });
  });
});

describe('POST /v1/messages/count_tokens', () => {
  const MESSAGES = { model: 'sim-model', system: 'Be brief.', messages: [{ role: 'user', content: [{ type: 'text', text: 'Say hello, world' }] }] };

  it('answers the token estimate /v1/messages counts, without max_tokens, engine or usage', async () => {
    const { sim, url } = await start({ responsesStore: false });
    const messagesEnded = endOf(sim, (r) => r.route === 'messages');
    await call(url, 'POST', '/v1/messages', { ...MESSAGES, max_tokens: 8 });
    const prompt = (await messagesEnded).promptTokens;
    expect(prompt).toBe(Math.ceil(('Be brief.'.length + 'Say hello, world'.length) / 4));

    const ended = endOf(sim, (r) => r.route === 'count_tokens');
    const counted = await call(url, 'POST', '/v1/messages/count_tokens', MESSAGES);
    expect(counted.status).toBe(200);
    expect(counted.headers['content-type']).toBe('application/json');
    expect(counted.text).toBe(`{"input_tokens":${prompt},"context_management":{"original_input_tokens":${prompt}}}`);
    expect(await ended).toMatchObject({ path: '/v1/messages/count_tokens', model: 'sim-model', end: 'completed', status: 200, promptTokens: prompt, completionTokensSent: 0 });
    // Tokenising is not generating: no engine counters.
    expect(sim.stats().tokens).toEqual({ prompt, completion: 4 });
    expect(sim.stats().byRoute).toMatchObject({ messages: 1, count_tokens: 1 });
  });

  it('refuses as /v1/messages refuses: unknown model 404 and a dead engine 500 in Anthropic shape, a bad body 400 OpenAI-shaped', async () => {
    const { sim, url } = await start();
    const unknown = await call(url, 'POST', '/v1/messages/count_tokens', { ...MESSAGES, model: 'nope' });
    expect(unknown.status).toBe(404);
    expect(JSON.parse(unknown.text)).toEqual({ type: 'error', error: { type: 'NotFoundError', message: 'The model `nope` does not exist.' } });
    const missing = await call(url, 'POST', '/v1/messages/count_tokens', { model: 'sim-model' });
    expect(missing.status).toBe(400);
    expect(JSON.parse(missing.text)).toMatchObject({ error: { type: 'Bad Request', code: 400 } });
    const get = await call(url, 'GET', '/v1/messages/count_tokens');
    expect(get.status).toBe(405);
    sim.setEngineDead(true);
    const dead = await call(url, 'POST', '/v1/messages/count_tokens', MESSAGES);
    expect(dead.status).toBe(500);
    expect(JSON.parse(dead.text)).toMatchObject({ type: 'error', error: { type: 'internal_error' } });
    sim.setEngineDead(false);
    const faulted = await call(url, 'POST', '/v1/messages/count_tokens', MESSAGES, { 'x-sim-fault': 'status=429' });
    expect(faulted.status).toBe(429);
    expect(JSON.parse(faulted.text)).toMatchObject({ type: 'error', error: { type: 'RateLimitError' } });
  });
});

describe('waybill sim --responses-store', () => {
  it('sets responsesStore', () => {
    expect(parseSimArgs(['--responses-store'])).toMatchObject({ ok: true, args: { options: { responsesStore: true } } });
    expect(parseSimArgs([])).toMatchObject({ ok: true, args: { options: { responsesStore: false } } });
  });
});
