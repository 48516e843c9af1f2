/**
 * Bytes Waybill itself puts on the client's wire, and the joining of forwarded ones.
 */
import type { GatewayErrorCause } from '../accounting/ledger.js';
import { errorBody, type ErrorCode } from './errors.js';
import { classifyJson, type EventFacts } from '../sse/classify.js';

export const SSE_HEADERS = {
  'cache-control': 'no-cache',
  // Tell buffering reverse proxies in front of Waybill (nginx) to pass events through at once.
  'x-accel-buffering': 'no',
};

/** Classifies a whole non-stream body (or an error body); with `withParts`, with its answer's pieces. */
export function classifyBody(body: Buffer, withParts = false): EventFacts {
  try {
    return classifyJson(JSON.parse(body.toString('utf8')), withParts);
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
 * The SSE error event that ends a committed stream Waybill could not deliver. The OpenAI SDKs raise on an event
 * with an `error` key; a clean end without it would read as a complete answer.
 */
export function streamErrorEvent(cause: GatewayErrorCause): Buffer {
  const [code, message] = STREAM_ERRORS[cause];
  return Buffer.from(`data: ${JSON.stringify(errorBody(code, message))}\n\n`);
}
