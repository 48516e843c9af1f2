/**
 * One HTTP request from a test to a server it started (the simulator's own tests), read as it comes so that a cut,
 * a reset or a hang is never hidden. `sendFresh` uses a connection of its own (agent: false), so keep-alive never
 * hides a reset; `sendKeptAlive` asks for keep-alive on an agent of its own, to see whether the server closed the
 * connection after the answer (vLLM closes it after some refusals, keeps it after others).
 */
import { once } from 'node:events';
import { Agent, request as httpRequest, type IncomingHttpHeaders } from 'node:http';
import type { Socket } from 'node:net';

export interface Reply {
  status: number;
  headers: IncomingHttpHeaders;
  raw: Buffer;
  text: string;
  /** The body ended with its terminator (chunked, or the content-length). */
  complete: boolean;
  /** A transport error: a reset, a truncated body, no response; `left` when the client left (`leaveAfterMs`). */
  error: (Error & { code?: string }) | null;
  /** The connection was closed at the answer; with `watchClose`, or within 150 ms of it. */
  closed: boolean;
  /** Milliseconds from the request to its end. */
  ms: number;
  /** Milliseconds from the request to the first body byte (-1: none). */
  firstByteMs: number;
  /** The first body chunk as received. */
  firstChunk: string;
}

export interface Send {
  /** GET without a body, POST with one, unless given. */
  method?: string;
  headers?: Record<string, string>;
  /** Sent as application/json: a string as it is, anything else as JSON. */
  body?: unknown;
  /** A body with its own content type, e.g. a multipart form (instead of `body`). */
  form?: { body: Buffer; contentType: string };
  /** The same, from a string. */
  raw?: { body: string; contentType: string };
  /** Called with the body so far; true makes the client leave there (no error). */
  onChunk?: (received: string) => boolean;
  /** The client leaves (destroys the request) after this many ms. */
  leaveAfterMs?: number;
  /** Wait up to 150 ms after the answer to see whether the server closes the connection. */
  watchClose?: boolean;
}

/** One request on a fresh connection (agent: false). */
export function sendFresh(url: string, path: string, options: Send = {}): Promise<Reply> {
  return send(url, path, options, false);
}

/** One request on its own keep-alive connection, then (`watchClose`) a look at whether the server closed it. */
export function sendKeptAlive(url: string, path: string, options: Send = {}): Promise<Reply> {
  return send(url, path, options, new Agent({ keepAlive: true, maxSockets: 1 }));
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function send(url: string, path: string, options: Send, agent: Agent | false): Promise<Reply> {
  const json = options.body === undefined ? undefined : typeof options.body === 'string' ? options.body : JSON.stringify(options.body);
  const body = json ?? options.form?.body ?? (options.raw === undefined ? undefined : Buffer.from(options.raw.body));
  const contentType = json !== undefined ? 'application/json' : (options.form?.contentType ?? options.raw?.contentType);
  const started = performance.now();
  return new Promise((resolve) => {
    let status = 0;
    let headers: IncomingHttpHeaders = {};
    const chunks: Buffer[] = [];
    let firstByteMs = -1;
    let firstChunk = '';
    let socket: Socket | undefined;
    let settled = false;
    const finish = async (complete: boolean, error: Reply['error']): Promise<void> => {
      if (settled) return;
      settled = true;
      const ms = performance.now() - started;
      let closed = error !== null;
      if (error === null && socket !== undefined) {
        const target = socket;
        closed = target.destroyed;
        if (!closed && options.watchClose === true) {
          closed = await Promise.race([once(target, 'close').then(() => true), delay(150).then(() => false)]);
        }
      }
      if (agent !== false) agent.destroy();
      const raw = Buffer.concat(chunks);
      resolve({ status, headers, raw, text: raw.toString('utf8'), complete, error, closed, ms, firstByteMs, firstChunk });
    };
    const req = httpRequest(
      `${url}${path}`,
      {
        agent,
        method: options.method ?? (body === undefined ? 'GET' : 'POST'),
        headers: { ...(contentType === undefined ? {} : { 'content-type': contentType }), ...options.headers },
      },
      (res) => {
        status = res.statusCode ?? 0;
        headers = res.headers;
        res.on('data', (chunk: Buffer) => {
          if (firstByteMs < 0) {
            firstByteMs = performance.now() - started;
            firstChunk = chunk.toString('utf8');
          }
          chunks.push(chunk);
          if (options.onChunk?.(Buffer.concat(chunks).toString('utf8')) === true) {
            req.destroy();
            void finish(false, null);
          }
        });
        res.on('end', () => void finish(res.complete, null));
        res.on('error', (error) => void finish(false, error));
        res.on('close', () => void finish(res.complete, res.complete ? null : new Error('aborted')));
      },
    );
    req.on('socket', (s) => {
      socket = s;
    });
    req.on('error', (error) => void finish(false, error));
    if (options.leaveAfterMs !== undefined) {
      setTimeout(() => {
        req.destroy();
        void finish(false, new Error('left'));
      }, options.leaveAfterMs);
    }
    req.end(body);
  });
}
