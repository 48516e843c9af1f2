/**
 * The simulated vLLM: node:http directly (no framework), one timer per stream, so a two-core machine can
 * hold hundreds of concurrent streams. This file is the HTTP server and the dispatch: connections (vLLM's idle
 * keep-alive), then the control plane, the operational endpoints and the API routes' table (routes/table.ts), whose
 * handlers (routes/*.ts) share the request records of context.ts. Streams are written by the stream engine
 * (stream-engine.ts), whole bodies by nonstream.ts.
 */
import { EventEmitter } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { SimContext, type Exchange } from './context.js';
import { resolveSimOptions, type SimOptions } from './options.js';
import { deriveSeed } from '../util/prng.js';
import { isOperationalPath, type SimStats } from './stats.js';
import type { EngineSnapshot } from './engine/types.js';
import { serveControl, serveOperational, serveUnknown } from './routes/operational.js';
import { findRoute, type ApiRoute } from './routes/table.js';
import { errorBody, errorInfo } from './wire.js';

export type { SimOptions } from './options.js';
export type { FaultKind } from './faults.js';
export type { RequestEnd, RequestRecord, RouteName, SimStats } from './stats.js';

export interface Simulator {
  /** Port 0 picks an ephemeral port. Resolves with the bound port and `http://host:port`. */
  listen(port?: number, host?: string): Promise<{ port: number; url: string }>;
  /** Close the server and destroy open sockets (stalled streams included), so tests end promptly. */
  close(): Promise<void>;
  /** The same object as GET /sim/stats, detached. */
  stats(): SimStats;
  resetStats(): void;
  /**
   * A dead engine: /health 503, generation and pooling requests 500 (object-shaped); /v1/models, /tokenize and
   * /detokenize (which never reach the engine) stay 200.
   */
  setEngineDead(dead: boolean): void;
  /**
   * An engine restart, as a pod replacement is: requests the engine is running are cut (connection reset), the
   * prefix cache is emptied, /metrics counters start again from 0 with a new process_start_time_seconds. Also
   * `POST /sim/restart`. Without the engine model only the counters start again.
   */
  restart(): void;
  /** The engine model's state (null without it): what /metrics' gauges and counters are made from. */
  engineSnapshot(): EngineSnapshot | null;
  /**
   * Emits 'request-start' with the RequestRecord so far when a generation or pooling request is accepted
   * (validated, fault chosen; a stream's 200 headers already sent), and 'request-end' with the final RequestRecord
   * when a generation, pooling (or unknown-route) request ends: completed, fault, client disconnect or rejected.
   */
  readonly events: EventEmitter;
}

/** vLLM (uvicorn) closes idle keep-alive connections after 5 s and sends no Keep-Alive hint. */
const IDLE_KEEP_ALIVE_MS = 5_000;
/** The PRNG stream of other clients' arrivals (--external-load). */
const EXTERNAL_STREAM = 0xe7e41;

/**
 * Create a simulated vLLM. Options are validated once (every problem in one TypeError) and frozen.
 *
 * @example
 * const sim = createSimulator({ ttftMs: 5, itlMs: 1 });
 * const { url } = await sim.listen(0);
 * // POST `${url}/v1/chat/completions` with `x-sim-fault: error_after=3`
 * await sim.close();
 */
export function createSimulator(options: Partial<SimOptions> = {}): Simulator {
  return new SimServer(resolveSimOptions(options));
}

class SimServer implements Simulator {
  readonly events = new EventEmitter();
  private readonly server: Server;
  private readonly ctx: SimContext;
  private readonly sockets = new Set<Socket>();
  private readonly idleTimers = new Map<Socket, NodeJS.Timeout>();
  private restartTimer: NodeJS.Timeout | undefined;

  constructor(private readonly opts: Readonly<SimOptions>) {
    this.ctx = new SimContext(opts, this.events);
    this.server = createServer((req, res) => this.handle(req, res));
    // 0 stops Node from sending `Keep-Alive: timeout=5`, a hint vLLM does not give; idle closing is ours.
    this.server.keepAliveTimeout = 0;
    this.server.on('connection', (socket: Socket) => {
      this.sockets.add(socket);
      socket.on('close', () => {
        this.sockets.delete(socket);
        this.clearIdle(socket);
      });
    });
  }

  listen(port = 0, host = '127.0.0.1'): Promise<{ port: number; url: string }> {
    return new Promise((resolve, reject) => {
      const onError = (error: Error): void => reject(error);
      this.server.once('error', onError);
      this.server.listen(port, host, () => {
        this.server.off('error', onError);
        this.startBackgroundWork();
        const bound = (this.server.address() as AddressInfo).port;
        const urlHost = host.includes(':') ? `[${host}]` : host;
        resolve({ port: bound, url: `http://${urlHost}:${bound}` });
      });
    });
  }

  close(): Promise<void> {
    return new Promise((resolve) => {
      if (!this.server.listening) {
        resolve();
        return;
      }
      this.server.close(() => resolve());
      clearInterval(this.restartTimer);
      this.ctx.engine?.close();
      for (const run of this.ctx.backgroundRuns) run.abort();
      this.ctx.backgroundRuns.clear();
      for (const socket of this.sockets) socket.destroy();
    });
  }

  stats(): SimStats {
    return this.ctx.store.snapshot();
  }

  resetStats(): void {
    this.ctx.store.reset();
  }

  setEngineDead(dead: boolean): void {
    this.ctx.engineDead = dead;
  }

  restart(): void {
    this.ctx.restart();
  }

  engineSnapshot(): EngineSnapshot | null {
    return this.ctx.engine?.snapshot() ?? null;
  }

  /** Once listening: other clients' load and the restart schedule. */
  private startBackgroundWork(): void {
    const { opts } = this;
    const { engine } = this.ctx;
    if (engine !== null && opts.externalLoad > 0) {
      engine.startExternalLoad({ rate: opts.externalLoad, promptTokens: opts.externalPromptTokens, outputTokens: opts.externalOutputTokens, seed: deriveSeed(opts.seed, EXTERNAL_STREAM) });
    }
    if (opts.restartEveryMs >= 1 && this.restartTimer === undefined) {
      this.restartTimer = setInterval(() => this.restart(), opts.restartEveryMs);
      this.restartTimer.unref();
    }
  }

  // ---- connections ----

  private armIdle(socket: Socket): void {
    if (socket.destroyed) return;
    this.clearIdle(socket);
    const timer = setTimeout(() => socket.destroy(), IDLE_KEEP_ALIVE_MS);
    timer.unref();
    this.idleTimers.set(socket, timer);
  }

  private clearIdle(socket: Socket): void {
    const timer = this.idleTimers.get(socket);
    if (timer !== undefined) {
      clearTimeout(timer);
      this.idleTimers.delete(socket);
    }
  }

  // ---- dispatch ----

  private handle(req: IncomingMessage, res: ServerResponse): void {
    const socket = req.socket;
    this.clearIdle(socket);
    res.once('finish', () => this.armIdle(socket));
    const path = (req.url ?? '/').split('?', 1)[0] ?? '/';
    const { ctx } = this;

    if (serveControl(ctx, req, res, path)) return;
    if (isOperationalPath(path)) {
      // A gateway's own reads (health, discovery, scrapes): counted apart, never as requests (src/sim/stats.ts).
      ctx.store.countOperational(path);
      serveOperational(ctx, req, res, path);
      return;
    }
    const api = findRoute(path);
    ctx.store.countRequest(api?.route ?? 'other');
    if (api === null) {
      serveUnknown(ctx, req, res, path);
      return;
    }
    void this.serveExchange(req, res, api, path);
  }

  /** One API request: its record from here to its end, whatever ends it (the answer, the client, a simulator bug). */
  private async serveExchange(req: IncomingMessage, res: ServerResponse, api: ApiRoute, path: string): Promise<void> {
    const { ctx } = this;
    const ex: Exchange = ctx.open(req, api.route, path);
    res.on('close', () => {
      if (ex.detached) return; // a background generation goes on without its client
      ex.control?.abort();
      if (!ex.settled) ctx.settle(ex, 'client_disconnect', res.headersSent ? res.statusCode : 0);
    });
    try {
      await api.serve(ctx, ex, req, res, path);
    } catch (error) {
      // A simulator bug must not look like a hang: answer 500 if we still can, else drop the connection.
      if (!res.headersSent) ctx.reject(ex, res, 500, errorBody(errorInfo(500, String(error))));
      else res.destroy();
      ctx.settle(ex, 'rejected', 500);
    }
  }
}
