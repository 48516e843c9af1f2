/**
 * The client SDK's own retry count. The openai and Anthropic SDKs (Stainless-generated) send `x-stainless-retry-count`
 * on every request: 0 on the first try, n on their n-th retry. Each HTTP request stays one logical request; this only
 * says which of them were a client's retries, so user calls = requests − client retries (docs/metrics.md).
 */
import type { IncomingHttpHeaders } from 'node:http';

export const CLIENT_RETRY_HEADER = 'x-stainless-retry-count';

/** Largest retry count believed; above it (or anything but plain digits, or a repeated header) the header is ignored. */
const MAX_CLIENT_RETRY = 100;

/** The validated retry count of the request: a small non-negative integer, or undefined (absent or not believed). */
export function clientRetryOf(headers: IncomingHttpHeaders): number | undefined {
  const value = headers[CLIENT_RETRY_HEADER];
  if (typeof value !== 'string' || !/^\d{1,3}$/.test(value)) return undefined;
  const count = Number(value);
  return count <= MAX_CLIENT_RETRY ? count : undefined;
}
