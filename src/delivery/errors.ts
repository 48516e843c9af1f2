/**
 * Every error Waybill itself answers with, in one table with stable codes. Bodies are OpenAI-shaped:
 * `{"error":{"message","type","param","code"}}`. docs/errors.md lists the same codes (test/errors.test.ts).
 * Errors passed through from an upstream keep the upstream's message, type, param and code; which code answers which
 * failure is the failure table's (failures.ts).
 */
export interface ErrorSpec {
  readonly status: number;
  readonly type: string;
}

export const ERRORS = {
  invalid_json: { status: 400, type: 'invalid_request_error' },
  invalid_request: { status: 400, type: 'invalid_request_error' },
  /** JSON nested deeper than server.max_json_depth. */
  json_too_deep: { status: 400, type: 'invalid_request_error' },
  /** n × prompts over server.max_choices. */
  too_many_choices: { status: 400, type: 'invalid_request_error' },
  /** Node's HTTP parser refused the request (malformed request line or header). */
  bad_request: { status: 400, type: 'invalid_request_error' },
  /** Headers or body not received within server.headers_timeout / server.read_timeout. */
  request_timeout: { status: 408, type: 'invalid_request_error' },
  /** Request headers over server.max_header_bytes. */
  headers_too_large: { status: 431, type: 'invalid_request_error' },
  /** More open client connections than server.max_connections. */
  too_many_connections: { status: 503, type: 'unavailable_error' },
  /** /metrics of several workers: one of them did not send its metrics in time (operational endpoint only). */
  metrics_unavailable: { status: 503, type: 'unavailable_error' },
  unsupported_media_type: { status: 415, type: 'invalid_request_error' },
  body_too_large: { status: 413, type: 'invalid_request_error' },
  model_not_found: { status: 404, type: 'invalid_request_error' },
  /** The model is not served (yet), and a pool that discovers its models has not read any upstream's list. */
  model_unavailable: { status: 503, type: 'unavailable_error' },
  /** No client key, or one that matches no configured key (auth.keys). */
  invalid_api_key: { status: 401, type: 'invalid_request_error' },
  /** The tenant's `tenants.<name>.models` does not list the model. */
  model_not_allowed: { status: 403, type: 'permission_error' },
  /** A client key without admin: true asked for /metrics or the status page on the API port (operational endpoint only). */
  admin_required: { status: 403, type: 'permission_error' },
  not_found: { status: 404, type: 'invalid_request_error' },
  upstream_error: { status: 502, type: 'upstream_error' },
  upstream_unreachable: { status: 502, type: 'upstream_error' },
  upstream_reset: { status: 502, type: 'upstream_error' },
  upstream_incomplete: { status: 502, type: 'upstream_error' },
  /** The upstream answered in a way Waybill cannot read or relay: a redirect, an oversized event, not an event stream, a compressed body. */
  upstream_protocol_error: { status: 502, type: 'upstream_error' },
  upstream_timeout: { status: 504, type: 'timeout_error' },
  no_upstream: { status: 503, type: 'upstream_error' },
  overloaded: { status: 429, type: 'rate_limit_error' },
  /** The tenant is over one of its `tenants.<name>.limits` (or `limits.anonymous`). */
  rate_limited: { status: 429, type: 'rate_limit_error' },
  /** The tenant has limits, their shared store (limits.redis_url) cannot be reached, and limits.redis_fail_open is false. */
  limits_unavailable: { status: 503, type: 'unavailable_error' },
  shutting_down: { status: 503, type: 'unavailable_error' },
  internal_error: { status: 500, type: 'internal_error' },
  /** Written as an SSE error event when a committed stream breaks. */
  stream_truncated: { status: 200, type: 'upstream_error' },
  stream_timeout: { status: 200, type: 'timeout_error' },
} as const satisfies Record<string, ErrorSpec>;

export type ErrorCode = keyof typeof ERRORS;

export interface ErrorBody {
  error: { message: string; type: string; param: string | null; code: string | number | null };
}

export function errorBody(code: ErrorCode, message: string, param: string | null = null): ErrorBody {
  return { error: { message, type: ERRORS[code].type, param, code } };
}

/** Anthropic's error type for a status, as its SDK maps them (api_error for what has no type of its own). */
export function anthropicType(status: number): string {
  switch (status) {
    case 400:
      return 'invalid_request_error';
    case 401:
      return 'authentication_error';
    case 403:
      return 'permission_error';
    case 404:
      return 'not_found_error';
    case 413:
      return 'request_too_large';
    case 429:
      return 'rate_limit_error';
    case 503:
    case 529:
      return 'overloaded_error';
    case 504:
      return 'timeout_error';
    case 408:
    case 415:
    case 422:
    case 431:
      return 'invalid_request_error';
    default:
      return 'api_error';
  }
}

/** An Anthropic-shaped error body: what `/v1/messages` clients (the Anthropic SDKs) read. */
export interface AnthropicErrorBody {
  type: 'error';
  error: { type: string; message: string };
}

/**
 * The body of an error answer on `route`: OpenAI's shape everywhere, Anthropic's on `/v1/messages` (docs/errors.md).
 */
export function errorBodyFor(route: string, status: number, body: ErrorBody): ErrorBody | AnthropicErrorBody {
  if (route !== 'messages' && route !== 'count_tokens') return body;
  return { type: 'error', error: { type: anthropicType(status), message: body.error.message } };
}
