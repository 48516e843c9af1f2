/**
 * A grammar of client requests: valid chat and legacy completions requests mixed with hostile ones: an unrelated
 * field nested 10,000 levels deep, `stream_options` present or not (or not an object), `n` up to large and invalid
 * values, `prompt` lists of many strings, invalid JSON, wrong content types, huge headers, bodies sent slowly or
 * never completed, and clients that leave mid-stream.
 *
 * Plain data again: `renderRequest` gives the exact bytes, `describeRequest` a readable line for failure reports.
 */
import fc from 'fast-check';
import type { Route } from './upstream-grammar.js';

export type JsonBodyPlan = {
  kind: 'json';
  model: 'm' | 'unknown' | 'missing' | 'number' | 'empty';
  stream: true | false | 'absent' | 'null' | 'string';
  /** The value of `n`; null: no `n` member. */
  n: number | string | null;
  streamOptions: 'absent' | 'include_usage' | 'exclude_usage' | 'empty' | 'string' | 'null';
  /** completions: a string, a token list, or a list of `count` strings. chat: `count` messages. */
  prompt: { kind: 'string' } | { kind: 'tokens' } | { kind: 'list'; count: number } | { kind: 'absent' } | { kind: 'empty_list' };
  /** An unrelated field nested this deep (0: none). */
  nestDepth: number;
  nestShape: 'array' | 'object';
  /** Pads the body with an unrelated string of this many bytes (past the gateway's body limit, sometimes). */
  padBytes: number;
};

export type BodyPlan =
  | JsonBodyPlan
  | { kind: 'invalid_json'; text: string }
  /** Valid JSON that is not an object. */
  | { kind: 'not_object'; text: string };

/** How the request's bytes go out. */
export type SendPlan =
  | { kind: 'whole' }
  /** The body in `pieces` writes, `delayMs` apart. */
  | { kind: 'slow'; pieces: number; delayMs: number }
  /** Part of the body (`percent`), then the client gives up after `afterMs` (destroys its socket). */
  | { kind: 'abort'; percent: number; afterMs: number }
  /** Part of the body, then nothing: the client waits for an answer as long as any client would (the deadline). */
  | { kind: 'stall'; percent: number };

/** How the client reads the response. */
export type ReadPlan = { kind: 'all' } | { kind: 'leave_after_bytes'; bytes: number } | { kind: 'leave_after_ms'; ms: number };

export interface ClientPlan {
  route: Route;
  body: BodyPlan;
  contentType: 'application/json' | 'application/json; charset=utf-8' | 'APPLICATION/JSON' | 'text/plain' | 'application/x-www-form-urlencoded' | 'none';
  /** Bytes of one extra header (Node's parser rejects > 16 KiB of headers by default). */
  headerBytes: number;
  /** Sent with Transfer-Encoding: chunked instead of Content-Length. */
  chunked: boolean;
  send: SendPlan;
  read: ReadPlan;
  /** Delay before the client connects, relative to the start of the case. */
  startMs: number;
}

export interface ClientGrammarOptions {
  /** Integer weight of clients that stall their body until the deadline. Default 4 (of ~100). */
  readonly slowWeight?: number;
  /** The gateway's `server.body_limit_bytes`, so padded bodies are just over it. */
  readonly bodyLimitBytes: number;
}

/** Lets a value shrink across branches, toward the first (simplest) one: a failure then shrinks to plain pieces. */
const CROSS = { withCrossShrink: true } as const;

const jsonBody = (options: ClientGrammarOptions): fc.Arbitrary<JsonBodyPlan> =>
  fc.record({
    kind: fc.constant('json' as const),
    model: fc.oneof(CROSS, { weight: 12, arbitrary: fc.constant('m' as const) }, { weight: 1, arbitrary: fc.constantFrom('unknown' as const, 'missing' as const, 'number' as const, 'empty' as const) }),
    stream: fc.oneof(CROSS, { weight: 10, arbitrary: fc.constantFrom(true, false) }, { weight: 1, arbitrary: fc.constantFrom('absent' as const, 'null' as const, 'string' as const) }),
    n: fc.oneof(CROSS, 
      { weight: 10, arbitrary: fc.constant(null) },
      { weight: 6, arbitrary: fc.integer({ min: 1, max: 4 }) },
      { weight: 2, arbitrary: fc.constantFrom(16, 64, 128) },
      { weight: 1, arbitrary: fc.constantFrom<number | string>(0, -1, 129, 1000, 1e6, 2.5, '2') },
    ),
    streamOptions: fc.constantFrom('absent' as const, 'absent' as const, 'absent' as const, 'include_usage' as const, 'exclude_usage' as const, 'empty' as const, 'string' as const, 'null' as const),
    prompt: fc.oneof(CROSS, 
      { weight: 8, arbitrary: fc.constant({ kind: 'string' as const }) },
      { weight: 1, arbitrary: fc.constant({ kind: 'tokens' as const }) },
      { weight: 3, arbitrary: fc.record({ kind: fc.constant('list' as const), count: fc.oneof(CROSS, fc.integer({ min: 1, max: 4 }), fc.constantFrom(50, 300)) }) },
      { weight: 1, arbitrary: fc.constantFrom({ kind: 'absent' as const }, { kind: 'empty_list' as const }) },
    ),
    nestDepth: fc.oneof(CROSS, { weight: 12, arbitrary: fc.constant(0) }, { weight: 1, arbitrary: fc.constantFrom(10, 1000, 10_000, 100_000) }),
    nestShape: fc.constantFrom('array' as const, 'object' as const),
    padBytes: fc.oneof(CROSS, { weight: 12, arbitrary: fc.constant(0) }, { weight: 1, arbitrary: fc.constant(options.bodyLimitBytes + 1) }),
  });

const bodyPlan = (options: ClientGrammarOptions): fc.Arbitrary<BodyPlan> =>
  fc.oneof(CROSS, 
    { weight: 14, arbitrary: jsonBody(options) },
    {
      weight: 1,
      arbitrary: fc.record({
        kind: fc.constant('invalid_json' as const),
        text: fc.constantFrom('{"model":"m","stream":true', '{"model":"m",}', '', ' ', '\ufeff{"model":"m","messages":[]}', '{"model":"m","messages":[]}garbage', '{"model":"\ud800"}', 'NaN', '{"model":"m"'),
      }),
    },
    { weight: 1, arbitrary: fc.record({ kind: fc.constant('not_object' as const), text: fc.constantFrom('[]', '42', '"m"', 'null', 'true', '[{"model":"m"}]') }) },
  );

const sendPlan = (slowWeight: number): fc.Arbitrary<SendPlan> =>
  fc.oneof(CROSS, 
    { weight: 80, arbitrary: fc.constant({ kind: 'whole' as const }) },
    { weight: 12, arbitrary: fc.record({ kind: fc.constant('slow' as const), pieces: fc.integer({ min: 2, max: 12 }), delayMs: fc.integer({ min: 1, max: 60 }) }) },
    { weight: 8, arbitrary: fc.record({ kind: fc.constant('abort' as const), percent: fc.integer({ min: 0, max: 99 }), afterMs: fc.integer({ min: 0, max: 300 }) }) },
    { weight: slowWeight, arbitrary: fc.record({ kind: fc.constant('stall' as const), percent: fc.integer({ min: 0, max: 99 }) }) },
  );

const readPlan: fc.Arbitrary<ReadPlan> = fc.oneof(CROSS, 
  { weight: 16, arbitrary: fc.constant({ kind: 'all' as const }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('leave_after_bytes' as const), bytes: fc.integer({ min: 0, max: 2000 }) }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('leave_after_ms' as const), ms: fc.integer({ min: 0, max: 400 }) }) },
);

export function clientArbitrary(options: ClientGrammarOptions): fc.Arbitrary<ClientPlan> {
  const slow = options.slowWeight ?? 4;
  return fc.record({
    route: fc.constantFrom<Route>('chat_completions', 'completions'),
    body: bodyPlan(options),
    contentType: fc.oneof(CROSS, 
      { weight: 16, arbitrary: fc.constant('application/json' as const) },
      { weight: 2, arbitrary: fc.constantFrom('application/json; charset=utf-8' as const, 'APPLICATION/JSON' as const) },
      { weight: 1, arbitrary: fc.constantFrom('text/plain' as const, 'application/x-www-form-urlencoded' as const, 'none' as const) },
    ),
    headerBytes: fc.oneof(CROSS, { weight: 14, arbitrary: fc.constant(0) }, { weight: 1, arbitrary: fc.constantFrom(8_000, 20_000, 100_000) }),
    chunked: fc.oneof(CROSS, { weight: 6, arbitrary: fc.constant(false) }, { weight: 1, arbitrary: fc.constant(true) }),
    send: sendPlan(slow),
    read: readPlan,
    startMs: fc.oneof(CROSS, fc.constant(0), fc.integer({ min: 0, max: 30 })),
  });
}

// --- Meaning ---------------------------------------------------------------------------------------------------

/** Does the body ask for a stream (as the API reads `stream`)? */
export function asksStream(body: BodyPlan): boolean {
  return body.kind === 'json' && body.stream === true;
}

function promptCount(body: JsonBodyPlan): number {
  return body.prompt.kind === 'list' ? body.prompt.count : 1;
}

/**
 * The most choices an answer may have: n × prompts for a request a completion API accepts, 0 otherwise (a request
 * with an invalid `n` must be answered without any choice). An upper bound, whatever else the gateway checks.
 */
export function expectedChoices(plan: ClientPlan): number {
  const body = plan.body;
  if (body.kind !== 'json') return 0;
  const n = body.n ?? 1;
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 1) return 0;
  return n * (plan.route === 'completions' ? promptCount(body) : 1);
}

// --- Rendering -------------------------------------------------------------------------------------------------

function nested(depth: number, shape: 'array' | 'object'): string {
  return shape === 'array' ? '['.repeat(depth) + '1' + ']'.repeat(depth) : '{"a":'.repeat(depth) + '1' + '}'.repeat(depth);
}

/** The request body's bytes. Valid JSON bodies are written by hand so deep nesting needs no recursion. */
export function renderBody(plan: ClientPlan): Buffer {
  const body = plan.body;
  if (body.kind !== 'json') return Buffer.from(body.text, 'utf8');
  const members: string[] = [];
  switch (body.model) {
    case 'm':
      members.push('"model":"m"');
      break;
    case 'unknown':
      members.push('"model":"gpt-9"');
      break;
    case 'number':
      members.push('"model":7');
      break;
    case 'empty':
      members.push('"model":""');
      break;
    case 'missing':
      break;
  }
  if (body.stream === true || body.stream === false) members.push(`"stream":${body.stream}`);
  else if (body.stream === 'null') members.push('"stream":null');
  else if (body.stream === 'string') members.push('"stream":"true"');
  if (body.n !== null) members.push(`"n":${JSON.stringify(body.n)}`);
  switch (body.streamOptions) {
    case 'include_usage':
      members.push('"stream_options":{"include_usage":true}');
      break;
    case 'exclude_usage':
      members.push('"stream_options":{"include_usage":false}');
      break;
    case 'empty':
      members.push('"stream_options":{}');
      break;
    case 'string':
      members.push('"stream_options":"yes"');
      break;
    case 'null':
      members.push('"stream_options":null');
      break;
    case 'absent':
      break;
  }
  if (plan.route === 'chat_completions') {
    const count = body.prompt.kind === 'list' ? body.prompt.count : body.prompt.kind === 'absent' ? -1 : body.prompt.kind === 'empty_list' ? 0 : 1;
    if (count >= 0) members.push(`"messages":[${Array.from({ length: count }, (_, i) => `{"role":"user","content":"Hello ${i}"}`).join(',')}]`);
  } else {
    switch (body.prompt.kind) {
      case 'string':
        members.push('"prompt":"Once upon a time"');
        break;
      case 'tokens':
        members.push('"prompt":[1,2,3,4]');
        break;
      case 'list':
        members.push(`"prompt":[${Array.from({ length: body.prompt.count }, (_, i) => `"prompt number ${i}"`).join(',')}]`);
        break;
      case 'empty_list':
        members.push('"prompt":[]');
        break;
      case 'absent':
        break;
    }
  }
  members.push('"max_tokens":16');
  if (body.nestDepth > 0) members.push(`"metadata_fuzz":${nested(body.nestDepth, body.nestShape)}`);
  if (body.padBytes > 0) members.push(`"padding_fuzz":"${'p'.repeat(body.padBytes)}"`);
  return Buffer.from(`{${members.join(',')}}`, 'utf8');
}

export function routePath(route: Route): string {
  return route === 'chat_completions' ? '/v1/chat/completions' : '/v1/completions';
}

/** The request head (status line and headers, blank line included). */
export function renderHead(plan: ClientPlan, id: string, host: string, bodyLength: number): Buffer {
  const lines = [`POST ${routePath(plan.route)} HTTP/1.1`, `host: ${host}`, `x-request-id: ${id}`, `x-fuzz-id: ${id}`, 'connection: close'];
  if (plan.contentType !== 'none') lines.push(`content-type: ${plan.contentType}`);
  lines.push(plan.chunked ? 'transfer-encoding: chunked' : `content-length: ${bodyLength}`);
  if (plan.headerBytes > 0) lines.push(`x-fuzz-padding: ${'h'.repeat(plan.headerBytes)}`);
  return Buffer.from(`${lines.join('\r\n')}\r\n\r\n`, 'latin1');
}

/** The body bytes as they go on the wire (chunk-encoded when `chunked`), split into the writes of the send plan. */
export function bodyWrites(plan: ClientPlan, body: Buffer): { writes: Buffer[]; complete: boolean } {
  const pieces: Buffer[] = [];
  const send = plan.send;
  let limit = body.length;
  if (send.kind === 'abort' || send.kind === 'stall') limit = Math.floor((body.length * send.percent) / 100);
  const count = send.kind === 'slow' ? send.pieces : 1;
  const size = Math.max(1, Math.ceil(limit / count));
  for (let start = 0; start < limit; start += size) pieces.push(body.subarray(start, Math.min(limit, start + size)));
  const complete = limit === body.length;
  if (!plan.chunked) return { writes: pieces, complete };
  const writes = pieces.map((p) => Buffer.concat([Buffer.from(`${p.length.toString(16)}\r\n`), p, Buffer.from('\r\n')]));
  if (complete) writes.push(Buffer.from('0\r\n\r\n'));
  return { writes, complete };
}

export function describeRequest(plan: ClientPlan, id: string): string {
  const body = renderBody(plan);
  const shown = body.length > 220 ? `${body.subarray(0, 160).toString('utf8')}…(${body.length} bytes)…${body.subarray(body.length - 40).toString('utf8')}` : body.toString('utf8');
  const extras = [
    plan.contentType === 'application/json' ? '' : `content-type: ${plan.contentType}`,
    plan.headerBytes > 0 ? `a ${plan.headerBytes}-byte header` : '',
    plan.chunked ? 'chunked body' : '',
    plan.send.kind === 'whole' ? '' : `send ${JSON.stringify(plan.send)}`,
    plan.read.kind === 'all' ? '' : `read ${JSON.stringify(plan.read)}`,
    plan.startMs > 0 ? `starts at +${plan.startMs} ms` : '',
  ].filter((s) => s !== '');
  return `  request ${id}: POST ${routePath(plan.route)} ${shown.replace(/(.)\1{30,}/g, (run, ch: string) => `${ch}…(×${run.length})`)}${extras.length > 0 ? `\n    client: ${extras.join(', ')}` : ''}`;
}
