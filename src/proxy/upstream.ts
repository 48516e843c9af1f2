/**
 * One upstream: its connection pools (one for requests, one for the gateway's own probes and reads), its
 * credentials, and the bounded reads of a body for the gateway's own use (health, discovery, engine signals,
 * stored-response lookups). The registry (upstreams.ts) decides which upstreams serve what.
 */
import { Pool, type Dispatcher } from 'undici';
import { UNKNOWN_REVISION, type OwnRead, type ReadStopReason } from '../accounting/outcomes.js';
import type { Config, UpstreamConfig } from '../config/load.js';
import { CircuitBreaker } from './breaker.js';
import type { FlatHeaders } from './headers.js';

/**
 * vLLM closes idle keep-alive connections after 5 s without a Keep-Alive hint; a socket reused just as it closes is
 * reset under a non-idempotent POST. Keep ours idle for less.
 */
const KEEP_ALIVE_MS = 4_000;

/** A read of an upstream body for the gateway's own use that was stopped: the request aborted, the socket closed. */
export class ReadStopped extends Error {
  constructor(
    readonly reason: ReadStopReason,
    message: string,
  ) {
    super(message);
  }
}

function isDeadline(error: unknown): boolean {
  const { name, code } = error as { name?: unknown; code?: unknown };
  return name === 'AbortError' || name === 'TimeoutError' || code === 'UND_ERR_BODY_TIMEOUT' || code === 'UND_ERR_ABORTED';
}

export class Upstream {
  readonly name: string;
  readonly url: URL;
  /** The configured URL's path without its trailing slashes: what API paths are appended to. */
  private readonly basePath: string;
  readonly weight: number;
  readonly maxInflight: number;
  readonly dispatcher: Pool;
  /** Passive health: ejects the upstream after consecutive failed requests. */
  readonly breaker: CircuitBreaker;
  private readonly authorization: string | undefined;
  /**
   * Health checks and discovery get their own connection, so they never queue behind long streams, and a connect
   * timeout no longer than the check's own (undici cannot abort a request that is still connecting).
   */
  private readonly probe: Pool;
  /** Last active health check result; undefined until the first one finishes. */
  healthy: boolean | undefined = undefined;
  /** Whether the last model discovery failed, so a failure is logged when it starts, not every interval. */
  discoveryFailing = false;
  /** Whether passive health has held back an ejection of this upstream since its last success (logged once). */
  ejectionHeld = false;
  inflight = 0;
  /**
   * The `revision` label of the requests it answers: the configured one, else what its GET /version last said (its
   * label under discovery.max_revisions_per_pool), `_unknown` before a valid answer.
   */
  revision: string;
  /** The revision is configured (pools[].upstreams[].revision): never read from /version. */
  readonly revisionConfigured: boolean;
  /** Whether the last /version read failed, so a failure is logged when it starts, not every interval. */
  versionFailing = false;
  private readonly maxBodyBytes: number;

  constructor(
    config: UpstreamConfig,
    settings: Config,
    /** A body read for the gateway's own use was stopped (counted by the caller). */
    private readonly onReadStopped: (upstream: string, read: OwnRead, reason: ReadStopReason) => void = () => {},
  ) {
    const connectTimeoutMs = settings.timeouts.connectMs;
    const probeTimeoutMs = settings.health.timeoutMs;
    this.name = config.name;
    this.url = config.url;
    // Once, not per attempt (the URL's pathname getter and a regular expression were ~0.4 µs of every request).
    this.basePath = config.url.pathname.replace(/\/+$/, '');
    this.weight = config.weight;
    this.maxInflight = config.maxInflight ?? Number.POSITIVE_INFINITY;
    this.maxBodyBytes = settings.health.maxBodyBytes;
    this.revision = config.revision ?? UNKNOWN_REVISION;
    this.revisionConfigured = config.revision !== undefined;
    this.authorization = config.apiKey === undefined ? undefined : `Bearer ${config.apiKey}`;
    this.breaker = new CircuitBreaker({
      failureThreshold: settings.health.ejectAfterFailures,
      baseEjectionMs: settings.health.ejectionBaseMs,
      maxEjectionMs: settings.health.ejectionMaxMs,
    });
    this.dispatcher = new Pool(config.url.origin, {
      connect: { timeout: connectTimeoutMs },
      keepAliveTimeout: KEEP_ALIVE_MS,
      keepAliveMaxTimeout: KEEP_ALIVE_MS,
      // Waybill runs its own first-output and idle clocks: vLLM sends a non-stream response's headers only when
      // generation is done, and a stream's first byte only after the queue and prefill.
      headersTimeout: 0,
      bodyTimeout: 0,
      // Pipelining would queue a request behind a long stream on the same socket.
      pipelining: 1,
    });
    this.probe = new Pool(config.url.origin, {
      connections: 1,
      connect: { timeout: probeTimeoutMs },
      keepAliveTimeout: KEEP_ALIVE_MS,
      keepAliveMaxTimeout: KEEP_ALIVE_MS,
    });
  }

  /** Takes traffic: its active health check has not failed and passive health has not ejected it. */
  isUp(now: number): boolean {
    return this.healthy !== false && this.breaker.state(now) !== 'open';
  }

  /** The attempt's headers, with this upstream's API key when it has one. */
  withCredentials(headers: FlatHeaders): FlatHeaders {
    return this.authorization === undefined ? headers : [...headers, 'authorization', this.authorization];
  }

  /** The path on this upstream for an API path, respecting a base path in the configured URL. */
  path(apiPath: string): string {
    return this.basePath + apiPath;
  }

  /**
   * A GET whose answer the gateway reads for itself, failing after `timeoutMs` whatever stage it is in, its body read
   * up to health.max_body_bytes (more throws {@link ReadStopped}, the connection closed). Health checks, discovery and
   * engine-signal scrapes go on the probe's own connection (small answers, never queued behind streams; a scrape is
   * one in flight per upstream and a few ms on vLLM); anything else (a background hold's poll) on the traffic ones.
   */
  async get(apiPath: string, timeoutMs: number, read: OwnRead): Promise<{ status: number; body: string }> {
    const pool = read === 'health' || read === 'discovery' || read === 'signals' ? this.probe : this.dispatcher;
    const response = await this.getOn(pool, apiPath, timeoutMs);
    const body = await this.readOwn(response.body, read, true);
    return { status: response.statusCode, body };
  }

  /**
   * A GET on the traffic connections (not the probe's single one: a burst of lookups must not queue health checks
   * behind it), failing after `timeoutMs`. Answers the status only; the body is read and dropped, up to
   * health.max_body_bytes: a longer one is cut there (counted) and its status still answers.
   */
  async lookup(apiPath: string, timeoutMs: number): Promise<number> {
    const response = await this.getOn(this.dispatcher, apiPath, timeoutMs);
    try {
      await this.readOwn(response.body, 'lookup', false);
    } catch (error) {
      if (!(error instanceof ReadStopped && error.reason === 'too_large')) throw error;
    }
    return response.statusCode;
  }

  /**
   * The one way Waybill reads an upstream body for itself: at most health.max_body_bytes, within the request's
   * deadline (its signal). Past either, the body is destroyed — the request aborted, its socket closed, so the
   * upstream cannot make the gateway hold more — and the stop counted.
   */
  private async readOwn(body: Dispatcher.ResponseData['body'], read: OwnRead, keep: boolean): Promise<string> {
    const chunks: Buffer[] = [];
    let size = 0;
    try {
      for await (const chunk of body as AsyncIterable<Buffer>) {
        size += chunk.length;
        if (size > this.maxBodyBytes) {
          body.destroy();
          this.onReadStopped(this.name, read, 'too_large');
          throw new ReadStopped('too_large', `the upstream's body is over health.max_body_bytes (${this.maxBodyBytes})`);
        }
        if (keep) chunks.push(chunk);
      }
    } catch (error) {
      if (error instanceof ReadStopped) throw error;
      body.destroy();
      if (!isDeadline(error)) throw error;
      this.onReadStopped(this.name, read, 'deadline');
      throw new ReadStopped('deadline', `the upstream's body did not arrive within its deadline (${(error as Error).message})`);
    }
    return Buffer.concat(chunks).toString('utf8');
  }

  private getOn(pool: Pool, apiPath: string, timeoutMs: number): ReturnType<Pool['request']> {
    return pool.request({
      method: 'GET',
      path: this.path(apiPath),
      // vLLM started with --api-key guards /v1/models (and, behind some proxies, /health) like the API.
      ...(this.authorization === undefined ? {} : { headers: { authorization: this.authorization } }),
      signal: AbortSignal.timeout(timeoutMs),
      headersTimeout: timeoutMs,
      bodyTimeout: timeoutMs,
    });
  }

  async close(): Promise<void> {
    await Promise.all([this.dispatcher.destroy(), this.probe.destroy()]);
  }
}
