/**
 * The one table of what an upstream's failure before any output becomes: the status the client is answered with,
 * per API shape, and whether Waybill retries it. docs/errors.md ("From the upstream, before any output") holds the
 * same table; test/status-map.test.ts checks every row of the doc against this module and drives each row through a
 * real gateway. Pure: no I/O, no clock. The failure table (failures.ts) asks it for statuses, the retry policy for retry rules.
 *
 * The rules, in short:
 * - An upstream HTTP 4xx is passed through with its own status. An upstream HTTP 5xx is the upstream's failure: 502,
 *   but on `/v1/messages` a 529 stays 529 (`overloaded_error`: the Anthropic SDK's OverloadedError).
 * - An error event before any output (vLLM's lazy validation: HTTP 200, one error event) is answered with the status
 *   its code names (400–599), else 502.
 * - Retrying follows the status, whichever way it came: an error event with code N is retried exactly when an HTTP N
 *   would be. 408, 429, 502, 503, 504 and 529 are retried; 500 only with `retries.retry_on_500` (vLLM answers 500
 *   when its engine died, and a dead engine fails every retry); every other 4xx and 5xx never.
 */

/** The error body shapes Waybill answers in. */
export type ErrorShape = 'openai' | 'anthropic';

/** The routes whose clients read Anthropic's error shape. */
export function errorShapeOf(route: string): ErrorShape {
  return route === 'messages' || route === 'count_tokens' ? 'anthropic' : 'openai';
}

/** What the upstream did that ended an attempt before any output reached the client. */
export type UpstreamSignal =
  /** A non-2xx status line (3xx, 4xx or 5xx). */
  | { readonly kind: 'http'; readonly status: number }
  /** An error event (or an error body under HTTP 2xx) before any output; `code` as read off it (route-events.ts). */
  | { readonly kind: 'event'; readonly code: number | undefined }
  /** A 2xx Waybill cannot read: not an event stream for a stream, compressed, an oversized event, not a completion. */
  | { readonly kind: 'unreadable' }
  /** No connection could be made (refused, DNS, TLS, connect timeout). */
  | { readonly kind: 'connect_error' }
  /** The connection was reset before any output. */
  | { readonly kind: 'reset' }
  /** The upstream ended its response before any output. */
  | { readonly kind: 'incomplete' }
  /** `timeouts.first_output` passed before the first output. */
  | { readonly kind: 'first_output_timeout' }
  /** `timeouts.total` passed before any output. */
  | { readonly kind: 'total_timeout' };

/** Whether Waybill makes another attempt (before commit, within `retries.max_attempts`, its budget and the deadline). */
export type RetryRule = 'yes' | 'no' | 'retry_on_500';

/** An error event's code, when it names an HTTP status. */
export function eventStatus(code: number | undefined): number | undefined {
  return code !== undefined && Number.isInteger(code) && code >= 400 && code <= 599 ? code : undefined;
}

/** The status the client is answered with. */
export function clientStatus(signal: UpstreamSignal, shape: ErrorShape): number {
  switch (signal.kind) {
    case 'http': {
      const status = signal.status;
      if (status >= 400 && status < 500) return status;
      if (status === 529 && shape === 'anthropic') return 529;
      return 502;
    }
    case 'event':
      return eventStatus(signal.code) ?? 502;
    case 'unreadable':
    case 'connect_error':
    case 'reset':
    case 'incomplete':
      return 502;
    case 'first_output_timeout':
    case 'total_timeout':
      return 504;
  }
}

/** The retry rule of an upstream status, however it arrived (status line or an error event's code). */
function statusRule(status: number): RetryRule {
  switch (status) {
    case 408:
    case 429:
    case 502:
    case 503:
    case 504:
    case 529:
      return 'yes';
    case 500:
      return 'retry_on_500';
    default:
      return 'no';
  }
}

/** Whether an attempt that ended so is retried. */
export function retryRule(signal: UpstreamSignal): RetryRule {
  switch (signal.kind) {
    case 'http':
      return signal.status >= 300 && signal.status < 400 ? 'no' : statusRule(signal.status);
    case 'event': {
      const status = eventStatus(signal.code);
      // An event without a status-like code says nothing Waybill can act on: not retried.
      return status === undefined ? 'no' : statusRule(status);
    }
    case 'unreadable':
    case 'connect_error':
    case 'reset':
    case 'incomplete':
    case 'first_output_timeout':
      return 'yes';
    case 'total_timeout':
      return 'no';
  }
}

/** The rule applied under the configuration. */
export function isRetried(rule: RetryRule, retryOn500: boolean): boolean {
  return rule === 'yes' || (rule === 'retry_on_500' && retryOn500);
}
