/**
 * The status table of docs/errors.md ("From the upstream, before any output") is the oracle: every row is read from
 * the doc, checked against the module the code consults (src/delivery/status-map.ts), and driven through a real
 * gateway on a socket against a scripted upstream, on each route of its column — the status and error type the client
 * receives, and how many times the upstream was asked (retried: twice under `max_attempts: 2`; else once).
 * One test holds the whole table against the failure table (src/delivery/failures.ts) the ledger and the machine
 * build their answers from: per row and shape, the status, the error code or type, and whether it is retried.
 */
import { readFileSync } from 'node:fs';
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import Anthropic from '@anthropic-ai/sdk';
import { afterAll, describe, expect, it } from 'vitest';
import { errorBodyFor } from '../src/delivery/errors.js';
import { failureOf, failureResponse, FAILURES, type FailureCause } from '../src/delivery/failures.js';
import { clientStatus, retryRule, type ErrorShape, type RetryRule, type UpstreamSignal } from '../src/delivery/status-map.js';
import { classifyMessagesEvent } from '../src/sse/route-events.js';
import { chatErrorValidationMessage } from '../src/sim/messages.js';
import { errorInfo } from '../src/sim/wire.js';
import { startScripted, type Scripted } from './helpers/scripted.js';
import { post, startStack, type Stack } from './helpers/stack.js';

// --- The doc's table -----------------------------------------------------------------------------------------------

interface Cell {
  readonly status: number;
  /** The code (OpenAI shape) or error.type (Anthropic shape) Waybill answers with; undefined: the upstream's error. */
  readonly type: string | undefined;
  readonly relayed: boolean;
}

interface Row {
  readonly key: string;
  readonly openai: Cell;
  readonly anthropic: Cell;
  readonly retried: RetryRule;
}

function parseCell(text: string): Cell {
  const status = /^(\d{3})\b/.exec(text.trim());
  if (status === null) throw new Error(`no status in cell "${text}"`);
  const type = /`([^`]+)`/.exec(text)?.[1];
  return { status: Number(status[1]), type, relayed: text.includes("the upstream's error") };
}

function parseRetried(text: string): RetryRule {
  if (text === 'yes' || text === 'no') return text;
  if (text === 'with `retry_on_500`') return 'retry_on_500';
  throw new Error(`unknown retried cell "${text}"`);
}

function docRows(): Row[] {
  const doc = readFileSync(new URL('../docs/errors.md', import.meta.url), 'utf8');
  const section = doc.split('### From the upstream, before any output')[1]?.split('\n### ')[0] ?? '';
  const lines = section.split('\n').filter((line) => line.startsWith('| `'));
  return lines.map((line) => {
    const cells = line.split('|').slice(1, -1).map((c) => c.trim());
    if (cells.length !== 4) throw new Error(`row "${line}" does not have 4 cells`);
    const [key, openai, anthropic, retried] = cells as [string, string, string, string];
    return { key: key.replaceAll('`', ''), openai: parseCell(openai), anthropic: parseCell(anthropic), retried: parseRetried(retried) };
  });
}

const ROWS = docRows();

/** What each row of the doc stands for, as the module's input. */
function signalOf(key: string): UpstreamSignal {
  const http = /^HTTP (\d{3})$/.exec(key);
  if (http !== null) return { kind: 'http', status: Number(http[1]) };
  const event = /^event code (\d{3})$/.exec(key);
  if (event !== null) return { kind: 'event', code: Number(event[1]) };
  const named: Record<string, UpstreamSignal> = {
    'event without code': { kind: 'event', code: undefined },
    'unreadable 2xx': { kind: 'unreadable' },
    'connection refused': { kind: 'connect_error' },
    'reset before output': { kind: 'reset' },
    'end before output': { kind: 'incomplete' },
    'first-output deadline': { kind: 'first_output_timeout' },
    'total deadline': { kind: 'total_timeout' },
  };
  const signal = named[key];
  if (signal === undefined) throw new Error(`docs/errors.md row "${key}" is not known to this test`);
  return signal;
}

describe('docs/errors.md: the status table and src/delivery/status-map.ts agree, row by row', () => {
  it('the table is there, with the rows the issue names', () => {
    const keys = ROWS.map((r) => r.key);
    for (const key of ['HTTP 500', 'HTTP 529', 'event code 400', 'event code 500', 'connection refused', 'first-output deadline', 'total deadline']) {
      expect(keys).toContain(key);
    }
  });

  it.each(ROWS.map((r) => [r.key, r] as const))('%s', (_key, row) => {
    const signal = signalOf(row.key);
    expect(clientStatus(signal, 'openai')).toBe(row.openai.status);
    expect(clientStatus(signal, 'anthropic')).toBe(row.anthropic.status);
    expect(retryRule(signal)).toBe(row.retried);
  });
});

/** The failure table's cause for each row of the doc (the `unreadable 2xx` row stands for four causes). */
function causesOf(key: string): FailureCause[] {
  const http = /^HTTP (\d)\d\d$/.exec(key);
  if (http !== null) return [http[1] === '3' ? 'upstream_3xx' : http[1] === '4' ? 'upstream_4xx' : 'upstream_5xx'];
  if (key.startsWith('event ')) return ['error_payload'];
  const named: Record<string, FailureCause[]> = {
    'unreadable 2xx': ['not_event_stream', 'compressed', 'oversized', 'malformed_body'],
    'connection refused': ['connect_error'],
    'reset before output': ['reset'],
    'end before output': ['incomplete'],
    'first-output deadline': ['timeout'],
    'total deadline': ['timeout'],
  };
  const causes = named[key];
  if (causes === undefined) throw new Error(`docs/errors.md row "${key}" has no cause in this test`);
  return causes;
}

describe('docs/errors.md: the status table and the failure table (src/delivery/failures.ts) agree', () => {
  it('every row: status per shape, the code or type answered, retried', () => {
    const checked: string[] = [];
    for (const row of ROWS) {
      const signal = signalOf(row.key);
      expect(retryRule(signal), row.key).toBe(row.retried);
      const code = signal.kind === 'event' ? signal.code : signal.kind === 'http' ? signal.status : undefined;
      // The upstream's own error, as an upstream that sends one would (relayed where the doc says so).
      const upstreamError = signal.kind === 'event' || signal.kind === 'http' ? { code, type: 'BadRequestError', message: 'boom', param: undefined } : undefined;
      for (const cause of causesOf(row.key)) {
        for (const [route, cell] of [['chat_completions', row.openai], ['responses', row.openai], ['messages', row.anthropic]] as const) {
          const failure = failureOf(cause, route, signal, upstreamError);
          const where = `${row.key} (${cause}) on ${route}`;
          expect(failure.status, where).toBe(cell.status);
          const { status, body } = failureResponse(failure);
          expect(status, where).toBe(cell.status);
          const answered = errorBodyFor(route, status, body);
          if (route === 'messages') {
            expect('type' in answered && answered.error.type, where).toBe(cell.type);
          } else if (cell.relayed) {
            expect(body.error, where).toMatchObject({ message: 'boom', type: 'BadRequestError', code: code ?? status });
          } else {
            expect(body.error.code, where).toBe(cell.type);
            expect(body.error.code, where).toBe(FAILURES[cause].code);
          }
        }
        checked.push(cause);
      }
    }
    // Every attempt failure the table knows is some row of the doc (shutdown and internal are the gateway's own).
    const attemptCauses = (Object.keys(FAILURES) as FailureCause[]).filter((c) => c !== 'shutdown' && c !== 'internal');
    expect(new Set(checked)).toEqual(new Set(attemptCauses));
  });
});

// --- What vLLM sends, per route ------------------------------------------------------------------------------------

type RouteName = 'chat_completions' | 'completions' | 'responses' | 'messages';

const ROUTES: Record<RouteName, { path: string; body: Record<string, unknown>; shape: ErrorShape }> = {
  chat_completions: { path: '/v1/chat/completions', body: { model: 'sim-model', messages: [{ role: 'user', content: 'hi' }], stream: true }, shape: 'openai' },
  completions: { path: '/v1/completions', body: { model: 'sim-model', prompt: 'hi', stream: true }, shape: 'openai' },
  responses: { path: '/v1/responses', body: { model: 'sim-model', input: 'hi', stream: true }, shape: 'openai' },
  messages: { path: '/v1/messages', body: { model: 'sim-model', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }], stream: true }, shape: 'anthropic' },
};

const SSE = { 'content-type': 'text/event-stream; charset=utf-8' };
const named = (type: string, data: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ ...data, type })}\n\n`;

/** The events an attempt sends before its first output (none of them output-bearing). */
function opening(route: RouteName): string {
  switch (route) {
    case 'chat_completions':
      return `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'sim-model', choices: [{ index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }] })}\n\n`;
    case 'completions':
      return '';
    case 'responses':
      return named('response.created', { response: { id: 'resp_1', object: 'response', model: 'sim-model', status: 'in_progress', output: [] }, sequence_number: 0 });
    case 'messages':
      return named('message_start', { message: { id: 'chatcmpl-1', content: [], model: 'sim-model', stop_reason: null, stop_sequence: null, usage: { input_tokens: 5, output_tokens: 0 } } });
  }
}

/** An error event before any output, as each route's upstream writes it; `code` undefined: an event without one. */
function errorEvent(route: RouteName, code: number | undefined): string {
  switch (route) {
    case 'chat_completions':
    case 'completions':
      // vLLM: Python json.dumps, then [DONE].
      return `data: {"error": {"message": "boom", "type": "BadRequestError", "param": null${code === undefined ? '' : `, "code": ${code}`}}}\n\ndata: [DONE]\n\n`;
    case 'responses':
      return named('error', { message: 'boom', param: null, sequence_number: 1, ...(code === undefined ? {} : { code }) });
    case 'messages':
      // vLLM's converter: its own event about the chat error event it could not parse (the code survives in the text).
      return named('error', { error: { type: 'internal_error', message: code === undefined ? 'boom' : chatErrorValidationMessage(errorInfo(code, 'boom')) } });
  }
}

/** An error body under HTTP 200 for a non-stream request, as each route's upstream writes it. */
function errorBody(route: RouteName, code: number | undefined): string {
  if (route !== 'messages') return JSON.stringify({ error: { message: 'boom', type: 'BadRequestError', param: null, ...(code === undefined ? {} : { code }) } });
  return JSON.stringify({ type: 'error', error: { type: 'internal_error', message: code === undefined ? 'boom' : chatErrorValidationMessage(errorInfo(code, 'boom')) } });
}

function script(key: string, route: RouteName, res: ServerResponse, stream = true): void {
  if (!stream) {
    const event = /^event code (\d{3})$/.exec(key);
    res.writeHead(200, { 'content-type': 'application/json' });
    if (key === 'overloaded type') res.end(JSON.stringify({ type: 'error', error: { type: 'overloaded_error', message: 'boom' } }));
    else res.end(errorBody(route, event === null ? undefined : Number(event[1])));
    return;
  }
  const http = /^HTTP (\d{3})$/.exec(key);
  if (http !== null) {
    const status = Number(http[1]);
    if (status >= 300 && status < 400) {
      res.writeHead(status, { location: 'http://127.0.0.1:1/elsewhere' });
      res.end();
      return;
    }
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ error: { message: 'boom', type: 'BadRequestError', param: null, code: status } }));
    return;
  }
  const event = /^event code (\d{3})$/.exec(key);
  if (event !== null || key === 'event without code') {
    res.writeHead(200, SSE);
    res.end(opening(route) + errorEvent(route, event === null ? undefined : Number(event[1])));
    return;
  }
  switch (key) {
    case 'unreadable 2xx':
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end('not an event stream');
      return;
    case 'reset before output':
      res.socket?.destroy();
      return;
    case 'end before output':
      res.writeHead(200, SSE);
      res.end(opening(route));
      return;
    case 'first-output deadline':
    case 'total deadline':
      // Headers and the opening events, then nothing: no output ever.
      res.writeHead(200, SSE);
      res.write(opening(route));
      return;
  }
  throw new Error(`no script for ${key}`);
}

// --- Gateways ------------------------------------------------------------------------------------------------------

const hits = new Map<string, number>();
let upstream: Scripted | undefined;
const stacks = new Map<string, Promise<Stack>>();
const closers: Array<() => Promise<void>> = [];

afterAll(async () => {
  for (const close of closers.reverse()) await close();
});

async function scripted(): Promise<Scripted> {
  if (upstream !== undefined) return upstream;
  upstream = await startScripted((req, res) => {
    const id = String(req.headers['x-case']);
    hits.set(id, (hits.get(id) ?? 0) + 1);
    const [key, route, mode] = id.split('|') as [string, RouteName, string | undefined];
    script(key, route, res, mode !== 'non-stream');
  });
  closers.push(() => (upstream as Scripted).close());
  return upstream;
}

/** A port nothing listens on: bound, then closed. */
async function closedPort(): Promise<string> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return `http://127.0.0.1:${port}`;
}

type Variant = 'plain' | 'retry_on_500' | 'refused' | 'first_output' | 'total';

function variantOf(key: string): Variant {
  if (key === 'connection refused') return 'refused';
  if (key === 'first-output deadline') return 'first_output';
  if (key === 'total deadline') return 'total';
  return 'plain';
}

function gateway(variant: Variant): Promise<Stack> {
  let stack = stacks.get(variant);
  if (stack === undefined) {
    stack = (async () => {
      const url = variant === 'refused' ? await closedPort() : (await scripted()).url;
      const timeouts =
        variant === 'first_output' ? { first_output: 0.2, total: 10 } : variant === 'total' ? { first_output: 10, total: 0.3 } : { first_output: 10, total: 20 };
      const s = await startStack({
        sims: 0,
        extraUpstreams: [{ name: 'scripted', url }],
        config: {
          // Passive ejection off: every row's failures go to the one upstream.
          health: { interval: '1h', eject_after_failures: 1_000_000 },
          retries: { max_attempts: 2, backoff_base: 0.001, backoff_max: 0.002, retry_on_500: variant === 'retry_on_500', budget: { ratio: 1, min_per_second: 1000 } },
          timeouts,
        },
      });
      closers.push(() => s.close());
      return s;
    })();
    stacks.set(variant, stack);
  }
  return stack;
}

interface Received {
  status: number;
  shouldRetry: string | undefined;
  body: Record<string, unknown>;
  attempts: number;
}

async function drive(key: string, route: RouteName, variant: Variant, stream = true): Promise<Received> {
  const stack = await gateway(variant);
  const before = stack.settlements.length;
  const body = stream ? ROUTES[route].body : { ...ROUTES[route].body, stream: false };
  const result = await post(stack.base, ROUTES[route].path, body, { 'x-case': `${key}|${route}${stream ? '' : '|non-stream'}` });
  const settlement = (await stack.settled(before + 1)).find((s, i) => i >= before && s.route === route);
  const shouldRetry = result.headers['x-should-retry'];
  return { status: result.status, shouldRetry: typeof shouldRetry === 'string' ? shouldRetry : undefined, body: JSON.parse(result.body) as Record<string, unknown>, attempts: settlement?.attempts.length ?? -1 };
}

/**
 * The SDKs retry 408, 409, 429 and every 5xx unless told `x-should-retry: false`: Waybill says so when the row is not
 * retried (the table's "SDK retries" note), or when it already made more than one attempt itself; never `true`.
 */
function expectShouldRetry(received: Received, key: string, row: Row, retryOn500 = false): void {
  const retried = row.retried === 'yes' || (row.retried === 'retry_on_500' && retryOn500);
  expect(received.shouldRetry, `${key}: x-should-retry`).toBe(!retried || received.attempts > 1 ? 'false' : undefined);
}

function expectCell(received: Received, cell: Cell, shape: ErrorShape, key: string): void {
  expect(received.status, `${key}: status`).toBe(cell.status);
  if (shape === 'anthropic') {
    expect(received.body, `${key}: Anthropic shape`).toMatchObject({ type: 'error', error: { type: cell.type } });
    if (cell.relayed) expect((received.body['error'] as { message: string }).message).toContain('boom');
    return;
  }
  const error = received.body['error'] as { message: string; code: unknown; type: string };
  if (cell.relayed) {
    // The upstream's own error: its message and its (status-shaped) code.
    expect(error.message, `${key}: relayed message`).toBe('boom');
    expect(error.code, `${key}: relayed code`).toBe(cell.status);
  } else {
    expect(error.code, `${key}: Waybill's code`).toBe(cell.type);
  }
}

const CASES = ROWS.flatMap((row) =>
  (Object.keys(ROUTES) as RouteName[]).map((route) => [row.key, route, row] as const),
);

describe('docs/errors.md: each row of the status table through a real gateway', () => {
  // Sequential: the deadline rows measure time, and the attempt counts are read per request.
  it.each(CASES)('%s on %s', async (key, route, row) => {
    const shape = ROUTES[route].shape;
    const cell = shape === 'anthropic' ? row.anthropic : row.openai;
    const received = await drive(key, route, variantOf(key));
    expectCell(received, cell, shape, key);
    expect(received.attempts, `${key}: attempts (retried: ${row.retried})`).toBe(row.retried === 'yes' ? 2 : 1);
    expectShouldRetry(received, key, row);
    if (row.retried === 'retry_on_500') {
      // The same failure under retries.retry_on_500: true is retried, then answered the same.
      const again = await drive(key, route, 'retry_on_500');
      expectCell(again, cell, shape, key);
      expect(again.attempts, `${key}: attempts under retry_on_500`).toBe(2);
      expectShouldRetry(again, key, row, true);
    }
  });
});

// "or an error body under HTTP 200": the event rows again, each as a non-stream request answered 200 with the error.
const BODY_CASES = CASES.filter(([key]) => key.startsWith('event '));

describe('docs/errors.md: the event rows as an error body under HTTP 200 (stream: false)', () => {
  it.each(BODY_CASES)('%s on %s, non-stream', async (key, route, row) => {
    const shape = ROUTES[route].shape;
    const cell = shape === 'anthropic' ? row.anthropic : row.openai;
    const received = await drive(key, route, variantOf(key), false);
    expectCell(received, cell, shape, key);
    expect(received.attempts, `${key}: attempts (retried: ${row.retried})`).toBe(row.retried === 'yes' ? 2 : 1);
    expectShouldRetry(received, key, row);
  });

  it("an Anthropic overloaded_error body under HTTP 200 on /v1/messages is 529 and retried, as the stream's event is", async () => {
    const received = await drive('overloaded type', 'messages', 'plain', false);
    expect(received.status).toBe(529);
    expect(received.body).toMatchObject({ type: 'error', error: { type: 'overloaded_error' } });
    expect(received.attempts).toBe(2);
  });
});

describe('/v1/messages/count_tokens reads an Anthropic error body as Messages does', () => {
  it('an overloaded_error body under HTTP 200 is 529 overloaded_error', async () => {
    const stack = await gateway('plain');
    const result = await post(stack.base, '/v1/messages/count_tokens', { model: 'sim-model', messages: [{ role: 'user', content: 'hi' }] }, { 'x-case': 'overloaded type|messages|non-stream' });
    expect(result.status).toBe(529);
    expect(JSON.parse(result.body)).toMatchObject({ type: 'error', error: { type: 'overloaded_error' } });
  });
});

// --- The Anthropic SDK reads what the table says -------------------------------------------------------------------

describe('/v1/messages through the Anthropic SDK', () => {
  it('an upstream 529 surfaces as OverloadedError (not InternalServerError)', async () => {
    const stack = await gateway('plain');
    const client = new Anthropic({ baseURL: stack.base, apiKey: 'unused', maxRetries: 0, defaultHeaders: { 'x-case': 'HTTP 529|messages' } });
    const failure = await client.messages.create({ model: 'sim-model', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }], stream: true }).catch((e: unknown) => e);
    expect(failure).toBeInstanceOf(Anthropic.APIError);
    expect((failure as Error).constructor.name).toBe('OverloadedError');
    expect(failure).toMatchObject({ status: 529, error: { type: 'error', error: { type: 'overloaded_error' } } });
  });

  it('a row the table does not retry (HTTP 501) is asked once upstream under the SDK default retries: x-should-retry: false', async () => {
    const stack = await gateway('plain');
    const id = 'HTTP 501|messages';
    const before = hits.get(id) ?? 0;
    // The SDK's default retries (2): without the header a 5xx is asked three times.
    const client = new Anthropic({ baseURL: stack.base, apiKey: 'unused', defaultHeaders: { 'x-case': id } });
    const failure = await client.messages.create({ model: 'sim-model', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }], stream: true }).catch((e: unknown) => e);
    expect(failure).toBeInstanceOf(Anthropic.APIError);
    expect(failure).toMatchObject({ status: 502 });
    expect((hits.get(id) ?? 0) - before).toBe(1);
  });

  it("vLLM's lazy validation (a 400 inside the converter's error event) surfaces as BadRequestError and is not retried, by Waybill or the SDK", async () => {
    const stack = await gateway('plain');
    const id = 'event code 400|messages';
    const before = hits.get(id) ?? 0;
    // The SDK's default retries (2): a 5xx would be asked three times.
    const client = new Anthropic({ baseURL: stack.base, apiKey: 'unused', defaultHeaders: { 'x-case': id } });
    const failure = await client.messages.create({ model: 'sim-model', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }], stream: true }).catch((e: unknown) => e);
    expect(failure).toBeInstanceOf(Anthropic.BadRequestError);
    expect(failure).toMatchObject({ status: 400, error: { error: { type: 'invalid_request_error' } } });
    expect((hits.get(id) ?? 0) - before).toBe(1);
  });
});

describe("reading a Messages error event's code", () => {
  const code = (data: Record<string, unknown>) => {
    const facts = classifyMessagesEvent('error', JSON.stringify({ type: 'error', ...data }));
    return facts.kind === 'error' ? facts.code : 'not an error';
  };

  it("from vLLM's converter message, whatever the chat error's code", () => {
    for (const c of [400, 500, 503]) expect(code({ error: { type: 'internal_error', message: chatErrorValidationMessage(errorInfo(c, 'x'.repeat(300))) } })).toBe(c);
  });

  it("from Anthropic's error type when there is no code", () => {
    expect(code({ error: { type: 'overloaded_error', message: 'Overloaded' } })).toBe(529);
    expect(code({ error: { type: 'invalid_request_error', message: 'bad' } })).toBe(400);
    expect(code({ error: { type: 'internal_error', message: 'boom' } })).toBeUndefined();
  });

  it('a type naming a key of Object.prototype names no status', () => {
    for (const type of ['constructor', 'toString', '__proto__', 'hasOwnProperty', 'valueOf']) {
      expect(code({ error: { type, message: 'x' } }), type).toBeUndefined();
    }
  });

  it("the error's own code first", () => {
    expect(code({ error: { type: 'overloaded_error', message: 'x', code: 503 } })).toBe(503);
  });
});
