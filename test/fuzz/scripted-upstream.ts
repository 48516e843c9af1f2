/**
 * Scripted upstreams for the fuzzer (after test/helpers/scripted.ts): each generation request names its case with
 * the `x-fuzz-id` header (Waybill forwards client headers; `x-request-id` is the fallback), and each attempt for
 * that id replays the next transcript of its script, byte for byte, in the generated writes and delays. Several
 * servers share one script book, so a retry to another upstream continues the same script. Loopback only.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import type { RenderedTranscript } from './upstream-grammar.js';

export interface Script {
  /** One rendered transcript per attempt; past the end, the last one repeats. */
  readonly attempts: readonly RenderedTranscript[];
}

export class ScriptBook {
  private readonly scripts = new Map<string, { script: Script; served: number }>();

  set(id: string, script: Script): void {
    this.scripts.set(id, { script, served: 0 });
  }

  delete(id: string): void {
    this.scripts.delete(id);
  }

  /** The transcript for the next attempt of `id`, or undefined for an unknown id. */
  next(id: string): RenderedTranscript | undefined {
    const entry = this.scripts.get(id);
    if (entry === undefined) return undefined;
    const list = entry.script.attempts;
    const transcript = list[Math.min(entry.served, list.length - 1)];
    entry.served++;
    return transcript;
  }

  /** Attempts served for `id` so far. */
  served(id: string): number {
    return this.scripts.get(id)?.served ?? 0;
  }
}

export interface FuzzUpstream {
  readonly url: string;
  /** Generation requests received that named no known script (a harness bug if ever non-zero). */
  readonly unknown: () => number;
  close(): Promise<void>;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms).unref());

/** Resolves when the write is handed to the kernel, or when the connection is gone. */
function write(res: ServerResponse, chunk: Buffer): Promise<void> {
  return new Promise((resolve) => {
    if (res.destroyed || res.writableEnded) {
      resolve();
      return;
    }
    const onClose = () => resolve();
    res.once('close', onClose);
    res.write(chunk, () => {
      res.off('close', onClose);
      resolve();
    });
  });
}

async function play(res: ServerResponse, t: RenderedTranscript): Promise<void> {
  res.writeHead(t.status, t.headers);
  res.flushHeaders();
  for (let i = 0; i < t.chunks.length; i++) {
    const delay = t.delaysMs[i] ?? 0;
    if (delay > 0) await sleep(delay);
    if (res.destroyed) return;
    await write(res, t.chunks[i] as Buffer);
    // Let the kernel send each write on its own, so the gateway's reads tend to follow the generated cuts.
    await new Promise((resolve) => setImmediate(resolve));
  }
  if (res.destroyed) return;
  const socket: Socket | null = res.socket;
  switch (t.end) {
    case 'end':
      res.end();
      return;
    case 'destroy':
      socket?.destroy();
      return;
    case 'reset':
      if (socket !== null && typeof socket.resetAndDestroy === 'function') socket.resetAndDestroy();
      else socket?.destroy();
      return;
    case 'hang':
      // Silent until the gateway lets go (or the server closes).
      return;
  }
}

export async function startFuzzUpstream(book: ScriptBook): Promise<FuzzUpstream> {
  let unknown = 0;
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    if (req.method === 'GET' && req.url === '/health') {
      res.end();
      return;
    }
    // The gateway's revision read: not vLLM's, so no version (the revision stays _unknown), and no script used.
    if (req.method === 'GET' && req.url === '/version') {
      req.resume();
      res.writeHead(404).end();
      return;
    }
    req.resume();
    req.on('end', () => {
      const header = req.headers['x-fuzz-id'] ?? req.headers['x-request-id'];
      const transcript = typeof header === 'string' ? book.next(header) : undefined;
      if (transcript === undefined) {
        unknown++;
        res.writeHead(404, { 'content-type': 'application/json' }).end('{"detail":"no script"}');
        return;
      }
      play(res, transcript).catch(() => res.destroy());
    });
  });
  server.keepAliveTimeout = 3_000;
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    unknown: () => unknown,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
