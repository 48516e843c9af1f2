/**
 * A grammar of upstream transcripts: what a vLLM (or something pretending to be one) sends back for one attempt.
 * Valid vLLM stream events (docs/routes.md) mixed with hostile pieces: absurd usage values, finish reasons for
 * choice indices outside n, floods of blank and comment lines, oversized and unterminated events, invalid UTF-8,
 * CR/LF/CRLF mixes, data after `[DONE]`, `[DONE]` after an error, non-SSE and compressed bodies, redirects and
 * error statuses with huge HTML bodies, and connections cut at any byte. The bytes are sent in generated splits
 * (down to one byte per chunk) with optional delays.
 *
 * Everything here is plain data, so fast-check can shrink it and a failure prints as a readable transcript
 * (`describeTranscript`); `renderTranscript` turns it into the exact bytes the scripted upstream writes.
 */
import { cutInto } from '../fixtures/sse-fixtures.js';
import { gzipSync } from 'node:zlib';
import fc from 'fast-check';
import { createRandom } from '../../src/util/prng.js';

export type Route = 'chat_completions' | 'completions';
export type LineEnd = 'lf' | 'crlf' | 'cr';

/** What the transcript is generated for: the request's route, its choices (n × prompts) and whether it streams. */
export interface TranscriptContext {
  readonly route: Route;
  /** n × prompts as the client asked; 0 when the request is not a valid completion request. */
  readonly choices: number;
  readonly stream: boolean;
}

/** A JSON value that is written as is (numbers such as 1e308, strings, null, ...). */
export type Json = null | boolean | number | string;

/** One piece of an event stream. `unterminated` leaves out the blank line that would dispatch the event. */
export type UpEvent =
  | { t: 'role'; index: number }
  | { t: 'content'; index: Json; text: string }
  | { t: 'finish'; index: Json; reason: string; text: string }
  /** One chunk finishing choices [from, to) (vLLM sends one choice per chunk; this keeps huge n × prompts small). */
  | { t: 'finish_many'; from: number; to: number; reason: string }
  | { t: 'usage'; prompt: Json; completion: Json; cached: Json | undefined }
  | { t: 'done' }
  | { t: 'error'; code: Json; python: boolean }
  | { t: 'error_string'; message: string }
  | { t: 'comment'; text: string; count: number }
  | { t: 'blank'; count: number }
  | { t: 'oversized'; bytes: number }
  | { t: 'invalid_utf8'; index: number }
  | { t: 'malformed'; text: string }
  | { t: 'multiline'; index: number; text: string }
  | { t: 'typed_error' };

export interface Placed {
  readonly ev: UpEvent;
  readonly unterminated: boolean;
}

/** How the bytes are cut into writes. */
export type Split = { kind: 'whole' } | { kind: 'cuts'; cuts: number[] } | { kind: 'drip' };

/** How the upstream response ends. `destroy`/`reset` cut the connection after `afterBytes` bytes (mod length). */
export type End =
  | { kind: 'end' }
  | { kind: 'destroy'; afterBytes: number }
  | { kind: 'reset'; afterBytes: number }
  /** Send everything, then keep the connection open and silent until the gateway lets go. */
  | { kind: 'hang' };

/** Delays before writes: none, a small jitter before each, or one long stall before write number `before`. */
export type Delays = { kind: 'none' } | { kind: 'jitter'; maxMs: number; seed: number } | { kind: 'stall'; before: number; ms: number };

export type PlainBody =
  | { t: 'completion'; extraFinishIndex: Json | undefined; dropFinish: boolean; usage: UsageValues | undefined }
  | { t: 'html'; bytes: number }
  | { t: 'error_json'; code: Json }
  | { t: 'error_string'; message: string }
  | { t: 'detail' }
  | { t: 'empty' }
  | { t: 'sse_text' };

export interface UsageValues {
  prompt: Json;
  completion: Json;
  cached: Json | undefined;
}

export type Transcript =
  | {
      kind: 'sse';
      status: number;
      contentType: string;
      /** `lying`: the header says gzip, the bytes are plain; `real`: the bytes are gzipped. */
      gzip: 'none' | 'lying' | 'real';
      events: Placed[];
      /** Line ends, cycled over the events (one entry: uniform; several: a mix). */
      lineEnds: LineEnd[];
      split: Split;
      delays: Delays;
      end: End;
    }
  | {
      kind: 'plain';
      status: number;
      contentType: string | null;
      retryAfter: string | null;
      location: boolean;
      body: PlainBody;
      /** Content-Length or chunked transfer encoding. */
      framing: 'length' | 'chunked';
      split: Split;
      delays: Delays;
      end: End;
    };

/** Knobs for how hostile (and how slow) the generated transcripts are. */
export interface UpstreamGrammarOptions {
  /** Integer weight of transcripts that wait for gateway timeouts (long stalls, hanging connections). Default 4 (of ~50). */
  readonly slowWeight?: number;
  /** The gateway's `streaming.max_event_bytes`, so oversized events are just over it. */
  readonly maxEventBytes: number;
  /** The gateway's `streaming.max_response_bytes`, so huge bodies are just over it. */
  readonly maxResponseBytes: number;
}

// --- Arbitraries -----------------------------------------------------------------------------------------------

/** Lets a value shrink across branches, toward the first (simplest) one: a failure then shrinks to plain pieces. */
const CROSS = { withCrossShrink: true } as const;


const hostileNumber: fc.Arbitrary<Json> = fc.oneof(CROSS, 
  fc.constantFrom<Json>(1e308, -1, -100, 0.5, 12.75, '12', 'lots', null, true, 2 ** 53 + 2, Number.MAX_SAFE_INTEGER),
  fc.integer({ min: -5, max: 5 }),
);

const plausibleCount = fc.integer({ min: 0, max: 70_000 });

const usageValues: fc.Arbitrary<UsageValues> = fc.oneof(CROSS, 
  { weight: 3, arbitrary: fc.record({ prompt: plausibleCount, completion: plausibleCount, cached: fc.option(plausibleCount, { nil: undefined }) }) },
  // cached_tokens > prompt_tokens
  {
    weight: 1,
    arbitrary: fc.integer({ min: 0, max: 1000 }).map((p) => ({ prompt: p, completion: 3, cached: p + 1 + (p % 7) })),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      prompt: fc.oneof(CROSS, plausibleCount, hostileNumber),
      completion: fc.oneof(CROSS, plausibleCount, hostileNumber),
      cached: fc.option(fc.oneof(CROSS, plausibleCount, hostileNumber), { nil: undefined }),
    }),
  },
);

const finishReason = fc.constantFrom('stop', 'stop', 'length', 'tool_calls', 'abort', 'repetition', 'content_filter', 'weird', 'none', 'other', '');

/** Choice indices a hostile upstream might name: far past n, negative, fractional, not a number. */
const hostileIndex = (choices: number): fc.Arbitrary<Json> =>
  fc.oneof(CROSS, fc.constantFrom<Json>(5000, -1, 0.5, 1.5, '0', null, 2 ** 31, 1e308), fc.constant(choices), fc.constant(choices + 1));

const errorCode: fc.Arbitrary<Json> = fc.constantFrom<Json>(500, 400, 429, 503, 404, 200, 99, 600, -1, 1e308, '503', 'oops', null, 0.5);

const text = fc.oneof(CROSS, 
  fc.constantFrom('Hel', 'lo!', ' ', 'é', '漢字', '\n\n', 'data: [DONE]\n\n', '"quoted"', '\u2028', '😀'),
  fc.string({ maxLength: 12 }),
);

function hostileEvent(ctx: TranscriptContext, options: UpstreamGrammarOptions): fc.Arbitrary<UpEvent> {
  const anyIndex = fc.nat(Math.max(0, ctx.choices + 1));
  return fc.oneof(CROSS, 
    fc.record({ t: fc.constant('usage' as const), prompt: fc.oneof(CROSS, plausibleCount, hostileNumber), completion: fc.oneof(CROSS, plausibleCount, hostileNumber), cached: fc.option(fc.oneof(CROSS, plausibleCount, hostileNumber), { nil: undefined }) }),
    fc.record({ t: fc.constant('finish' as const), index: hostileIndex(ctx.choices), reason: finishReason, text: fc.constantFrom('', 'x') }),
    fc.record({ t: fc.constant('content' as const), index: fc.oneof(CROSS, anyIndex, hostileIndex(ctx.choices)), text }),
    fc.record({ t: fc.constant('blank' as const), count: fc.oneof(CROSS, fc.integer({ min: 1, max: 5 }), fc.constantFrom(500, 5000, 40_000)) }),
    fc.record({ t: fc.constant('comment' as const), text: fc.constantFrom('', 'keep-alive', 'x'.repeat(200)), count: fc.oneof(CROSS, fc.integer({ min: 1, max: 5 }), fc.constantFrom(300, 3000)) }),
    fc.record({ t: fc.constant('oversized' as const), bytes: fc.constantFrom(options.maxEventBytes + 1, options.maxEventBytes * 2) }),
    fc.record({ t: fc.constant('invalid_utf8' as const), index: anyIndex }),
    fc.record({ t: fc.constant('malformed' as const), text: fc.constantFrom('{"id":"broken', 'null', '[1,2]', '42', '"str"', '{}', '{"choices":7}', '{"usage":5}', 'data: nested', '') }),
    fc.record({ t: fc.constant('multiline' as const), index: anyIndex, text }),
    fc.record({ t: fc.constant('error' as const), code: errorCode, python: fc.boolean() }),
    fc.record({ t: fc.constant('error_string' as const), message: fc.constantFrom('Unauthorized', '') }),
    fc.constant({ t: 'typed_error' as const }),
    fc.constant({ t: 'done' as const }),
  );
}

/** A plausible vLLM stream for the context, before mutation: role chunks, deltas, finish chunks, usage, [DONE]. */
function validStream(ctx: TranscriptContext): fc.Arbitrary<UpEvent[]> {
  const choices = Math.max(1, ctx.choices);
  return fc
    .record({
      deltas: fc.array(fc.record({ index: fc.nat(choices - 1), text }), { maxLength: 6 }),
      reason: finishReason,
      usage: fc.option(usageValues, { nil: undefined }),
    })
    .map(({ deltas, reason, usage }) => {
      const events: UpEvent[] = [];
      // vLLM sends one role chunk per choice; past a few, one is enough to stand for them (the stream stays small).
      if (ctx.route === 'chat_completions') for (let i = 0; i < Math.min(choices, 4); i++) events.push({ t: 'role', index: i });
      for (const d of deltas) events.push({ t: 'content', index: d.index, text: d.text });
      if (choices <= 8) {
        for (let i = 0; i < choices; i++) events.push({ t: 'finish', index: i, reason: reason || 'stop', text: i % 2 === 0 ? '' : '.' });
      } else {
        for (let from = 0; from < choices; from += 256) events.push({ t: 'finish_many', from, to: Math.min(choices, from + 256), reason: reason || 'stop' });
      }
      if (usage !== undefined) events.push({ t: 'usage', ...usage });
      events.push({ t: 'done' });
      return events;
    });
}

interface Mutation {
  /** Where: a position in the event list (mod its length + 1). */
  at: number;
  op: { kind: 'insert'; ev: UpEvent } | { kind: 'delete' } | { kind: 'unterminate' };
}

function mutations(ctx: TranscriptContext, options: UpstreamGrammarOptions): fc.Arbitrary<Mutation[]> {
  const some = fc.array(
    fc.record({
      at: fc.nat(),
      op: fc.oneof(CROSS, 
        { weight: 5, arbitrary: hostileEvent(ctx, options).map((ev) => ({ kind: 'insert' as const, ev })) },
        { weight: 2, arbitrary: fc.constant({ kind: 'delete' as const }) },
        { weight: 1, arbitrary: fc.constant({ kind: 'unterminate' as const }) },
      ),
    }),
    { minLength: 1, maxLength: 4 },
  );
  // A good share of streams stay valid, so delivered answers (and their accounting) are exercised too.
  return fc.oneof(CROSS, { weight: 2, arbitrary: fc.constant<Mutation[]>([]) }, { weight: 3, arbitrary: some });
}

function applyMutations(events: UpEvent[], muts: Mutation[]): Placed[] {
  const placed: Placed[] = events.map((ev) => ({ ev, unterminated: false }));
  for (const m of muts) {
    const at = m.at % (placed.length + 1);
    switch (m.op.kind) {
      case 'insert':
        placed.splice(at, 0, { ev: m.op.ev, unterminated: false });
        break;
      case 'delete':
        if (at < placed.length) placed.splice(at, 1);
        break;
      case 'unterminate': {
        const target = placed[Math.min(at, placed.length - 1)];
        if (target !== undefined) placed[Math.min(at, placed.length - 1)] = { ...target, unterminated: true };
        break;
      }
    }
  }
  return placed;
}

const split: fc.Arbitrary<Split> = fc.oneof(CROSS, 
  { weight: 3, arbitrary: fc.constant({ kind: 'whole' as const }) },
  { weight: 4, arbitrary: fc.array(fc.nat(), { minLength: 1, maxLength: 12 }).map((cuts) => ({ kind: 'cuts' as const, cuts })) },
  { weight: 1, arbitrary: fc.constant({ kind: 'drip' as const }) },
);

function delays(slowWeight: number): fc.Arbitrary<Delays> {
  return fc.oneof(CROSS, 
    { weight: 32, arbitrary: fc.constant({ kind: 'none' as const }) },
    { weight: 12, arbitrary: fc.record({ kind: fc.constant('jitter' as const), maxMs: fc.integer({ min: 1, max: 15 }), seed: fc.nat() }) },
    // Long enough for the idle (1 s) or first-output (2 s) clock of the fuzz gateway to fire.
    { weight: slowWeight, arbitrary: fc.record({ kind: fc.constant('stall' as const), before: fc.nat(8), ms: fc.constantFrom(1200, 2200) }) },
  );
}

function end(slowWeight: number): fc.Arbitrary<End> {
  return fc.oneof(CROSS, 
    { weight: 48, arbitrary: fc.constant({ kind: 'end' as const }) },
    { weight: 8, arbitrary: fc.record({ kind: fc.constant('destroy' as const), afterBytes: fc.nat() }) },
    { weight: 4, arbitrary: fc.record({ kind: fc.constant('reset' as const), afterBytes: fc.nat() }) },
    { weight: slowWeight, arbitrary: fc.constant({ kind: 'hang' as const }) },
  );
}

function sseTranscript(ctx: TranscriptContext, options: UpstreamGrammarOptions): fc.Arbitrary<Transcript> {
  const slow = options.slowWeight ?? 4;
  return fc
    .record({
      status: fc.constantFrom(200, 200, 200, 200, 201, 500),
      contentType: fc.oneof(
        CROSS,
        { weight: 10, arbitrary: fc.constant('text/event-stream; charset=utf-8') },
        { weight: 2, arbitrary: fc.constantFrom('text/event-stream', 'TEXT/EVENT-STREAM') },
        { weight: 1, arbitrary: fc.constantFrom('text/plain', 'text/html; charset=utf-8', 'application/json') },
      ),
      gzip: fc.oneof(CROSS, { weight: 12, arbitrary: fc.constant('none' as const) }, { weight: 1, arbitrary: fc.constantFrom('lying' as const, 'real' as const) }),
      events: validStream(ctx),
      muts: mutations(ctx, options),
      lineEnds: fc.oneof(CROSS, 
        { weight: 6, arbitrary: fc.constant<LineEnd[]>(['lf']) },
        { weight: 1, arbitrary: fc.constant<LineEnd[]>(['crlf']) },
        { weight: 1, arbitrary: fc.constant<LineEnd[]>(['cr']) },
        { weight: 2, arbitrary: fc.array(fc.constantFrom<LineEnd>('lf', 'crlf', 'cr'), { minLength: 2, maxLength: 4 }) },
      ),
      split,
      delays: delays(slow),
      end: end(slow),
    })
    .map(({ events, muts, contentType, status, ...rest }) => ({
      kind: 'sse' as const,
      // Mostly the real thing; sometimes a non-SSE type or status over an event stream.
      status,
      contentType,
      events: applyMutations(events, muts),
      ...rest,
    }));
}

function plainTranscript(ctx: TranscriptContext, options: UpstreamGrammarOptions, okWeight: number): fc.Arbitrary<Transcript> {
  const slow = options.slowWeight ?? 4;
  const body: fc.Arbitrary<PlainBody> = fc.oneof(CROSS, 
    {
      weight: okWeight,
      arbitrary: fc.record({
        t: fc.constant('completion' as const),
        extraFinishIndex: fc.option(hostileIndex(ctx.choices), { nil: undefined, freq: 3 }),
        dropFinish: fc.boolean(),
        usage: fc.option(usageValues, { nil: undefined }),
      }),
    },
    { weight: 2, arbitrary: fc.record({ t: fc.constant('html' as const), bytes: fc.constantFrom(100, 20_000, options.maxResponseBytes + 1) }) },
    { weight: 2, arbitrary: fc.record({ t: fc.constant('error_json' as const), code: errorCode }) },
    { weight: 1, arbitrary: fc.record({ t: fc.constant('error_string' as const), message: fc.constantFrom('Unauthorized', 'Service Unavailable') }) },
    { weight: 1, arbitrary: fc.constant({ t: 'detail' as const }) },
    { weight: 1, arbitrary: fc.constant({ t: 'empty' as const }) },
    { weight: 1, arbitrary: fc.constant({ t: 'sse_text' as const }) },
  );
  return fc.record({
    kind: fc.constant('plain' as const),
    status: fc.oneof(CROSS, 
      { weight: okWeight, arbitrary: fc.constant(200) },
      { weight: 4, arbitrary: fc.constantFrom(201, 301, 302, 307, 400, 401, 404, 408, 413, 422, 429, 500, 501, 502, 503, 504) },
    ),
    contentType: fc.constantFrom<string | null>('application/json', 'application/json', 'text/html; charset=utf-8', 'text/plain', null, 'text/event-stream'),
    retryAfter: fc.constantFrom<string | null>(null, null, null, '0', '1', 'soon', '86400'),
    location: fc.boolean(),
    body,
    framing: fc.constantFrom<'length' | 'chunked'>('length', 'chunked'),
    split,
    delays: delays(slow),
    end: end(slow),
  });
}

/** One attempt's transcript for a request of this context. */
export function transcriptArbitrary(ctx: TranscriptContext, options: UpstreamGrammarOptions): fc.Arbitrary<Transcript> {
  return ctx.stream
    ? fc.oneof(CROSS, { weight: 6, arbitrary: sseTranscript(ctx, options) }, { weight: 1, arbitrary: plainTranscript(ctx, options, 1) })
    : fc.oneof(CROSS, { weight: 1, arbitrary: sseTranscript(ctx, options) }, { weight: 5, arbitrary: plainTranscript(ctx, options, 8) });
}

/** The transcripts of the attempts of one request (a retry takes the next; past the end, the last repeats). */
export function attemptTranscripts(ctx: TranscriptContext, options: UpstreamGrammarOptions): fc.Arbitrary<Transcript[]> {
  return fc.array(transcriptArbitrary(ctx, options), { minLength: 1, maxLength: 2 });
}

// --- Rendering -------------------------------------------------------------------------------------------------

const EOL: Record<LineEnd, string> = { lf: '\n', crlf: '\r\n', cr: '\r' };

function chatChunk(route: Route, choice: string): string {
  const object = route === 'chat_completions' ? 'chat.completion.chunk' : 'text_completion';
  return `{"id":"chatcmpl-fuzz","object":"${object}","created":1779883200,"model":"m","choices":[${choice}]}`;
}

function outputChoice(route: Route, index: Json, content: string, finish: string | null): string {
  const reason = finish === null ? 'null' : JSON.stringify(finish);
  const stop = finish === null ? '' : ',"stop_reason":null';
  return route === 'chat_completions'
    ? `{"index":${JSON.stringify(index)},"delta":{"content":${JSON.stringify(content)}},"logprobs":null,"finish_reason":${reason}${stop}}`
    : `{"index":${JSON.stringify(index)},"text":${JSON.stringify(content)},"logprobs":null,"finish_reason":${reason}${stop}}`;
}

function usageJson(u: UsageValues): string {
  const total = typeof u.prompt === 'number' && typeof u.completion === 'number' ? u.prompt + u.completion : 0;
  const details = u.cached === undefined ? '' : `,"prompt_tokens_details":{"cached_tokens":${JSON.stringify(u.cached)}}`;
  return `{"prompt_tokens":${JSON.stringify(u.prompt)},"total_tokens":${JSON.stringify(total)},"completion_tokens":${JSON.stringify(u.completion)}${details}}`;
}

function errorJson(code: Json, python: boolean): string {
  return python
    ? `{"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": ${JSON.stringify(code)}}}`
    : `{"error":{"message":"boom","type":"BadRequestError","param":null,"code":${JSON.stringify(code)}}}`;
}

/** The bytes of one event (or run of blank/comment lines) with its line ends. */
function renderEvent(route: Route, placed: Placed, le: string): Buffer {
  const ev = placed.ev;
  const end = placed.unterminated ? le : le + le;
  const data = (payload: string) => Buffer.from(`data: ${payload}${end}`, 'utf8');
  switch (ev.t) {
    case 'role':
      return route === 'chat_completions'
        ? data(chatChunk(route, `{"index":${ev.index},"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}`))
        : data(chatChunk(route, outputChoice(route, ev.index, '', null)));
    case 'content':
      return data(chatChunk(route, outputChoice(route, ev.index, ev.text, null)));
    case 'finish':
      return data(chatChunk(route, outputChoice(route, ev.index, ev.text, ev.reason)));
    case 'finish_many': {
      const choices: string[] = [];
      for (let i = ev.from; i < ev.to; i++) choices.push(outputChoice(route, i, '', ev.reason));
      return data(chatChunk(route, choices.join(',')));
    }
    case 'usage':
      return data(`{"id":"chatcmpl-fuzz","object":"chat.completion.chunk","created":1779883200,"model":"m","choices":[],"usage":${usageJson(ev)}}`);
    case 'done':
      return data('[DONE]');
    case 'error':
      return data(errorJson(ev.code, ev.python));
    case 'error_string':
      return data(JSON.stringify({ error: ev.message }));
    case 'comment':
      return Buffer.from(`:${ev.text}${le}`.repeat(ev.count), 'utf8');
    case 'blank':
      return Buffer.from(le.repeat(ev.count), 'utf8');
    case 'oversized':
      return data(`{"id":"chatcmpl-fuzz","pad":"${'x'.repeat(ev.bytes)}"}`);
    case 'invalid_utf8': {
      const [head, tail] = chatChunk(route, outputChoice(route, ev.index, '\u0000SPLIT\u0000', null)).split('\\u0000SPLIT\\u0000');
      return Buffer.concat([Buffer.from(`data: ${head ?? ''}`), Buffer.from([0xff, 0xfe, 0xc3, 0x28, 0xed, 0xa0, 0x80, 0xf0, 0x9f]), Buffer.from(`${tail ?? ''}${end}`)]);
    }
    case 'malformed':
      return data(ev.text);
    case 'multiline': {
      const json = chatChunk(route, outputChoice(route, ev.index, ev.text, null));
      const cut = json.indexOf('"model"');
      return Buffer.from(`data: ${json.slice(0, cut)}${le}data: ${json.slice(cut)}${end}`, 'utf8');
    }
    case 'typed_error':
      return Buffer.from(`event: error${le}data: ${errorJson(500, true)}${end}`, 'utf8');
  }
}

function htmlBody(bytes: number): Buffer {
  const head = '<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1><p>';
  const tail = '</p></body></html>\n';
  return Buffer.from(head + 'x'.repeat(Math.max(0, bytes - head.length - tail.length)) + tail, 'utf8');
}

function completionBody(route: Route, choices: number, b: Extract<PlainBody, { t: 'completion' }>): Buffer {
  const list: string[] = [];
  const n = Math.max(1, choices);
  for (let i = 0; i < n; i++) {
    const reason = b.dropFinish && i === n - 1 ? 'null' : '"stop"';
    list.push(
      route === 'chat_completions'
        ? `{"index":${i},"message":{"role":"assistant","content":"Hello!"},"logprobs":null,"finish_reason":${reason},"stop_reason":null}`
        : `{"index":${i},"text":"Hello!","logprobs":null,"finish_reason":${reason},"stop_reason":null}`,
    );
  }
  if (b.extraFinishIndex !== undefined) {
    list.push(
      route === 'chat_completions'
        ? `{"index":${JSON.stringify(b.extraFinishIndex)},"message":{"role":"assistant","content":"!"},"finish_reason":"length"}`
        : `{"index":${JSON.stringify(b.extraFinishIndex)},"text":"!","finish_reason":"length"}`,
    );
  }
  const object = route === 'chat_completions' ? 'chat.completion' : 'text_completion';
  const usage = b.usage === undefined ? '' : `,"usage":${usageJson(b.usage)}`;
  return Buffer.from(`{"id":"cmpl-fuzz","object":"${object}","created":1779883200,"model":"m","choices":[${list.join(',')}]${usage}}`, 'utf8');
}

function plainBody(route: Route, choices: number, body: PlainBody): Buffer {
  switch (body.t) {
    case 'completion':
      return completionBody(route, choices, body);
    case 'html':
      return htmlBody(body.bytes);
    case 'error_json':
      return Buffer.from(errorJson(body.code, false), 'utf8');
    case 'error_string':
      return Buffer.from(JSON.stringify({ error: body.message }), 'utf8');
    case 'detail':
      return Buffer.from('{"detail":"Not Found"}', 'utf8');
    case 'empty':
      return Buffer.alloc(0);
    case 'sse_text':
      return Buffer.from(`data: ${chatChunk(route, outputChoice(route, 0, 'hi', 'stop'))}\n\ndata: [DONE]\n\n`, 'utf8');
  }
}

/** Exactly what the scripted upstream does for one attempt. */
export interface RenderedTranscript {
  readonly status: number;
  readonly headers: Record<string, string>;
  /** The writes, in order; each is preceded by `delaysMs[i]` of silence. */
  readonly chunks: Buffer[];
  readonly delaysMs: number[];
  /** After the last write: end cleanly, destroy the socket (FIN), reset it (RST), or keep it open. */
  readonly end: 'end' | 'destroy' | 'reset' | 'hang';
}

/** The project's seeded PRNG (mulberry32), so jitter is part of the generated case. */
const mulberry32 = createRandom;

/** At most this many one-byte writes; the rest of a dripped body goes in one write. */
const MAX_DRIP = 2000;

function cut(bytes: Buffer, s: Split): Buffer[] {
  if (bytes.length === 0) return [];
  switch (s.kind) {
    case 'whole':
      return [bytes];
    case 'drip': {
      const chunks: Buffer[] = [];
      const dripped = Math.min(bytes.length, MAX_DRIP);
      for (let i = 0; i < dripped; i++) chunks.push(bytes.subarray(i, i + 1));
      if (dripped < bytes.length) chunks.push(bytes.subarray(dripped));
      return chunks;
    }
    case 'cuts':
      return cutInto(bytes, s.cuts);
  }
}

function delayPlan(count: number, d: Delays): number[] {
  const out = new Array<number>(count).fill(0);
  if (d.kind === 'jitter') {
    const random = mulberry32(d.seed);
    for (let i = 0; i < count; i++) out[i] = Math.floor(random() * (d.maxMs + 1));
  } else if (d.kind === 'stall' && count > 0) {
    out[Math.min(d.before, count - 1)] = d.ms;
  }
  return out;
}

export function renderTranscript(route: Route, choices: number, t: Transcript): RenderedTranscript {
  const headers: Record<string, string> = {};
  let bytes: Buffer;
  if (t.kind === 'sse') {
    headers['content-type'] = t.contentType;
    bytes = Buffer.concat(t.events.map((placed, i) => renderEvent(route, placed, EOL[t.lineEnds[i % t.lineEnds.length] ?? 'lf'])));
    if (t.gzip !== 'none') headers['content-encoding'] = 'gzip';
    if (t.gzip === 'real') bytes = gzipSync(bytes);
  } else {
    if (t.contentType !== null) headers['content-type'] = t.contentType;
    if (t.retryAfter !== null) headers['retry-after'] = t.retryAfter;
    // A redirect to a closed port on loopback: a gateway that followed it would fail, not reach anything.
    if (t.location) headers['location'] = 'http://127.0.0.1:9/v1/chat/completions';
    bytes = plainBody(route, choices, t.body);
    if (t.framing === 'length') headers['content-length'] = String(bytes.length);
  }
  if (t.end.kind === 'destroy' || t.end.kind === 'reset') bytes = bytes.subarray(0, t.end.afterBytes % (bytes.length + 1));
  const chunks = cut(bytes, t.split);
  return { status: t.status, headers, chunks, delaysMs: delayPlan(chunks.length, t.delays), end: t.end.kind };
}

// --- Description -----------------------------------------------------------------------------------------------

/** Printable bytes: escapes control characters and non-ASCII, elides long runs. */
export function printable(bytes: Buffer, max = 600): string {
  let text = '';
  for (const byte of bytes.subarray(0, max)) {
    if (byte === 0x0a) text += '\\n';
    else if (byte === 0x0d) text += '\\r';
    else if (byte === 0x5c) text += '\\\\';
    else if (byte >= 0x20 && byte < 0x7f) text += String.fromCharCode(byte);
    else text += `\\x${byte.toString(16).padStart(2, '0')}`;
  }
  text = text.replace(/(.)\1{40,}/g, (run, ch: string) => `${ch}…(×${run.length})`);
  text = text.replace(/((?:\\n|\\r\\n|\\r){6,})/g, (run) => `⟨${run.length} chars of line ends⟩`);
  return bytes.length > max ? `${text}…(+${bytes.length - max} bytes)` : text;
}

export function describeTranscript(route: Route, choices: number, t: Transcript, attempt: number): string {
  const r = renderTranscript(route, choices, t);
  const total = r.chunks.reduce((sum, c) => sum + c.length, 0);
  const how =
    t.split.kind === 'drip' ? 'one byte per write' : `${r.chunks.length} write(s)${t.split.kind === 'cuts' ? ` cut at ${r.chunks.map((c) => c.length).join('+')}` : ''}`;
  const delays = t.delays.kind === 'none' ? '' : `, delays ${JSON.stringify(t.delays)}`;
  const headers = Object.entries(r.headers)
    .map(([k, v]) => `${k}: ${v.length > 60 ? `${v.slice(0, 60)}…` : v}`)
    .join('; ');
  const body = Buffer.concat(r.chunks);
  return [
    `    upstream attempt ${attempt}: HTTP ${r.status} {${headers}}, ${total} bytes in ${how}${delays}, then ${r.end}${t.end.kind === 'destroy' || t.end.kind === 'reset' ? ` after ${total} bytes` : ''}`,
    `      body: ${printable(body)}`,
  ].join('\n');
}
