/**
 * The one failure table: every way a request ends before commit with an error answer — an attempt's failure, or the
 * gateway's own refusal — and, per cause, Waybill's error code and message, the outcome it is counted as, and where
 * its status comes from. Pure data and two small functions over it.
 *
 * - An attempt's failure names what the upstream did in the terms of the status table (status-map.ts, the same
 *   table as docs/errors.md "From the upstream, before any output"): that gives the status per API shape and whether
 *   it is retried. The record builds its failures here (`failureOf`, from accounting/record-upstream.ts), the
 *   machine answers them (`failureResponse`).
 * - A refusal (the admission queue, no upstream free, shutdown, a caught bug) takes its status from its error code's
 *   row in errors.ts; the machine answers them (`refusalResponse`), and the settlement counts every answer the gateway
 *   gave without an attempt by its status (`rejectionOutcome`, also for http/answers.ts).
 *
 * test/status-map.test.ts checks docs/errors.md's rows against `failureOf` and `failureResponse`: status per shape,
 * error code, retried.
 */
import type { Outcome, Route } from '../accounting/outcomes.js';
import type { UpstreamError } from '../sse/classify.js';
import { ERRORS, errorBody, type ErrorBody, type ErrorCode } from './errors.js';
import { clientStatus, errorShapeOf, type UpstreamSignal } from './status-map.js';

export type FailureCause =
  | 'upstream_3xx'
  | 'upstream_4xx'
  | 'upstream_5xx'
  | 'error_payload'
  | 'connect_error'
  | 'reset'
  | 'incomplete'
  | 'timeout'
  | 'shutdown'
  /** An event larger than the limit, or more than the gateway holds before the first output. */
  | 'oversized'
  /** A 2xx that breaks the protocol: not an event stream where one was asked for, or not a completion body. */
  | 'not_event_stream'
  | 'malformed_body'
  /** A compressed body (Waybill asks for identity encoding: it must read every byte). */
  | 'compressed'
  /** Waybill itself failed (a bug, caught): the client gets 500. */
  | 'internal';

/** A pre-commit failure of an attempt, as the client would be told about it. */
export interface Failure {
  readonly status: number;
  readonly outcome: Outcome;
  readonly cause: FailureCause;
  /** The upstream's own error, when it sent one. */
  readonly upstreamError: UpstreamError | undefined;
}

interface FailureRow {
  /**
   * What the upstream did, in the status table's terms: the status per shape and the retry rule. `http` and `event`
   * (and a deadline) depend on the attempt: the caller gives the signal. Undefined: the status is the error code's.
   */
  readonly signal: UpstreamSignal | 'given' | undefined;
  /** Waybill's error code in the answer; for `relays`, only when the upstream sent no error of its own. */
  readonly code: ErrorCode;
  /** `by_status`: rejected below 500 (the client's request was refused), failed from 500. */
  readonly outcome: Outcome | 'by_status';
  /** The upstream's message, type, param and code are relayed when it sent an error. */
  readonly relays: 'always' | 'below_500_or_sent' | 'message' | 'never';
  readonly message: (status: number, upstream: string | undefined) => string;
}

const fixed = (message: string) => (): string => message;

export const FAILURES: Readonly<Record<FailureCause, FailureRow>> = {
  upstream_3xx: { signal: 'given', code: 'upstream_protocol_error', outcome: 'failed', relays: 'never', message: fixed('the upstream answered with a redirect, which Waybill does not follow') },
  upstream_4xx: { signal: 'given', code: 'upstream_error', outcome: 'rejected', relays: 'below_500_or_sent', message: (status, upstream) => upstream || `upstream answered ${status}` },
  upstream_5xx: { signal: 'given', code: 'upstream_error', outcome: 'failed', relays: 'message', message: (_status, upstream) => `upstream failed: ${upstream || 'server error'}` },
  error_payload: {
    signal: 'given',
    code: 'upstream_error',
    outcome: 'by_status',
    relays: 'below_500_or_sent',
    message: (status, upstream) => upstream || `upstream answered ${status}`,
  },
  connect_error: { signal: { kind: 'connect_error' }, code: 'upstream_unreachable', outcome: 'failed', relays: 'never', message: fixed('could not connect to an upstream') },
  reset: { signal: { kind: 'reset' }, code: 'upstream_reset', outcome: 'failed', relays: 'never', message: fixed('the upstream connection was reset before any output') },
  incomplete: { signal: { kind: 'incomplete' }, code: 'upstream_incomplete', outcome: 'failed', relays: 'never', message: fixed('the upstream ended its response before any output') },
  timeout: { signal: 'given', code: 'upstream_timeout', outcome: 'timeout', relays: 'never', message: fixed('the upstream did not produce output in time') },
  // Shutting down is not the upstream's failure: 503, so clients and load balancers go elsewhere.
  shutdown: { signal: undefined, code: 'shutting_down', outcome: 'failed', relays: 'never', message: fixed('the gateway is shutting down; retry the request') },
  oversized: {
    signal: { kind: 'unreadable' },
    code: 'upstream_protocol_error',
    outcome: 'failed',
    relays: 'never',
    message: fixed('the upstream sent more than the gateway holds before the first output (an oversized event, or too many bytes or events)'),
  },
  not_event_stream: { signal: { kind: 'unreadable' }, code: 'upstream_protocol_error', outcome: 'failed', relays: 'never', message: fixed('the upstream answered a streaming request without an event stream') },
  malformed_body: { signal: { kind: 'unreadable' }, code: 'upstream_protocol_error', outcome: 'failed', relays: 'never', message: fixed('the upstream answered with a body that is not a completion') },
  compressed: { signal: { kind: 'unreadable' }, code: 'upstream_protocol_error', outcome: 'failed', relays: 'never', message: fixed('the upstream answered with a compressed body, which Waybill cannot account') },
  internal: { signal: undefined, code: 'internal_error', outcome: 'failed', relays: 'never', message: fixed('internal error') },
};

/**
 * The failure of an attempt on `route`. `signal` is what the upstream did, for the causes whose status depends on it
 * (an HTTP status, an error event's code, which deadline); the others have theirs in the table.
 */
export function failureOf(cause: FailureCause, route: Route, signal?: UpstreamSignal, upstreamError?: UpstreamError): Failure {
  const row = FAILURES[cause];
  const given = row.signal === 'given' ? signal : row.signal;
  if (row.signal === 'given' && given === undefined) throw new Error(`failure ${cause} needs the upstream's signal`);
  const status = given === undefined ? ERRORS[row.code].status : clientStatus(given, errorShapeOf(route));
  const outcome = row.outcome === 'by_status' ? rejectionOutcome(status) : row.outcome;
  return { status, outcome, cause, upstreamError };
}

/** Longest upstream error message relayed to a client; the rest is cut (an upstream's body is not ours to amplify). */
const MAX_RELAYED_MESSAGE = 4096;

function relayed(message: string | undefined): string | undefined {
  return message !== undefined && message.length > MAX_RELAYED_MESSAGE ? `${message.slice(0, MAX_RELAYED_MESSAGE)}…` : message;
}

function relayedField(value: string | undefined): string | undefined {
  return value !== undefined && value.length > 256 ? value.slice(0, 256) : value;
}

/** The status and body a client gets for a pre-commit failure (in OpenAI's shape; errorBodyFor makes it the route's). */
export function failureResponse(failure: Failure): { status: number; body: ErrorBody } {
  const row = FAILURES[failure.cause];
  const { status } = failure;
  const upstream = row.relays === 'never' ? undefined : failure.upstreamError;
  const message = relayed(upstream?.message);
  if (row.relays === 'below_500_or_sent' && (status < 500 || upstream !== undefined)) {
    return {
      status,
      body: {
        error: {
          message: row.message(status, message),
          type: relayedField(upstream?.type) ?? (status < 500 ? 'invalid_request_error' : 'upstream_error'),
          param: relayedField(upstream?.param) ?? null,
          code: upstream?.code ?? status,
        },
      },
    };
  }
  if (row.relays === 'below_500_or_sent') return { status, body: errorBody(row.code, `upstream error (${status})`) };
  return { status, body: errorBody(row.code, row.message(status, message)) };
}

/** Why the gateway answers a request itself, without (another) attempt, with one of its own error codes. */
export type Refusal = 'queue_full' | 'queue_timeout' | 'queue_deadline' | 'no_upstream' | 'shutting_down' | 'internal';

interface RefusalRow {
  readonly code: ErrorCode;
  readonly message: (model: string) => string;
  /** Retry-After Waybill sends with its own 429: the queue is a second's worth of work for a healthy pool. */
  readonly retryAfter?: string;
}

export const REFUSALS: Readonly<Record<Refusal, RefusalRow>> = {
  queue_full: { code: 'overloaded', retryAfter: '1', message: (model) => `model "${model}" is at capacity and its queue is full; retry later` },
  queue_timeout: { code: 'overloaded', retryAfter: '1', message: (model) => `model "${model}" is at capacity; the request waited its queue timeout` },
  queue_deadline: { code: 'overloaded', retryAfter: '1', message: (model) => `model "${model}" is at capacity; the request reached its time limit in the queue` },
  no_upstream: { code: 'no_upstream', message: (model) => `every upstream of model "${model}" is at its max_inflight` },
  shutting_down: { code: 'shutting_down', message: () => 'the gateway is shutting down; retry the request' },
  internal: { code: 'internal_error', message: () => 'internal error' },
};

/** The status, body and extra headers of a refusal. */
export function refusalResponse(refusal: Refusal, model: string): { status: number; body: ErrorBody; headers: Record<string, string> } {
  const row = REFUSALS[refusal];
  return {
    status: ERRORS[row.code].status,
    body: errorBody(row.code, row.message(model)),
    headers: row.retryAfter === undefined ? {} : { 'retry-after': row.retryAfter },
  };
}

/** How a request the gateway answered itself with `status` is counted: refused below 500, failed from 500. */
export function rejectionOutcome(status: number): Outcome {
  return status >= 500 ? 'failed' : 'rejected';
}

/**
 * A refusal for want of capacity (429, 503: the queue, no upstream, limits, shutdown) counts against the SLO — the
 * user was not served; a refused bad request does not.
 */
export function isCapacityRefusal(status: number): boolean {
  return status === ERRORS.overloaded.status || status === ERRORS.no_upstream.status;
}
