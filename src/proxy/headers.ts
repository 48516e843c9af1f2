/**
 * Which client headers travel upstream. Waybill forwards the client's headers (vLLM ignores what it does not
 * know, and operators use custom headers, e.g. the simulator's `x-sim-fault`) except those that belong to the
 * client's own connection or credentials, or that would change the bytes Waybill must parse.
 */
import type { IncomingHttpHeaders } from 'node:http';

const NOT_FORWARDED = new Set([
  // Hop-by-hop (RFC 9110 §7.6.1) and framing: undici frames the upstream request itself.
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authorization',
  'proxy-authenticate',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'host',
  'content-length',
  'expect',
  // The client's credentials are for the gateway, not the upstream (the Anthropic SDK sends x-api-key, Azure-style
  // clients api-key).
  'authorization',
  'x-api-key',
  'api-key',
  'cookie',
  // Set by Waybill below.
  'content-type',
  'accept',
  'accept-encoding',
  'x-request-id',
]);

/**
 * Headers as undici takes them flat: name, value, name, value, … (a repeated header: its name again). An array
 * rather than an object whose keys are the client's header names: each such object had a shape of its own, so its
 * building and undici's reading of it were megamorphic keyed stores and loads on every request (issue 27).
 */
export type FlatHeaders = string[];

/**
 * Headers for an upstream attempt: the client's, minus the above, plus Waybill's own. With tracing on, the client's
 * trace context is not forwarded: each attempt sends its own span's instead (the client's is that span's ancestor).
 */
export function upstreamHeaders(
  client: IncomingHttpHeaders,
  requestId: string,
  stream: boolean,
  forwardTraceContext: boolean,
  /** The body's type: JSON unless given (a multipart form keeps its boundary); null: no body. */
  contentType: string | null = 'application/json',
): FlatHeaders {
  const headers: FlatHeaders = [];
  for (const [name, value] of Object.entries(client)) {
    if (value === undefined || NOT_FORWARDED.has(name)) continue;
    if (!forwardTraceContext && (name === 'traceparent' || name === 'tracestate')) continue;
    if (typeof value === 'string') headers.push(name, value);
    else for (const each of value) headers.push(name, each);
  }
  if (contentType !== null) headers.push('content-type', contentType);
  // Waybill parses every byte; a compressed stream could be neither parsed nor forwarded event by event.
  headers.push('accept', stream ? 'text/event-stream' : 'application/json', 'accept-encoding', 'identity', 'x-request-id', requestId);
  return headers;
}

/** `headers` with more after them (none of the same names: the client's trace context and credentials are not forwarded). */
export function withHeaders(headers: FlatHeaders, more: Readonly<Record<string, string>>): FlatHeaders {
  const all = headers.slice();
  for (const [name, value] of Object.entries(more)) all.push(name, value);
  return all;
}
