/**
 * Bytes Waybill itself puts on the client's wire, and the joining of forwarded ones.
 */
import type { GatewayErrorCause } from '../accounting/ledger.js';
import { errorBody, type ErrorCode } from './errors.js';
import { isAudioRoute, isPoolingRoute, isWholeBodyRoute, type Route } from '../accounting/outcomes.js';
import { answerFacts, classifyDataLine, classifyEventData, classifyJson, classifyPoolingJson, type EventFacts } from '../sse/classify.js';
import type { ChunkScratch } from '../sse/fast-classify.js';
import { DataLineEvent, type SseEvent } from '../sse/framer.js';
import { classifyMessagesBody, classifyMessagesEvent, classifyResponsesBody, classifyResponsesEvent } from '../sse/route-events.js';
import { isRecord } from '../util/json.js';

/** A stream's head, the upstream's content type kept: a fresh object per response (writeHead completes it). */
export function sseHead(contentType: string | undefined): Record<string, string | number> {
  return {
    'content-type': contentType ?? 'text/event-stream; charset=utf-8',
    'cache-control': 'no-cache',
    // Tell buffering reverse proxies in front of Waybill (nginx) to pass events through at once.
    'x-accel-buffering': 'no',
  };
}

/** Classifies a whole non-stream body (or an error body); with `withParts`, with its answer's pieces. */
export function classifyBody(body: Buffer, withParts = false): EventFacts {
  try {
    return classifyJson(JSON.parse(body.toString('utf8')), withParts);
  } catch {
    return { kind: 'malformed' };
  }
}

/**
 * Classifies a non-generation route's whole body. Raw tensor bytes (`encoding_format` `bytes`/`bytes_only`, as
 * `application/octet-stream`) are an answer whose usage is not counted: vLLM puts it in a `metadata` header that
 * `bytes_only` leaves out.
 */
export function classifyPoolingBody(body: Buffer, contentType: string | undefined): EventFacts {
  if (contentType !== undefined && contentType.toLowerCase().startsWith('application/octet-stream')) {
    return answerFacts(undefined, undefined, undefined);
  }
  try {
    return classifyPoolingJson(JSON.parse(body.toString('utf8')));
  } catch {
    return { kind: 'malformed' };
  }
}

/** Joins the pieces of one write. Consecutive views of one upstream chunk are re-joined without a copy. */
export function coalesce(pieces: Buffer[]): Buffer {
  const first = pieces[0] as Buffer;
  if (pieces.length === 1) return first;
  let end = first.byteOffset + first.length;
  for (let i = 1; i < pieces.length; i++) {
    const piece = pieces[i] as Buffer;
    if (piece.buffer !== first.buffer || piece.byteOffset !== end) return Buffer.concat(pieces);
    end += piece.length;
  }
  return Buffer.from(first.buffer, first.byteOffset, end - first.byteOffset);
}

const STREAM_ERRORS: Record<GatewayErrorCause, [ErrorCode, string]> = {
  eof: ['stream_truncated', 'the upstream ended the stream before it was complete'],
  reset: ['stream_truncated', 'the upstream connection was reset mid-stream'],
  oversized: ['stream_truncated', 'the upstream sent an event larger than the configured limit'],
  unfinished_choices: ['stream_truncated', 'the upstream finished the stream without a finish_reason for every choice'],
  idle_timeout: ['stream_timeout', 'the upstream sent nothing within the idle timeout'],
  first_output_timeout: ['stream_timeout', 'the request exceeded its time limit'],
  total_timeout: ['stream_timeout', 'the request exceeded its time limit'],
  shutdown: ['stream_timeout', 'the gateway is shutting down and the stream did not finish in time'],
  internal: ['internal_error', 'the gateway failed while relaying the stream'],
};

/**
 * The SSE error event that ends a committed stream Waybill could not deliver, in the route's own shape:
 * - chat and completions: `data: {"error":{…}}` — the OpenAI SDKs raise on an event with an `error` key;
 * - Responses: `event: error` whose data has `type: "error"`, a top-level `error` object and the next
 *   `sequence_number` — every openai-node version raises on one or the other (docs/routes.md);
 * - Messages: `event: error` with Anthropic's `{"type":"error","error":{…}}` — the Anthropic SDK raises on it.
 * A clean end without it would read as a complete answer.
 */
export function streamErrorEvent(cause: GatewayErrorCause, route = 'chat_completions', nextSequence = 0): Buffer {
  const [code, message] = STREAM_ERRORS[cause];
  const body = errorBody(code, message);
  switch (route) {
    case 'responses':
    case 'responses_retrieve': {
      const data = { type: 'error', error: body.error, code, message, param: null, sequence_number: nextSequence };
      return Buffer.from(`event: error\ndata: ${JSON.stringify(data)}\n\n`);
    }
    case 'messages':
      return Buffer.from(`event: error\ndata: ${JSON.stringify({ type: 'error', error: { type: code === 'stream_timeout' ? 'timeout_error' : 'api_error', message } })}\n\n`);
    default:
      return Buffer.from(`data: ${JSON.stringify(body)}\n\n`);
  }
}

/** Classifies one upstream SSE event by the route's protocol. */
export function classifyStreamEvent(route: Route, event: SseEvent, withParts: boolean, knownId?: string, knownModel?: string, into?: ChunkScratch): EventFacts {
  if (route === 'responses') return classifyResponsesEvent(event.type, event.data, withParts);
  if (route === 'messages') return classifyMessagesEvent(event.type, event.data, withParts);
  // A stored response replayed: the Responses protocol, but its tokens were counted when it was generated.
  if (route === 'responses_retrieve') return withoutUsage(classifyResponsesEvent(event.type, event.data, withParts));
  // vLLM's every event, as the framer gives it: classified from its bytes, never decoded when the fast path takes it.
  if (event instanceof DataLineEvent) return classifyDataLine(event, withParts, knownId, knownModel, into);
  return classifyEventData(event.data, withParts, knownId, knownModel, into);
}

function withoutUsage(facts: EventFacts): EventFacts {
  if (facts.kind !== 'chunk' || (facts.usage === undefined && !facts.usageInvalid)) return facts;
  return { ...facts, usage: undefined, usageInvalid: false };
}

/**
 * A speech-to-text answer: `{"text": …}` (with `usage` in seconds of audio, which are not tokens, or `verbose_json`'s
 * segments), one choice finished with `stop`; an error body is an error.
 */
export function classifyAudioBody(json: unknown): EventFacts {
  if (!isRecord(json)) return { kind: 'malformed' };
  if (isRecord(json['error']) || typeof json['error'] === 'string') return classifyJson(json);
  const text = json['text'];
  if (typeof text !== 'string') return { kind: 'malformed' };
  const facts = answerFacts(undefined, undefined, undefined);
  if (facts.kind !== 'chunk') return facts;
  const answered = text.length > 0 ? [0] : [];
  return { ...facts, output: answered, answers: answered, choices: [0], finishes: [{ index: 0, reason: 'stop' }] };
}

/** Classifies a whole non-stream body (or an error body) by the route's protocol. */
export function classifyWholeBody(route: Route, body: Buffer, contentType: string | undefined, withParts: boolean): EventFacts {
  if (isPoolingRoute(route)) return classifyPoolingBody(body, contentType);
  if (route === 'chat_completions' || route === 'completions') return classifyBody(body, withParts);
  let json: unknown;
  try {
    json = JSON.parse(body.toString('utf8'));
  } catch {
    // A pass-through route may answer in anything; it is judged by its status alone.
    return route === 'passthrough' ? answerFacts(undefined, undefined, undefined) : { kind: 'malformed' };
  }
  if (isAudioRoute(route)) return classifyAudioBody(json);
  // An Anthropic-shaped error (`{"type":"error","error":{…}}`) on the Messages routes is read as Messages reads it:
  // the code buried in vLLM's converter message, else the status its Anthropic type names (docs/errors.md).
  if ((route === 'messages' || route === 'count_tokens') && isRecord(json) && json['type'] === 'error') return classifyMessagesBody(json, withParts);
  if (isWholeBodyRoute(route) || route === 'responses_retrieve') {
    // The store routes and pass-through: an error object is an error, anything else an answer; no usage counted.
    const facts = route === 'passthrough' && !isRecord(json) ? answerFacts(undefined, undefined, undefined) : classifyPoolingJson(json);
    return withoutUsage(facts);
  }
  // An OpenAI-shaped error body (any status) is an error on every route.
  // vLLM's auth middleware answers `{"error":"Unauthorized"}`: a string error is an error too.
  if (isRecord(json) && (isRecord(json['error']) || typeof json['error'] === 'string') && json['type'] !== 'message' && json['object'] !== 'response') {
    return classifyJson(json);
  }
  return route === 'responses' ? classifyResponsesBody(json, withParts) : classifyMessagesBody(json, withParts);
}
