/**
 * The live status page's HTTP surface (docs/status-page.md), served where /metrics is (the admin listener when
 * `server.admin_port` is set, else the API's app): the page itself (`/status`), one snapshot (`/status.json`), and
 * a snapshot a second as an event stream (`/status/events`). The numbers come from the status window
 * (telemetry/status.ts), fed by the settlement hook, and the upstream registry's state now.
 *
 * One interval timer serves every stream and runs only while one is open; a stream that cannot take the next
 * snapshot (its client stopped reading) skips it rather than growing a buffer; the streams are bounded by
 * `status.max_clients` and are ended on drain and close, so they never hold a shutdown.
 */
import { createHash } from 'node:crypto';
import type { ServerResponse } from 'node:http';
import type { FastifyInstance, FastifyReply, onRequestHookHandler } from 'fastify';
import type { Config } from '../config/load.js';
import { errorBody } from '../delivery/errors.js';
import type { UpstreamRegistry } from '../proxy/upstreams.js';
import type { ObserverGuard } from '../telemetry/guard.js';
import type { Percentiles, StatusWindow, UpstreamActivity, WindowView } from '../telemetry/status.js';
import { STATUS_PAGE_HTML, STATUS_SCRIPT, STATUS_STYLE } from './status-html.js';

/** How often a snapshot is sent to each stream. */
export const STATUS_INTERVAL_MS = 1000;

/** The reconnection delay the streams ask EventSource for (the `retry` field). */
const RETRY_MS = 2000;

export interface UpstreamRow extends Omit<UpstreamActivity, 'name'> {
  name: string;
  pool: string;
  up: boolean;
  healthy: boolean | null;
  circuit: string;
  ejections: number;
  inflight: number;
  max_inflight: number | null;
}

/** What `/status.json` answers and each event carries (docs/status-page.md lists the fields). */
export interface StatusSnapshot extends Omit<WindowView, 'upstreams'> {
  version: 1;
  generated_at: string;
  /** `draining` from the first moment of a drain (as /readyz). */
  state: 'serving' | 'draining';
  upstreams: UpstreamRow[];
}

export interface StatusPageDeps {
  readonly window: StatusWindow;
  /** The configuration in force and its upstreams (a reload replaces them): read at each use. */
  readonly current: () => { readonly config: Config; readonly upstreams: UpstreamRegistry };
  /** The gateway's monotonic clock (circuit breakers read it). */
  readonly now: () => number;
  /** Wall-clock milliseconds, for `generated_at`. */
  readonly wallNow: () => number;
  /** The drain (or close) has begun. */
  readonly stopping: () => boolean;
  readonly guard: ObserverGuard;
  readonly intervalMs?: number;
}

export interface StatusPage {
  /** Adds the routes to the app that serves the operational endpoints. */
  /** `gate`: who may read it (an onRequest hook), where it is served on the API port. */
  register(app: FastifyInstance, gate?: onRequestHookHandler): void;
  snapshot(): StatusSnapshot;
  /**
   * Ends every open event stream (EventSource reconnects by itself). `final`: the gateway is shutting down, so new
   * streams are refused with 503 from now on.
   */
  closeStreams(final: boolean): void;
  /** Event streams open now. */
  readonly clients: number;
}

const sourceHash = (text: string) => `'sha256-${createHash('sha256').update(text).digest('base64')}'`;

/** Only the page's own style and script, and connections back to where it came from. */
const CONTENT_SECURITY_POLICY = [
  "default-src 'none'",
  `script-src ${sourceHash(STATUS_SCRIPT)}`,
  `style-src ${sourceHash(STATUS_STYLE)}`,
  "connect-src 'self'",
  'img-src data:',
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
].join('; ');

const NO_FIRST_OUTPUT: Percentiles = { count: 0, p50: null, p95: null, p99: null };

export function createStatusPage(deps: StatusPageDeps): StatusPage {
  const { window, current, now, wallNow, stopping, guard } = deps;
  const intervalMs = deps.intervalMs ?? STATUS_INTERVAL_MS;
  const streams = new Set<ServerResponse>();
  let timer: NodeJS.Timeout | undefined;
  let refusing = false;

  function snapshot(): StatusSnapshot {
    const { config, upstreams } = current();
    const states = upstreams.snapshot(now());
    const view = window.view({
      models: upstreams.models(),
      tenants: config.auth.servedTenants,
      promptLenClasses: config.metrics.promptLenClasses,
      upstreams: states.map((u) => u.name),
    });
    const activity = new Map(view.upstreams.map((u) => [u.name, u]));
    return {
      version: 1,
      generated_at: new Date(wallNow()).toISOString(),
      state: stopping() ? 'draining' : 'serving',
      window: view.window,
      funnel: view.funnel,
      series: view.series,
      latency: view.latency,
      models: view.models,
      tenants: view.tenants,
      // The upstreams of the configuration in force; activity of upstreams a reload removed ages out of the window.
      upstreams: states.map((u) => {
        const seen = activity.get(u.name);
        return {
          name: u.name,
          pool: u.pool,
          up: u.up,
          healthy: u.healthy,
          circuit: u.circuit,
          ejections: u.ejections,
          inflight: u.inflight,
          max_inflight: u.maxInflight,
          attempts: seen?.attempts ?? 0,
          failed_attempts: seen?.failed_attempts ?? 0,
          first_output: seen?.first_output ?? NO_FIRST_OUTPUT,
          last_failure: seen?.last_failure ?? null,
        };
      }),
      failures: view.failures,
    };
  }

  function stop(): void {
    if (timer !== undefined) clearInterval(timer);
    timer = undefined;
  }

  function broadcast(): void {
    if (streams.size === 0) {
      stop();
      return;
    }
    // A bug here must not reach the timer (an uncaught throw would end the process): counted, and the next tick tries again.
    const event = guard.run('http', () => `data: ${JSON.stringify(snapshot())}\n\n`, undefined);
    if (event === undefined) return;
    for (const stream of streams) {
      // A client that is not reading misses snapshots instead of making the gateway hold them: the next one
      // supersedes it anyway.
      if (!stream.writableNeedDrain) stream.write(event);
    }
  }

  function enabled(): boolean {
    return current().config.status.enabled;
  }

  function refuse(reply: FastifyReply, code: 'too_many_connections' | 'shutting_down', message: string): void {
    void reply.code(503).header('retry-after', '5').header('cache-control', 'no-store').send(errorBody(code, message));
  }

  function register(app: FastifyInstance, gate?: onRequestHookHandler): void {
    const options = gate === undefined ? {} : { onRequest: gate };
    app.get('/status', options, (_request, reply) => {
      if (!enabled()) {
        reply.callNotFound();
        return;
      }
      void reply
        .header('content-security-policy', CONTENT_SECURITY_POLICY)
        .header('x-content-type-options', 'nosniff')
        .header('referrer-policy', 'no-referrer')
        .header('cache-control', 'no-store')
        .type('text/html; charset=utf-8')
        .send(STATUS_PAGE_HTML);
    });

    app.get('/status.json', options, (_request, reply) => {
      if (!enabled()) {
        reply.callNotFound();
        return;
      }
      void reply.header('cache-control', 'no-store').send(snapshot());
    });

    app.get('/status/events', options, (request, reply) => {
      if (!enabled()) {
        reply.callNotFound();
        return;
      }
      if (refusing) {
        refuse(reply, 'shutting_down', 'the gateway is shutting down; the status stream is closed');
        return;
      }
      const { maxClients } = current().config.status;
      if (streams.size >= maxClients) {
        refuse(reply, 'too_many_connections', `${maxClients} status pages already follow the live stream (status.max_clients); retry later`);
        return;
      }
      const first = `retry: ${RETRY_MS}\n\ndata: ${JSON.stringify(snapshot())}\n\n`;
      void reply.hijack();
      const stream = reply.raw;
      stream.writeHead(200, {
        'content-type': 'text/event-stream; charset=utf-8',
        'cache-control': 'no-store',
        'x-content-type-options': 'nosniff',
        // Proxies that buffer responses (nginx) would hold the snapshots back.
        'x-accel-buffering': 'no',
      });
      stream.write(first);
      streams.add(stream);
      stream.once('close', () => {
        streams.delete(stream);
        if (streams.size === 0) stop();
      });
      request.raw.socket.setNoDelay(true);
      timer ??= setInterval(broadcast, intervalMs).unref();
    });
  }

  return {
    register,
    snapshot,
    closeStreams(final) {
      if (final) refusing = true;
      for (const stream of streams) stream.end();
      streams.clear();
      stop();
    },
    get clients() {
      return streams.size;
    },
  };
}
