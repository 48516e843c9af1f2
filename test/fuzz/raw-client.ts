/**
 * A raw HTTP/1.1 client over a loopback socket, so a client can misbehave in ways an HTTP library will not: huge
 * headers, a body sent in slow pieces or never finished, leaving mid-response. It records exactly what came back:
 * the status line, the headers, the (de-chunked) body, whether the message was complete, and who ended it.
 */
import { connect, type Socket } from 'node:net';
import { performance } from 'node:perf_hooks';
import { bodyWrites, renderBody, renderHead, type ClientPlan } from './client-grammar.js';

export interface ClientObservation {
  readonly id: string;
  /** performance.now() when the client started connecting. */
  readonly startedAt: number;
  status: number | undefined;
  /** ms from startedAt to the status line. */
  statusAfterMs: number | undefined;
  headers: Record<string, string>;
  body: Buffer;
  /** The response message ended as its framing says (Content-Length reached, chunked terminator, or close). */
  complete: boolean;
  /** ms from startedAt to the end of the exchange (complete, closed, left or timed out). */
  endedAfterMs: number;
  /** Who ended the exchange. */
  endedBy: 'complete' | 'server_closed' | 'client_left' | 'client_deadline' | 'connect_error';
  /** The request head was handed to the kernel (before that, a client that leaves sent no request at all). */
  headSent: boolean;
  /** The whole request (head and body) was written. */
  requestSent: boolean;
  /** Socket error, if any (ECONNRESET, EPIPE...). */
  error: string | undefined;
}

/** Incremental response parser: head, then Content-Length, chunked, or read-until-close body. */
class ResponseParser {
  private buffer: Buffer = Buffer.alloc(0);
  private mode: 'head' | 'length' | 'chunk_size' | 'chunk_data' | 'chunk_crlf' | 'trailer' | 'close' | 'done' = 'head';
  private remaining = 0;
  private readonly bodyParts: Buffer[] = [];
  bodyBytes = 0;
  status: number | undefined;
  headers: Record<string, string> = {};

  get done(): boolean {
    return this.mode === 'done';
  }

  get readsUntilClose(): boolean {
    return this.mode === 'close';
  }

  body(): Buffer {
    return Buffer.concat(this.bodyParts);
  }

  feed(chunk: Buffer): void {
    this.buffer = this.buffer.length === 0 ? chunk : Buffer.concat([this.buffer, chunk]);
    for (;;) {
      if (!this.step()) return;
    }
  }

  private take(bytes: Buffer): void {
    if (bytes.length === 0) return;
    this.bodyParts.push(bytes);
    this.bodyBytes += bytes.length;
  }

  /** One parsing step; false when more bytes are needed (or the message is done). */
  private step(): boolean {
    switch (this.mode) {
      case 'head': {
        const end = this.buffer.indexOf('\r\n\r\n');
        if (end < 0) return false;
        const lines = this.buffer.subarray(0, end).toString('latin1').split('\r\n');
        this.buffer = this.buffer.subarray(end + 4);
        const match = /^HTTP\/1\.[01] (\d{3})/.exec(lines[0] ?? '');
        this.status = match === null ? -1 : Number(match[1]);
        for (const line of lines.slice(1)) {
          const colon = line.indexOf(':');
          if (colon <= 0) continue;
          const name = line.slice(0, colon).trim().toLowerCase();
          const value = line.slice(colon + 1).trim();
          this.headers[name] = name in this.headers ? `${this.headers[name]}, ${value}` : value;
        }
        if (this.status >= 100 && this.status < 200) {
          // An interim response: the real one follows.
          this.headers = {};
          this.status = undefined;
          return true;
        }
        const te = this.headers['transfer-encoding'];
        const length = this.headers['content-length'];
        if (this.status === 204 || this.status === 304) this.mode = 'done';
        else if (te !== undefined && te.toLowerCase().includes('chunked')) this.mode = 'chunk_size';
        else if (length !== undefined) {
          this.remaining = Number(length);
          this.mode = this.remaining === 0 ? 'done' : 'length';
        } else this.mode = 'close';
        return this.mode !== 'done';
      }
      case 'length': {
        if (this.buffer.length === 0) return false;
        const piece = this.buffer.subarray(0, this.remaining);
        this.take(piece);
        this.remaining -= piece.length;
        this.buffer = this.buffer.subarray(piece.length);
        if (this.remaining === 0) this.mode = 'done';
        return this.mode !== 'done';
      }
      case 'chunk_size': {
        const end = this.buffer.indexOf('\r\n');
        if (end < 0) return false;
        const size = parseInt(this.buffer.subarray(0, end).toString('latin1').split(';')[0] ?? '', 16);
        this.buffer = this.buffer.subarray(end + 2);
        if (!Number.isFinite(size) || size < 0) {
          this.mode = 'close';
          return false;
        }
        this.remaining = size;
        this.mode = size === 0 ? 'trailer' : 'chunk_data';
        return true;
      }
      case 'chunk_data': {
        if (this.buffer.length === 0) return false;
        const piece = this.buffer.subarray(0, this.remaining);
        this.take(piece);
        this.remaining -= piece.length;
        this.buffer = this.buffer.subarray(piece.length);
        if (this.remaining === 0) this.mode = 'chunk_crlf';
        return true;
      }
      case 'chunk_crlf': {
        if (this.buffer.length < 2) return false;
        this.buffer = this.buffer.subarray(2);
        this.mode = 'chunk_size';
        return true;
      }
      case 'trailer': {
        const end = this.buffer.indexOf('\r\n');
        if (end < 0) return false;
        this.buffer = this.buffer.subarray(end + 2);
        if (end === 0) this.mode = 'done';
        return this.mode !== 'done';
      }
      case 'close': {
        this.take(this.buffer);
        this.buffer = Buffer.alloc(0);
        return false;
      }
      case 'done':
        return false;
    }
  }
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/**
 * Runs one client plan against `port` on 127.0.0.1. Never rejects. The client gives up `deadlineMs` after it
 * started (the gateway's total deadline plus the margin the invariants allow).
 */
export function runClient(plan: ClientPlan, id: string, port: number, deadlineMs: number): Promise<ClientObservation> {
  return new Promise((resolve) => {
    const startedAt = performance.now();
    const parser = new ResponseParser();
    const body = renderBody(plan);
    const { writes, complete: bodyComplete } = bodyWrites(plan, body);
    const head = renderHead(plan, id, `127.0.0.1:${port}`, body.length);
    const obs: ClientObservation = {
      id,
      startedAt,
      status: undefined,
      statusAfterMs: undefined,
      headers: {},
      body: Buffer.alloc(0),
      complete: false,
      endedAfterMs: 0,
      endedBy: 'server_closed',
      headSent: false,
      requestSent: false,
      error: undefined,
    };
    let finished = false;
    const timers: NodeJS.Timeout[] = [];
    const socket: Socket = connect({ host: '127.0.0.1', port });
    const finish = (how: ClientObservation['endedBy']) => {
      if (finished) return;
      finished = true;
      for (const timer of timers) clearTimeout(timer);
      if (how === 'server_closed' && parser.readsUntilClose) obs.complete = true;
      obs.endedBy = how === 'server_closed' && obs.complete ? 'complete' : how;
      obs.endedAfterMs = performance.now() - startedAt;
      obs.body = parser.body();
      obs.headers = parser.headers;
      obs.status = parser.status;
      socket.destroy();
      resolve(obs);
    };
    const leave = () => {
      if (!obs.complete) finish('client_left');
    };

    timers.push(setTimeout(() => finish('client_deadline'), deadlineMs));
    const read = plan.read;
    if (read.kind === 'leave_after_ms') timers.push(setTimeout(leave, read.ms));

    socket.on('data', (chunk: Buffer) => {
      if (finished) return;
      parser.feed(chunk);
      if (parser.status !== undefined && obs.statusAfterMs === undefined) obs.statusAfterMs = performance.now() - startedAt;
      if (parser.done) {
        obs.complete = true;
        finish('complete');
        return;
      }
      if (read.kind === 'leave_after_bytes' && parser.status !== undefined && parser.bodyBytes >= read.bytes) leave();
    });
    socket.on('error', (err: NodeJS.ErrnoException) => {
      obs.error ??= err.code ?? err.message;
      if (parser.status === undefined && !obs.requestSent && err.code === 'ECONNREFUSED') finish('connect_error');
    });
    socket.on('close', () => finish('server_closed'));
    socket.on('connect', () => {
      void (async () => {
        try {
          await writeAll(socket, head);
          obs.headSent = true;
          const send = plan.send;
          for (let i = 0; i < writes.length; i++) {
            if (finished) return;
            if (send.kind === 'slow' && i > 0) await sleep(send.delayMs);
            if (finished) return;
            await writeAll(socket, writes[i] as Buffer);
          }
          if (bodyComplete) {
            obs.requestSent = true;
            return;
          }
          if (send.kind === 'abort') {
            await sleep(send.afterMs);
            leave();
          }
          // 'stall': nothing more; the deadline timer ends it.
        } catch {
          // The server closed while we were writing: 'close' reports it.
        }
      })();
    });
  });
}

function writeAll(socket: Socket, data: Buffer): Promise<void> {
  return new Promise((resolve, reject) => {
    if (socket.destroyed) {
      reject(new Error('socket destroyed'));
      return;
    }
    socket.write(data, (err) => (err ? reject(err) : resolve()));
  });
}
