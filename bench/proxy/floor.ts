/**
 * The floor of a Node.js streaming proxy: what Node's HTTP server and undici cost per event and per request when the
 * proxy does nothing else — no routing, body checks, parsing, ledger, metrics or log line. It reads the client's body,
 * dispatches it upstream with undici's handler API (no stream plumbing) over a keep-alive pool, and writes each
 * upstream chunk to the client as it comes, below `ServerResponse` once the head is out (one framed buffer, one write,
 * as Waybill does). The bench's `node-floor` row: Waybill ÷ floor is what Waybill's own work costs; floor ÷ nginx is
 * what the platform costs, which no change inside Waybill can remove.
 *
 *   node dist/bench/proxy/floor.js --port 8080 --upstream http://127.0.0.1:8000
 */
import { realpathSync } from 'node:fs';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { pathToFileURL } from 'node:url';
import { Pool, type Dispatcher } from 'undici';
import { chunkFrame } from '../../src/proxy/client-writer.js';

function arg(name: string): string {
  const at = process.argv.indexOf(name);
  const value = at < 0 ? undefined : process.argv[at + 1];
  if (value === undefined) throw new Error(`usage: floor.js --port N --upstream URL (missing ${name})`);
  return value;
}

/** Hop-by-hop and framing headers: the server frames its own response. */
const DROPPED = new Set(['connection', 'keep-alive', 'transfer-encoding', 'content-length']);

class Relay implements Dispatcher.DispatchHandler {
  private headOut = false;
  private readonly socket: Socket | null;

  constructor(private readonly res: ServerResponse) {
    this.socket = res.socket;
  }

  onRequestStart(): void {}

  onResponseStart(controller: Dispatcher.DispatchController, status: number, headers: Record<string, string | string[] | undefined>): void {
    const out: Record<string, string | string[]> = {};
    for (const [name, value] of Object.entries(headers)) if (value !== undefined && !DROPPED.has(name)) out[name] = value;
    this.res.writeHead(status, out);
    this.res.on('drain', () => controller.resume());
  }

  onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
    const socket = this.socket;
    let written: boolean;
    if (this.headOut && socket !== null && (socket as { _httpMessage?: unknown })._httpMessage === this.res && socket.writable) {
      written = socket.write(chunkFrame(chunk));
      if (!written) socket.once('drain', () => controller.resume());
    } else {
      written = this.res.write(chunk);
      this.headOut = socket !== null && (socket as { _httpMessage?: unknown })._httpMessage === this.res && (this.res as { chunkedEncoding?: boolean }).chunkedEncoding === true;
    }
    if (!written) controller.pause();
  }

  onResponseEnd(): void {
    this.res.end();
  }

  onResponseError(_controller: Dispatcher.DispatchController, error: Error): void {
    if (!this.res.headersSent) this.res.writeHead(502);
    this.res.destroy(error);
  }
}

/** The relay's request handler, to `upstream` over one keep-alive pool (bench/proxy/floor-inside.ts serves it too). */
export function relayHandler(upstream: string): (req: IncomingMessage, res: ServerResponse) => void {
  const pool = new Pool(upstream, { connections: null, pipelining: 1, keepAliveTimeout: 60_000 });
  return (req, res) => {
    const body: Buffer[] = [];
    req.on('data', (piece: Buffer) => body.push(piece));
    req.on('end', () => {
      const headers: Record<string, string> = {};
      const type = req.headers['content-type'];
      if (type !== undefined) headers['content-type'] = type;
      pool.dispatch(
        { method: req.method as Dispatcher.HttpMethod, path: req.url ?? '/', headers, body: body.length === 0 ? null : Buffer.concat(body) },
        new Relay(res),
      );
    });
  };
}

// Run as a script (not imported): the path node was given may be a symlink of this file's.
if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) {
  const port = Number(arg('--port'));
  createServer({ keepAliveTimeout: 60_000 }, relayHandler(arg('--upstream'))).listen(port, '127.0.0.1', () => console.log(`node-floor on http://127.0.0.1:${port}`));
  // An exit of its own on SIGTERM, so what it runs under (a profiler, callgrind: bench/instructions.ts) writes its output.
  process.once('SIGTERM', () => process.exit(0));
}
