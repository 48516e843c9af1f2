/**
 * Real clients against the real gateway in front of the real simulator, all on loopback sockets: the official
 * `openai` SDK (Responses streaming and not, embeddings) and the official `@anthropic-ai/sdk` (Messages, raw stream
 * and the `messages.stream()` helper). A delivered answer iterates cleanly; every failure after commit raises (Waybill
 * ends the stream with its own `event: error`, or forwards the upstream's); a failure before any output is an APIError
 * with a real HTTP status (Waybill holds the stream until the first output delta); a client that leaves is counted as
 * cancelled and the simulator sees the disconnect.
 *
 * Every case checks the gateway's ledger BY VALUE from one `/metrics` scrape (requests, attempts, anomalies, finish
 * reasons, cancellations, accepted, output checks, tokens, TTFT count, in-flight), and the simulator's own record of the
 * request (its fault and how it ended) — so no case can pass against a stub. SDK retries are off (`maxRetries: 0`) and
 * the gateway makes one attempt (`retries.max_attempts: 1`), so every count is one request's own.
 *
 * Timing: no sleeps; the tests await the SDK, the gateway's settlements and the simulator's request-end events. The only
 * timing-dependent settings, with the simulator's jitter off (TTFT 5 ms, 1 ms between tokens, 8 tokens):
 * - `timeouts.idle` 200 ms: the stall cases wait it out once; a healthy stream's longest gap is ~1 ms (200× margin).
 * - `timeouts.first_output` 300 ms: the stall-before-output cases wait it out; a healthy first output takes ~5 ms (60×).
 * - the cancellation tests use the defaults (idle 30 s, first output 120 s) and abort on an event (the first delta, or
 *   the simulator's request-start), against a stalled or 5-second upstream stream.
 */
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { request } from 'undici';
import { describe, expect, it } from 'vitest';
import { createSimulator, type RequestRecord, type SimStats, type Simulator } from '../src/sim/server.js';
import { choiceText } from '../src/sim/wire.js';
import { useCleanups } from './helpers/cleanups.js';
import { settledAfter } from './helpers/settle.js';
import { metricValue, startStack, type Stack } from './helpers/stack.js';

const cleanups = useCleanups();

const OUTPUT_TOKENS = 8;
/** What the simulator says for 8 tokens: "Hello world, héllo 日本 🙂 the quick". */
const FULL_TEXT = choiceText(0, 0, OUTPUT_TOKENS);
const PROMPT = 'Say hello';
/** ceil(9 chars / 4): the simulator's count, reported in usage. */
const PROMPT_TOKENS = 3;

const FAST = { timeouts: { idle: '200ms', first_output: '300ms' } };

interface SimStack {
  readonly stack: Stack;
  readonly sim: Simulator;
  readonly simUrl: string;
  readonly openai: OpenAI;
  readonly anthropic: Anthropic;
  /** Resolves with the simulator's first `count` request-end records. */
  simEnded(count: number): Promise<RequestRecord[]>;
  /** Resolves with the simulator's next request-start record. */
  simStarted(): Promise<RequestRecord>;
  /** GET /sim/stats over its socket. */
  simStats(): Promise<SimStats>;
}

/** The simulator on a real port, the gateway on another in front of it (one upstream, one attempt, no ejection). */
async function simStack(config: Record<string, unknown> = FAST): Promise<SimStack> {
  const sim = createSimulator({ ttftMs: 5, itlMs: 1, outputTokens: OUTPUT_TOKENS, jitter: 0 });
  const { url: simUrl } = await sim.listen(0, '127.0.0.1');
  cleanups.push(() => sim.close());
  const records: RequestRecord[] = [];
  const waiters: Array<{ count: number; resolve: (r: RequestRecord[]) => void }> = [];
  sim.events.on('request-end', (record: RequestRecord) => {
    records.push(record);
    for (const waiter of waiters.filter((w) => records.length >= w.count)) {
      waiters.splice(waiters.indexOf(waiter), 1);
      waiter.resolve(records.slice());
    }
  });
  const stack = await startStack({
    sims: 0,
    extraUpstreams: [{ name: 'sim', url: simUrl }],
    config: { retries: { max_attempts: 1 }, health: { interval: '1h', eject_after_failures: 1000 }, ...config },
  });
  cleanups.push(() => stack.close());
  return {
    stack,
    sim,
    simUrl,
    openai: new OpenAI({ baseURL: `${stack.base}/v1`, apiKey: 'unused', maxRetries: 0 }),
    anthropic: new Anthropic({ baseURL: stack.base, apiKey: 'unused', maxRetries: 0 }),
    simEnded(count) {
      if (records.length >= count) return Promise.resolve(records.slice());
      return new Promise((resolve) => waiters.push({ count, resolve }));
    },
    simStarted() {
      return new Promise((resolve) => sim.events.once('request-start', resolve));
    },
    async simStats() {
      const response = await request(`${simUrl}/sim/stats`);
      return (await response.body.json()) as SimStats;
    },
  };
}

// --- The gateway's ledger, by value, from one scrape ----------------------------------------------------------------

interface Counters {
  /** waybill_requests_total, "route stream code outcome". */
  requests: Record<string, number>;
  /** waybill_upstream_attempts_total by result. */
  attempts: Record<string, number>;
  /** waybill_stream_anomalies_total by kind. */
  anomalies: Record<string, number>;
  /** waybill_choice_finish_reasons_total by finish_reason. */
  finishReasons: Record<string, number>;
  /** waybill_client_cancellations_total by phase. */
  cancellations: Record<string, number>;
  /** waybill_requests_accepted_total, "route stream". */
  accepted: Record<string, number>;
  /** waybill_output_checks_total, "check result". */
  checks: Record<string, number>;
  promptTokens: number;
  completionTokens: number;
  /** waybill_time_to_first_token_seconds_count. */
  ttft: number;
  inflight: number;
}

/** The non-zero samples of `name`, keyed by the values of `labels` joined by a space. */
function samples(text: string, name: string, labels: string[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`)) continue;
    const value = Number(line.slice(line.lastIndexOf(' ') + 1));
    if (value === 0) continue;
    const have = new Map([...line.slice(name.length + 1, line.indexOf('}')).matchAll(/(\w+)="([^"]*)"/g)].map((m) => [m[1], m[2]]));
    const key = labels.map((label) => have.get(label) ?? '?').join(' ');
    out[key] = (out[key] ?? 0) + value;
  }
  return out;
}

async function counters(stack: Stack): Promise<Counters> {
  const text = await stack.metricsText();
  return {
    requests: samples(text, 'waybill_requests_total', ['route', 'stream', 'code', 'outcome']),
    attempts: samples(text, 'waybill_upstream_attempts_total', ['result']),
    anomalies: samples(text, 'waybill_stream_anomalies_total', ['kind']),
    finishReasons: samples(text, 'waybill_choice_finish_reasons_total', ['finish_reason']),
    cancellations: samples(text, 'waybill_client_cancellations_total', ['phase']),
    accepted: samples(text, 'waybill_requests_accepted_total', ['route', 'stream']),
    checks: samples(text, 'waybill_output_checks_total', ['check', 'result']),
    promptTokens: metricValue(text, 'waybill_prompt_tokens_total'),
    completionTokens: metricValue(text, 'waybill_completion_tokens_total'),
    ttft: metricValue(text, 'waybill_time_to_first_token_seconds_count'),
    inflight: metricValue(text, 'waybill_inflight_requests'),
  };
}

/** The whole expected ledger: whatever is not named is empty or zero. */
function ledger(partial: Partial<Counters>): Counters {
  return {
    requests: {},
    attempts: {},
    anomalies: {},
    finishReasons: {},
    cancellations: {},
    accepted: {},
    checks: {},
    promptTokens: 0,
    completionTokens: 0,
    ttft: 0,
    inflight: 0,
    ...partial,
  };
}

const CHECKS_PASS = { 'answer_present pass': 1, 'not_truncated pass': 1, 'format_valid unevaluated': 1 };
const CHECKS_TRUNCATED = { 'answer_present pass': 1, 'not_truncated fail': 1, 'format_valid unevaluated': 1 };

/** Drains an SDK stream; resolves with the events, rejects with what the SDK raised. */
async function drain<T>(stream: AsyncIterable<T>): Promise<T[]> {
  const events: T[] = [];
  for await (const event of stream) events.push(event);
  return events;
}

const fault = (directive: string) => ({ headers: { 'x-sim-fault': directive } });

// --- OpenAI Responses -----------------------------------------------------------------------------------------------

const RESPONSES = { model: 'sim-model', input: PROMPT };

/** The text of a response object's output (the SDK adds `output_text` only to non-stream answers). */
function outputText(response: OpenAI.Responses.Response): string {
  return response.output
    .flatMap((item) => (item.type === 'message' ? item.content : []))
    .map((part) => (part.type === 'output_text' ? part.text : ''))
    .join('');
}

describe('openai responses.create against the simulator', () => {
  it('stream: a delivered answer iterates to response.completed without raising; usage read and counted', async () => {
    const s = await simStack();
    const stream = await s.openai.responses.create({ ...RESPONSES, stream: true });
    const events = await drain(stream);
    const types = events.map((e) => e.type);
    expect(types.slice(0, 2)).toEqual(['response.created', 'response.in_progress']);
    expect(types.at(-1)).toBe('response.completed');
    expect(events.map((e) => e.sequence_number)).toEqual(events.map((_, i) => i));
    const text = events.map((e) => (e.type === 'response.output_text.delta' ? e.delta : '')).join('');
    expect(text).toBe(FULL_TEXT);
    const completed = events.at(-1);
    if (completed?.type !== 'response.completed') throw new Error('no response.completed');
    expect(completed.response.status).toBe('completed');
    expect(outputText(completed.response)).toBe(FULL_TEXT);
    const usage = completed.response.usage;
    expect(usage).toMatchObject({ input_tokens: PROMPT_TOKENS, output_tokens: OUTPUT_TOKENS, total_tokens: PROMPT_TOKENS + OUTPUT_TOKENS });

    expect(await settledAfter(s.stack, 1)).toMatchObject({ route: 'responses', stream: true, outcome: 'delivered', code: 200, finishReasons: ['stop'] });
    expect(await counters(s.stack)).toEqual(
      ledger({
        requests: { 'responses true 200 delivered': 1 },
        attempts: { ok: 1 },
        finishReasons: { stop: 1 },
        accepted: { 'responses true': 1 },
        checks: CHECKS_PASS,
        promptTokens: usage?.input_tokens ?? -1,
        completionTokens: usage?.output_tokens ?? -1,
        ttft: 1,
      }),
    );
    const [record] = await s.simEnded(1);
    expect(record).toMatchObject({ route: 'responses', fault: null, end: 'completed', outputEventsSent: OUTPUT_TOKENS, completionTokensSent: OUTPUT_TOKENS });
  });

  it('non-stream: the response object, with its usage', async () => {
    const s = await simStack();
    const response = await s.openai.responses.create({ ...RESPONSES, stream: false });
    expect(response).toMatchObject({ object: 'response', status: 'completed', usage: { input_tokens: PROMPT_TOKENS, output_tokens: OUTPUT_TOKENS } });
    expect(response.output_text).toBe(FULL_TEXT);
    expect(await settledAfter(s.stack, 1)).toMatchObject({ route: 'responses', stream: false, outcome: 'delivered', code: 200 });
    expect(await counters(s.stack)).toEqual(
      ledger({
        requests: { 'responses false 200 delivered': 1 },
        attempts: { ok: 1 },
        finishReasons: { stop: 1 },
        accepted: { 'responses false': 1 },
        checks: CHECKS_PASS,
        promptTokens: PROMPT_TOKENS,
        completionTokens: OUTPUT_TOKENS,
      }),
    );
  });

  it.each([true, false])('max_output_tokens cap (stream %s): status incomplete, delivered with finish reason length, not accepted', async (streaming) => {
    const s = await simStack();
    const cap = 3;
    let response: OpenAI.Responses.Response;
    if (streaming) {
      const events = await drain(await s.openai.responses.create({ ...RESPONSES, stream: true, max_output_tokens: cap }));
      const last = events.at(-1);
      if (last?.type !== 'response.completed') throw new Error(`last event ${String(last?.type)}`);
      response = last.response;
    } else {
      response = await s.openai.responses.create({ ...RESPONSES, stream: false, max_output_tokens: cap });
    }
    expect(response).toMatchObject({ status: 'incomplete', incomplete_details: { reason: 'max_output_tokens' }, usage: { output_tokens: cap } });
    expect(outputText(response)).toBe(choiceText(0, 0, cap));
    expect(await settledAfter(s.stack, 1)).toMatchObject({ outcome: 'delivered', finishReasons: ['length'], accepted: false, failedChecks: ['not_truncated'] });
    expect(await counters(s.stack)).toEqual(
      ledger({
        requests: { [`responses ${String(streaming)} 200 delivered`]: 1 },
        attempts: { ok: 1 },
        finishReasons: { length: 1 },
        checks: CHECKS_TRUNCATED,
        promptTokens: PROMPT_TOKENS,
        completionTokens: cap,
        ttft: streaming ? 1 : 0,
      }),
    );
  });

  // After commit: some output reached the client, then the upstream broke. Waybill ends the stream with its own
  // `event: error` (data with a truthy `error`), which openai-node raises on.
  it.each([
    // vLLM's engine error on this route: its error event fails validation and the connection is cut (FIN, no terminator).
    { directive: 'error_after=3', code: 'stream_truncated', outcome: 'incomplete', attempt: 'reset', anomalies: {}, end: 'fault', sent: 3 },
    { directive: 'reset_after=3', code: 'stream_truncated', outcome: 'incomplete', attempt: 'reset', anomalies: {}, end: 'fault', sent: 3 },
    // The idle timeout (200 ms) ends it; Waybill closes the upstream connection, which the simulator sees.
    { directive: 'stall_after=3', code: 'stream_timeout', outcome: 'timeout', attempt: 'timeout', anomalies: {}, end: 'client_disconnect', sent: 3 },
    // A clean end after output, without response.completed.
    { directive: 'end_after=3', code: 'stream_truncated', outcome: 'incomplete', attempt: 'incomplete', anomalies: { missing_done: 1, missing_finish_reason: 1 }, end: 'fault', sent: 3 },
    // Every event but response.completed, then a clean end: the whole text arrived, still not delivered.
    { directive: 'no_done', code: 'stream_truncated', outcome: 'incomplete', attempt: 'incomplete', anomalies: { missing_done: 1, missing_finish_reason: 1 }, end: 'fault', sent: OUTPUT_TOKENS },
  ])('stream, $directive after output: the SDK raises ($code), counted $outcome', async ({ directive, code, outcome, attempt, anomalies, end, sent }) => {
    const s = await simStack();
    const stream = await s.openai.responses.create({ ...RESPONSES, stream: true }, fault(directive));
    const seen: OpenAI.Responses.ResponseStreamEvent[] = [];
    const error = await (async () => {
      try {
        for await (const event of stream) seen.push(event);
      } catch (caught) {
        return caught;
      }
      return undefined;
    })();
    expect(error).toBeInstanceOf(OpenAI.APIError);
    expect(error).toMatchObject({ code, status: undefined });
    expect(seen.some((e) => e.type === 'response.completed')).toBe(false);
    expect(seen.filter((e) => e.type === 'response.output_text.delta').map((e) => (e.type === 'response.output_text.delta' ? e.delta : '')).join('')).toBe(choiceText(0, 0, sent));

    expect(await settledAfter(s.stack, 1)).toMatchObject({ route: 'responses', outcome, code: 200 });
    expect(await counters(s.stack)).toEqual(
      ledger({
        requests: { [`responses true 200 ${outcome}`]: 1 },
        attempts: { [attempt]: 1 },
        anomalies,
        finishReasons: { none: 1 },
        ttft: 1,
      }),
    );
    const [record] = await s.simEnded(1);
    expect(record).toMatchObject({ route: 'responses', fault: directive.replace(/=.*/, ''), end, outputEventsSent: sent });
  });

  // Before any output: Waybill has held response.created / in_progress, so the client gets a real status.
  it.each([
    // vLLM's lazy validation error on this route: created, in_progress, then the cut. The 400 is lost upstream.
    { directive: 'error_before_output', status: 502, code: 'upstream_reset', outcome: 'failed', attempt: 'reset', end: 'fault' },
    { directive: 'error_after=0; error_code=503', status: 502, code: 'upstream_reset', outcome: 'failed', attempt: 'reset', end: 'fault' },
    { directive: 'reset_after=0', status: 502, code: 'upstream_reset', outcome: 'failed', attempt: 'reset', end: 'fault' },
    { directive: 'reset_before_response', status: 502, code: 'upstream_reset', outcome: 'failed', attempt: 'reset', end: 'fault' },
    { directive: 'end_after=0', status: 502, code: 'upstream_incomplete', outcome: 'failed', attempt: 'incomplete', end: 'fault', anomalies: { missing_done: 1, missing_finish_reason: 1 } },
    // Created and in_progress, then nothing: timeouts.first_output (300 ms).
    { directive: 'stall_after=0', status: 504, code: 'upstream_timeout', outcome: 'timeout', attempt: 'timeout', end: 'client_disconnect' },
    { directive: 'status=503', status: 502, code: 'upstream_error', outcome: 'failed', attempt: 'http_5xx', end: 'fault' },
    // 4xx are relayed with vLLM's own fields.
    { directive: 'status=400', status: 400, code: 400, outcome: 'rejected', attempt: 'http_4xx', end: 'fault' },
    { directive: 'status=404', status: 404, code: 404, outcome: 'rejected', attempt: 'http_4xx', end: 'fault' },
    { directive: 'status=429', status: 429, code: 429, outcome: 'rejected', attempt: 'http_4xx', end: 'fault' },
  ])('stream, $directive before output: APIError $status ($code), counted $outcome', async ({ directive, status, code, outcome, attempt, end, anomalies = {} }) => {
    const s = await simStack();
    const error: unknown = await s.openai.responses.create({ ...RESPONSES, stream: true }, fault(directive)).then(
      () => undefined,
      (caught: unknown) => caught,
    );
    expect(error).toBeInstanceOf(OpenAI.APIError);
    expect(error).toMatchObject({ status, code });
    expect(await settledAfter(s.stack, 1)).toMatchObject({ route: 'responses', outcome, code: status, finishReasons: [] });
    expect(await counters(s.stack)).toEqual(
      ledger({
        requests: { [`responses true ${status} ${outcome}`]: 1 },
        attempts: { [attempt]: 1 },
        anomalies,
      }),
    );
    const [record] = await s.simEnded(1);
    expect(record).toMatchObject({ route: 'responses', fault: directive.replace(/[=;].*/, ''), end, outputEventsSent: 0 });
  });

  it.each([
    { directive: 'error_after=2', status: 502, attempt: 'http_5xx', outcome: 'failed' },
    { directive: 'error_before_output', status: 400, attempt: 'http_4xx', outcome: 'rejected' },
    { directive: 'reset_after=2', status: 502, attempt: 'reset', outcome: 'failed' },
  ])('non-stream, $directive: APIError $status, counted $outcome', async ({ directive, status, attempt, outcome }) => {
    const s = await simStack();
    await expect(s.openai.responses.create({ ...RESPONSES, stream: false }, fault(directive))).rejects.toMatchObject({ status });
    expect(await counters(s.stack)).toEqual(
      ledger({
        requests: { [`responses false ${status} ${outcome}`]: 1 },
        attempts: { [attempt]: 1 },
      }),
    );
    expect((await s.simEnded(1))[0]).toMatchObject({ route: 'responses', end: 'fault', stream: false });
  });
});

// --- Anthropic Messages ---------------------------------------------------------------------------------------------

const MESSAGES = { model: 'sim-model', max_tokens: 64, messages: [{ role: 'user' as const, content: PROMPT }] };

type Style = 'create' | 'helper';

/** Streams one Messages request either way the SDK offers; resolves with the text and stop reason, or rejects. */
async function streamMessage(client: Anthropic, style: Style, options: { headers?: Record<string, string> } = {}): Promise<{ text: string; stopReason: string | null; outputTokens: number; types: string[] }> {
  if (style === 'create') {
    const stream = await client.messages.create({ ...MESSAGES, stream: true }, options);
    let text = '';
    let stopReason: string | null = null;
    let outputTokens = -1;
    const types: string[] = [];
    for await (const event of stream) {
      types.push(event.type);
      if (event.type === 'content_block_delta' && event.delta.type === 'text_delta') text += event.delta.text;
      if (event.type === 'message_delta') {
        stopReason = event.delta.stop_reason;
        outputTokens = event.usage.output_tokens;
      }
    }
    return { text, stopReason, outputTokens, types };
  }
  // The helper: finalMessage() resolves only on a complete message, and rejects with what the stream raised. (Its
  // async iterator may end quietly on an error that arrives while no read is pending, so it is not the judge here.)
  const stream = client.messages.stream(MESSAGES, options);
  const types: string[] = [];
  stream.on('streamEvent', (event) => types.push(event.type));
  const message = await stream.finalMessage();
  const text = message.content.map((block) => (block.type === 'text' ? block.text : '')).join('');
  return { text, stopReason: message.stop_reason, outputTokens: message.usage.output_tokens, types };
}

describe('anthropic messages against the simulator', () => {
  it.each<Style>(['create', 'helper'])('stream (%s): a delivered answer iterates to message_stop; usage counted', async (style) => {
    const s = await simStack();
    const result = await streamMessage(s.anthropic, style);
    expect(result).toMatchObject({ text: FULL_TEXT, stopReason: 'end_turn', outputTokens: OUTPUT_TOKENS });
    expect(result.types.at(0)).toBe('message_start');
    expect(result.types.at(-1)).toBe('message_stop');
    expect(await settledAfter(s.stack, 1)).toMatchObject({ route: 'messages', stream: true, outcome: 'delivered', finishReasons: ['stop'] });
    expect(await counters(s.stack)).toEqual(
      ledger({
        requests: { 'messages true 200 delivered': 1 },
        attempts: { ok: 1 },
        finishReasons: { stop: 1 },
        accepted: { 'messages true': 1 },
        checks: CHECKS_PASS,
        promptTokens: PROMPT_TOKENS,
        completionTokens: OUTPUT_TOKENS,
        ttft: 1,
      }),
    );
    expect((await s.simEnded(1))[0]).toMatchObject({ route: 'messages', fault: null, end: 'completed', outputEventsSent: OUTPUT_TOKENS });
  });

  it('non-stream: the message with its stop reason and usage', async () => {
    const s = await simStack();
    const message = await s.anthropic.messages.create(MESSAGES);
    expect(message).toMatchObject({ type: 'message', stop_reason: 'end_turn', usage: { input_tokens: PROMPT_TOKENS, output_tokens: OUTPUT_TOKENS } });
    expect(message.content).toEqual([{ type: 'text', text: FULL_TEXT }]);
    expect(await counters(s.stack)).toEqual(
      ledger({
        requests: { 'messages false 200 delivered': 1 },
        attempts: { ok: 1 },
        finishReasons: { stop: 1 },
        accepted: { 'messages false': 1 },
        checks: CHECKS_PASS,
        promptTokens: PROMPT_TOKENS,
        completionTokens: OUTPUT_TOKENS,
      }),
    );
  });

  const AFTER_COMMIT = [
    // vLLM's converter turns the engine error into `event: error` (internal_error) and ends cleanly: forwarded as is.
    { directive: 'error_after=3', type: 'internal_error', outcome: 'stream_error', attempt: 'error_payload', anomalies: { error_payload: 1 }, end: 'fault', sent: 3 },
    { directive: 'reset_after=3', type: 'api_error', outcome: 'incomplete', attempt: 'reset', anomalies: {}, end: 'fault', sent: 3 },
    { directive: 'stall_after=3', type: 'timeout_error', outcome: 'timeout', attempt: 'timeout', anomalies: {}, end: 'client_disconnect', sent: 3 },
    { directive: 'end_after=3', type: 'api_error', outcome: 'incomplete', attempt: 'incomplete', anomalies: { missing_done: 1, missing_finish_reason: 1 }, end: 'fault', sent: 3 },
    // Everything but message_stop: a stop reason and usage, still not delivered.
    { directive: 'no_done', type: 'api_error', outcome: 'incomplete', attempt: 'incomplete', anomalies: { missing_done: 1 }, end: 'fault', sent: OUTPUT_TOKENS },
    // message_stop without content_block_stop / message_delta: no stop reason, so message_stop is held back.
    { directive: 'drop_finish', type: 'api_error', outcome: 'incomplete', attempt: 'incomplete', anomalies: { missing_finish_reason: 1 }, end: 'fault', sent: OUTPUT_TOKENS },
  ];

  it.each((['create', 'helper'] as const).flatMap((style) => AFTER_COMMIT.map((c) => ({ style, ...c }))))(
    'stream ($style), $directive after output: the SDK raises ($type), counted $outcome',
    async ({ style, directive, type, outcome, attempt, anomalies, end, sent }) => {
      const s = await simStack();
      const error: unknown = await streamMessage(s.anthropic, style, fault(directive)).then(
        (result) => result,
        (caught: unknown) => caught,
      );
      expect(error).toBeInstanceOf(Anthropic.APIError);
      expect(error).toMatchObject({ status: undefined, type });

      // Only no_done got as far as a stop reason (message_delta); message_stop never came, or was held back.
      const finish = directive === 'no_done' ? 'stop' : 'none';
      expect(await settledAfter(s.stack, 1)).toMatchObject({ route: 'messages', outcome, code: 200, finishReasons: [finish] });
      expect(await counters(s.stack)).toEqual(
        ledger({
          requests: { [`messages true 200 ${outcome}`]: 1 },
          attempts: { [attempt]: 1 },
          anomalies,
          finishReasons: { [finish]: 1 },
          // Usage counts from message_delta only (message_start's input_tokens is not taken): it arrives on no_done alone.
          promptTokens: directive === 'no_done' ? PROMPT_TOKENS : 0,
          completionTokens: directive === 'no_done' ? OUTPUT_TOKENS : 0,
          ttft: 1,
        }),
      );
      expect((await s.simEnded(1))[0]).toMatchObject({ route: 'messages', fault: directive.replace(/=.*/, ''), end, outputEventsSent: sent });
    },
  );

  const BEFORE_OUTPUT = [
    // Lazy validation: `event: error` is the first and only event; vLLM's converter keeps the 400 only inside
    // pydantic's message, where Waybill reads it (docs/errors.md): a 400 the SDK does not retry.
    { directive: 'error_before_output', status: 400, type: 'invalid_request_error', outcome: 'rejected', attempt: 'error_payload', anomalies: { error_payload: 1 }, end: 'fault' },
    // An engine error (code 500) before output: 500, not retried (retries.retry_on_500 is off).
    { directive: 'error_after=0', status: 500, type: 'api_error', outcome: 'failed', attempt: 'error_payload', anomalies: { error_payload: 1 }, end: 'fault' },
    { directive: 'reset_after=0', status: 502, type: 'api_error', outcome: 'failed', attempt: 'reset', anomalies: {}, end: 'fault' },
    { directive: 'end_after=0', status: 502, type: 'api_error', outcome: 'failed', attempt: 'incomplete', anomalies: { missing_done: 1, missing_finish_reason: 1 }, end: 'fault' },
    { directive: 'stall_after=0', status: 504, type: 'timeout_error', outcome: 'timeout', attempt: 'timeout', anomalies: {}, end: 'client_disconnect' },
    { directive: 'status=500', status: 502, type: 'api_error', outcome: 'failed', attempt: 'http_5xx', anomalies: {}, end: 'fault' },
    { directive: 'status=400', status: 400, type: 'invalid_request_error', outcome: 'rejected', attempt: 'http_4xx', anomalies: {}, end: 'fault' },
    { directive: 'status=404', status: 404, type: 'not_found_error', outcome: 'rejected', attempt: 'http_4xx', anomalies: {}, end: 'fault' },
    { directive: 'status=429', status: 429, type: 'rate_limit_error', outcome: 'rejected', attempt: 'http_4xx', anomalies: {}, end: 'fault' },
  ];

  it.each(BEFORE_OUTPUT)('stream, $directive before output: APIError $status ($type), counted $outcome', async ({ directive, status, type, outcome, attempt, anomalies, end }) => {
    const s = await simStack();
    const error: unknown = await s.anthropic.messages.create({ ...MESSAGES, stream: true }, fault(directive)).then(
      () => undefined,
      (caught: unknown) => caught,
    );
    expect(error).toBeInstanceOf(Anthropic.APIError);
    // Anthropic-shaped body: the SDK reads its type from error.type.
    expect(error).toMatchObject({ status, type, error: { type: 'error', error: { type } } });
    expect(await settledAfter(s.stack, 1)).toMatchObject({ route: 'messages', outcome, code: status, finishReasons: [] });
    expect(await counters(s.stack)).toEqual(
      ledger({
        requests: { [`messages true ${status} ${outcome}`]: 1 },
        attempts: { [attempt]: 1 },
        anomalies,
      }),
    );
    expect((await s.simEnded(1))[0]).toMatchObject({ route: 'messages', fault: directive.replace(/=.*/, ''), end, outputEventsSent: 0 });
  });

  it('non-stream engine error (vLLM answers 500 internal_error): APIError 502, Anthropic-shaped', async () => {
    const s = await simStack();
    await expect(s.anthropic.messages.create(MESSAGES, fault('error_after=2'))).rejects.toMatchObject({ status: 502, type: 'api_error' });
    expect(await counters(s.stack)).toEqual(ledger({ requests: { 'messages false 502 failed': 1 }, attempts: { http_5xx: 1 } }));
  });
});

// --- vLLM's string-shaped errors ---------------------------------------------------------------------------------

describe("vLLM's string-shaped error bodies on the event routes", () => {
  // vLLM answers `{"error":"Unauthorized"}` (401 with --api-key) and `{"error":"Service Unavailable"}` (503): the
  // message must reach the client on these routes as on chat (docs/errors.md); it was once lost here.
  it('401 and 503 keep vLLM\'s message through both SDKs', async () => {
    const s = await simStack();
    const message = (text: string) => expect.stringContaining(text) as unknown;
    await expect(s.openai.responses.create({ ...RESPONSES, stream: true }, fault('status=401'))).rejects.toMatchObject({ status: 401, message: message('Unauthorized') });
    await expect(s.openai.responses.create({ ...RESPONSES, stream: true }, fault('status=503'))).rejects.toMatchObject({ status: 502, message: message('Service Unavailable') });
    await expect(s.anthropic.messages.create({ ...MESSAGES, stream: true }, fault('status=401'))).rejects.toMatchObject({
      status: 401,
      type: 'authentication_error',
      message: message('Unauthorized'),
    });
    await expect(s.anthropic.messages.create({ ...MESSAGES, stream: true }, fault('status=503'))).rejects.toMatchObject({
      status: 502,
      type: 'api_error',
      message: message('Service Unavailable'),
    });
    expect(await counters(s.stack)).toEqual(
      ledger({
        requests: { 'responses true 401 rejected': 1, 'responses true 502 failed': 1, 'messages true 401 rejected': 1, 'messages true 502 failed': 1 },
        attempts: { http_4xx: 2, http_5xx: 2 },
      }),
    );
  });
});

// --- Embeddings -------------------------------------------------------------------------------------------------------

describe('openai embeddings.create against the simulator', () => {
  it('base64 by default: decoded vectors, usage counted', async () => {
    const s = await simStack();
    const response = await s.openai.embeddings.create({ model: 'sim-model', input: ['hello', 'waybill'] });
    expect(response.data.map((d) => d.index)).toEqual([0, 1]);
    for (const item of response.data) {
      expect(item.embedding).toHaveLength(8);
      expect(Math.hypot(...item.embedding)).toBeCloseTo(1, 5);
    }
    expect(await counters(s.stack)).toEqual(
      ledger({
        requests: { 'embeddings false 200 delivered': 1 },
        attempts: { ok: 1 },
        accepted: { 'embeddings false': 1 },
        promptTokens: response.usage.prompt_tokens,
      }),
    );
    expect(response.usage.prompt_tokens).toBe(4);
    const [record] = await s.simEnded(1);
    expect(record).toMatchObject({ route: 'embeddings', end: 'completed', status: 200, promptTokens: 4 });
  });

  it.each([
    { directive: 'status=503', status: 502, outcome: 'failed', attempt: 'http_5xx' },
    { directive: 'status=500', status: 502, outcome: 'failed', attempt: 'http_5xx' },
    { directive: 'status=400', status: 400, outcome: 'rejected', attempt: 'http_4xx' },
    { directive: 'reset_after=0', status: 502, outcome: 'failed', attempt: 'reset' },
  ])('$directive: APIError $status, counted $outcome', async ({ directive, status, outcome, attempt }) => {
    const s = await simStack();
    const error: unknown = await s.openai.embeddings.create({ model: 'sim-model', input: 'x' }, fault(directive)).then(
      () => undefined,
      (caught: unknown) => caught,
    );
    expect(error).toBeInstanceOf(OpenAI.APIError);
    expect(error).toMatchObject({ status });
    expect(await counters(s.stack)).toEqual(ledger({ requests: { [`embeddings false ${status} ${outcome}`]: 1 }, attempts: { [attempt]: 1 } }));
    expect((await s.simEnded(1))[0]).toMatchObject({ route: 'embeddings', end: 'fault' });
  });
});

// --- Cancellation -----------------------------------------------------------------------------------------------------

describe('cancellation at socket level', () => {
  it('responses: the client aborts mid-stream; counted client_cancelled (streaming), the simulator sees the disconnect', async () => {
    // Defaults (idle 30 s): nothing but the abort can end this 5-second stream early.
    const s = await simStack({});
    const controller = new AbortController();
    const stream = await s.openai.responses.create({ ...RESPONSES, stream: true }, { signal: controller.signal, ...fault('tokens=1000; itl_ms=5') });
    let deltas = 0;
    const outcome = await (async () => {
      try {
        for await (const event of stream) {
          if (event.type === 'response.output_text.delta' && ++deltas === 2) controller.abort();
        }
        return 'ended';
      } catch (error) {
        return error;
      }
    })();
    // openai-node ends the iteration quietly on the user's own abort (or raises APIUserAbortError): never a completion.
    if (outcome !== 'ended') expect(outcome).toBeInstanceOf(OpenAI.APIUserAbortError);
    expect(deltas).toBe(2);

    expect(await settledAfter(s.stack, 1)).toMatchObject({ route: 'responses', outcome: 'client_cancelled', code: 200, cancelPhase: 'streaming' });
    const [record] = await s.simEnded(1);
    expect(record).toMatchObject({ route: 'responses', fault: null, end: 'client_disconnect' });
    expect(record?.outputEventsSent).toBeLessThan(1000);
    expect(await counters(s.stack)).toEqual(
      ledger({
        requests: { 'responses true 200 client_cancelled': 1 },
        attempts: { cancelled: 1 },
        cancellations: { streaming: 1 },
        finishReasons: { none: 1 },
        ttft: 1,
      }),
    );
    const stats = await s.simStats();
    expect(stats).toMatchObject({ clientDisconnects: 1, completed: 0, inflight: 0 });
    expect(stats.byRoute.responses).toBe(1);
  });

  it('responses: the client aborts while Waybill holds the stream before its first output; 499, the simulator sees it', async () => {
    const s = await simStack({});
    const controller = new AbortController();
    const started = s.simStarted();
    const pending = s.openai.responses.create({ ...RESPONSES, stream: true }, { signal: controller.signal, ...fault('stall_after=0') });
    // The simulator has sent its 200 with created / in_progress and stalls; Waybill holds them, so no headers yet.
    await started;
    controller.abort();
    await expect(pending).rejects.toBeInstanceOf(OpenAI.APIUserAbortError);
    expect(await settledAfter(s.stack, 1)).toMatchObject({ route: 'responses', outcome: 'client_cancelled', code: 499, cancelPhase: 'before_first_token' });
    expect((await s.simEnded(1))[0]).toMatchObject({ route: 'responses', end: 'client_disconnect', outputEventsSent: 0 });
    expect(await counters(s.stack)).toEqual(
      ledger({
        requests: { 'responses true 499 client_cancelled': 1 },
        attempts: { cancelled: 1 },
        cancellations: { before_first_token: 1 },
      }),
    );
    expect(await s.simStats()).toMatchObject({ clientDisconnects: 1, inflight: 0 });
  });

  it('messages: the client aborts mid-stream (helper and raw); counted client_cancelled, the simulator sees each disconnect', async () => {
    const s = await simStack({});
    // The raw stream: abort on the second text delta of a stream the simulator stalls after three.
    const controller = new AbortController();
    const raw = await s.anthropic.messages.create({ ...MESSAGES, stream: true }, { signal: controller.signal, ...fault('stall_after=3') });
    let deltas = 0;
    const rawOutcome = await (async () => {
      try {
        for await (const event of raw) {
          if (event.type === 'content_block_delta' && ++deltas === 2) controller.abort();
        }
        return 'ended';
      } catch (error) {
        return error;
      }
    })();
    if (rawOutcome !== 'ended') expect(rawOutcome).toBeInstanceOf(Anthropic.APIUserAbortError);
    // The SDK may still yield an event it had already read off the socket before the abort (seen under load): the
    // third and last one the simulator sends before it stalls. Never more.
    expect(deltas).toBeGreaterThanOrEqual(2);
    expect(deltas).toBeLessThanOrEqual(3);
    expect(await settledAfter(s.stack, 1)).toMatchObject({ route: 'messages', outcome: 'client_cancelled', code: 200, cancelPhase: 'streaming' });
    expect((await s.simEnded(1))[0]).toMatchObject({ route: 'messages', end: 'client_disconnect' });

    // The helper: stream.abort() on the first text.
    const helper = s.anthropic.messages.stream(MESSAGES, fault('stall_after=3'));
    helper.on('text', () => helper.abort());
    await expect(helper.finalMessage()).rejects.toBeInstanceOf(Anthropic.APIUserAbortError);
    expect(await settledAfter(s.stack, 2)).toMatchObject({ route: 'messages', outcome: 'client_cancelled', code: 200, cancelPhase: 'streaming' });
    expect((await s.simEnded(2))[1]).toMatchObject({ route: 'messages', end: 'client_disconnect' });

    expect(await counters(s.stack)).toEqual(
      ledger({
        requests: { 'messages true 200 client_cancelled': 2 },
        attempts: { cancelled: 2 },
        cancellations: { streaming: 2 },
        finishReasons: { none: 2 },
        // Cut before message_delta: no usage counted (message_start's is not taken, as on chat).
        promptTokens: 0,
        ttft: 2,
      }),
    );
    expect(await s.simStats()).toMatchObject({ clientDisconnects: 2, inflight: 0 });
  });
});
