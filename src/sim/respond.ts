/** Sending whole JSON/text bodies, the way uvicorn frames them (content-length, no chunking). */
import type { ServerResponse } from 'node:http';

export function sendBody(
  res: ServerResponse,
  status: number,
  body: string,
  contentType: string | null = 'application/json',
  headers: Readonly<Record<string, string>> = {},
): void {
  const extra: Record<string, string> = { ...headers };
  // vLLM's server-error middleware closes the connection after a 500; pools must expect that.
  if (status === 500) extra.connection = 'close';
  if (contentType !== null) extra['content-type'] = contentType;
  res.writeHead(status, { 'content-length': String(Buffer.byteLength(body)), ...extra });
  res.end(body);
}
