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
): Record<string, string | string[]> {
  const headers: Record<string, string | string[]> = {};
  for (const [name, value] of Object.entries(client)) {
    if (value === undefined || NOT_FORWARDED.has(name)) continue;
    if (!forwardTraceContext && (name === 'traceparent' || name === 'tracestate')) continue;
    headers[name] = value;
  }
  if (contentType !== null) headers['content-type'] = contentType;
  headers['accept'] = stream ? 'text/event-stream' : 'application/json';
  // Waybill parses every byte; a compressed stream could be neither parsed nor forwarded event by event.
  headers['accept-encoding'] = 'identity';
  headers['x-request-id'] = requestId;
  return headers;
}
