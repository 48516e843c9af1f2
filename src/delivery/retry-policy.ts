/**
 * What a failed attempt means for retrying and for the upstream's health. Pure: decisions from the attempt's
 * record, the configuration, and a random number for jitter.
 */
import type { AttemptRecord } from '../accounting/ledger.js';
import type { RetryReason } from '../accounting/outcomes.js';

export interface RetryRules {
  readonly retryOn500: boolean;
  readonly backoffBaseMs: number;
  readonly backoffMaxMs: number;
  readonly retryAfterMaxMs: number;
}

/** Why this attempt may be retried, or undefined when it must not be (4xx, 4xx-class error events, success). */
export function retryReason(attempt: AttemptRecord, rules: RetryRules): RetryReason | undefined {
  switch (attempt.result) {
    case 'connect_error':
    case 'reset':
    case 'incomplete':
    case 'timeout':
      return attempt.result;
    case 'http_5xx': {
      const status = attempt.status ?? 0;
      if (status === 502 || status === 503 || status === 504) return 'http_5xx';
      return status === 500 && rules.retryOn500 ? 'http_5xx' : undefined;
    }
    case 'http_4xx':
      if (attempt.status === 429) return 'http_429';
      return attempt.status === 408 ? 'http_408' : undefined;
    case 'error_payload': {
      const code = attempt.failure?.upstreamError?.code;
      return code !== undefined && code >= 500 ? 'error_payload' : undefined;
    }
    case 'ok':
    case 'http_3xx':
    case 'cancelled':
    case undefined:
      return undefined;
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
