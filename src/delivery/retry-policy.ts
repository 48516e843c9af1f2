/**
 * What a failed attempt means for retrying and for the upstream's health. Pure: decisions from the attempt's
 * record, the configuration, and a random number for jitter.
 */
import type { AttemptRecord } from '../accounting/ledger.js';
import type { RetryReason } from '../accounting/outcomes.js';
import { isRetried, retryRule, type UpstreamSignal } from './status-map.js';

export interface RetryRules {
  readonly retryOn500: boolean;
  readonly backoffBaseMs: number;
  readonly backoffMaxMs: number;
  readonly retryAfterMaxMs: number;
}

/** What the attempt's upstream did, in the terms of the status table (status-map.ts); undefined: not a failure. */
function signalOf(attempt: AttemptRecord): UpstreamSignal | undefined {
  switch (attempt.result) {
    case 'connect_error':
    case 'reset':
    case 'incomplete':
      return { kind: attempt.result };
    case 'timeout':
      // The total deadline stops every further attempt in the machine; what reaches here is the first-output one.
      return { kind: 'first_output_timeout' };
    case 'http_3xx':
    case 'http_4xx':
    case 'http_5xx':
      return { kind: 'http', status: attempt.status ?? 0 };
    case 'error_payload':
      return { kind: 'event', code: attempt.failure?.upstreamError?.code };
    case 'ok':
    case 'cancelled':
    case undefined:
      return undefined;
  }
}

/**
 * Why this attempt may be retried, or undefined when it must not be: the status table's rule (status-map.ts), which
 * treats an error event's code as the HTTP status it names — an event with code 500 is retried only under
 * `retry_on_500`, as an HTTP 500 is.
 */
export function retryReason(attempt: AttemptRecord, rules: RetryRules): RetryReason | undefined {
  const signal = signalOf(attempt);
  if (signal === undefined || !isRetried(retryRule(signal), rules.retryOn500)) return undefined;
  switch (signal.kind) {
    case 'http':
      if (signal.status === 429) return 'http_429';
      if (signal.status === 408) return 'http_408';
      return 'http_5xx';
    case 'event':
      return 'error_payload';
    case 'first_output_timeout':
    case 'total_timeout':
      return 'timeout';
    case 'unreadable':
      return 'incomplete';
    case 'connect_error':
    case 'reset':
    case 'incomplete':
      return signal.kind;
  }
}

/**
 * The wait before retry number `retry` (1 for the first retry): full jitter over an exponential backoff, or the
 * upstream's Retry-After for 429/408. Undefined when a Retry-After is longer than allowed (the client should get
 * the upstream's answer rather than wait that long in a gateway).
 */
export function retryDelay(
  reason: RetryReason,
  retry: number,
  retryAfterMs: number | undefined,
  rules: RetryRules,
  random: () => number,
): number | undefined {
  if (reason === 'http_429' || reason === 'http_408') {
    if (retryAfterMs !== undefined) return retryAfterMs <= rules.retryAfterMaxMs ? retryAfterMs : undefined;
  }
  const ceiling = Math.min(rules.backoffMaxMs, rules.backoffBaseMs * 2 ** (retry - 1));
  return random() * ceiling;
}

/** The attempt's verdict on its upstream's health, for passive health checking. */
export function healthVerdict(attempt: AttemptRecord): 'success' | 'failure' | 'none' {
  switch (attempt.result) {
    case 'ok':
    case 'http_4xx':
      return 'success';
    case 'error_payload': {
      const code = attempt.failure?.upstreamError?.code;
      // Lazy validation (400) is the client's fault, not the upstream's; an unknown code after commit is the engine's.
      return code !== undefined && code < 500 ? 'success' : 'failure';
    }
    case 'connect_error':
    case 'reset':
    case 'incomplete':
    case 'timeout':
    case 'http_3xx':
    case 'http_5xx':
      return 'failure';
    case 'cancelled':
    case undefined:
      return 'none';
  }
}
