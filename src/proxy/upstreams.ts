/**
 * Upstream pools: which upstreams serve which model, their connection pools, active health and model discovery.
 */
import { Pool } from 'undici';
import type { Logger } from 'pino';
import type { Config, PoolConfig, UpstreamConfig } from '../config/load.js';

/**
 * vLLM closes idle keep-alive connections after 5 s without a Keep-Alive hint; a socket reused just as it closes is
 * reset under a non-idempotent POST. Keep ours idle for less.
 */
const KEEP_ALIVE_MS = 4_000;

export class Upstream {
  readonly name: string;
  readonly url: URL;
  readonly weight: number;
  readonly dispatcher: Pool;
  /**
   * Health checks and discovery get their own connection, so they never queue behind long streams, and a connect
   * timeout no longer than the check's own (undici cannot abort a request that is still connecting).
   */
  private readonly probe: Pool;
  /** Last active health check result; undefined until the first one finishes. */
  healthy: boolean | undefined = undefined;
  inflight = 0;

  constructor(config: UpstreamConfig, connectTimeoutMs: number, probeTimeoutMs: number) {
    this.name = config.name;
    this.url = config.url;
    this.weight = config.weight;
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

  /** The path on this upstream for an API path, respecting a base path in the configured URL. */
  path(apiPath: string): string {
    const base = this.url.pathname.replace(/\/+$/, '');
    return `${base}${apiPath}`;
  }

  /** A GET for health checks and discovery, failing after `timeoutMs` whatever stage it is in. */
  async get(apiPath: string, timeoutMs: number): Promise<{ status: number; body: string }> {
    const response = await this.probe.request({
      method: 'GET',
      path: this.path(apiPath),
      signal: AbortSignal.timeout(timeoutMs),
      headersTimeout: timeoutMs,
      bodyTimeout: timeoutMs,
    });
    const body = await response.body.text();
    return { status: response.statusCode, body };
  }

  async close(): Promise<void> {
    await Promise.all([this.dispatcher.destroy(), this.probe.destroy()]);
  }
}

export interface ServedPool {
  readonly config: PoolConfig;
  readonly upstreams: readonly Upstream[];
  models: readonly string[];
  /** Round-robin cursor; load-aware picking replaces it when the resilience work lands. */
  next: number;
}

export class UpstreamRegistry {
  readonly pools: readonly ServedPool[];
  private byModel = new Map<string, ServedPool>();
  private timers: NodeJS.Timeout[] = [];
  private closed = false;

  constructor(
    private readonly config: Config,
    private readonly logger: Logger,
  ) {
    this.pools = config.pools.map((pool) => ({
      config: pool,
      upstreams: pool.upstreams.map((u) => new Upstream(u, config.timeouts.connectMs, config.health.timeoutMs)),
      models: pool.models ?? [],
      next: 0,
    }));
    this.indexModels();
  }

  get upstreams(): Upstream[] {
    return this.pools.flatMap((pool) => pool.upstreams);
  }

  /** Served model names, configured and discovered. */
  models(): string[] {
    return [...this.byModel.keys()];
  }

  poolFor(model: string): ServedPool | undefined {
    return this.byModel.get(model);
  }

  /** Picks an upstream for a model; undefined when the model is not served. */
  pick(model: string): Upstream | undefined {
    const pool = this.byModel.get(model);
    if (pool === undefined || pool.upstreams.length === 0) return undefined;
    const healthy = pool.upstreams.filter((u) => u.healthy !== false);
    const candidates = healthy.length > 0 ? healthy : pool.upstreams;
    const upstream = candidates[pool.next++ % candidates.length];
    return upstream;
  }

  /** Ready: every pool has a model to serve and at least one upstream whose health check passed. */
  isReady(): boolean {
    return this.pools.every((pool) => pool.models.length > 0 && pool.upstreams.some((u) => u.healthy === true));
  }

  /** Runs the first health check and discovery, then keeps both going on their intervals. */
  async start(): Promise<void> {
    await Promise.all([this.checkHealth(), this.discover()]);
    this.timers.push(setInterval(() => void this.checkHealth(), this.config.health.intervalMs).unref());
    if (this.pools.some((pool) => pool.config.models === undefined)) {
      this.timers.push(setInterval(() => void this.discover(), this.config.discovery.refreshIntervalMs).unref());
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const timer of this.timers) clearInterval(timer);
    await Promise.all(this.upstreams.map((u) => u.close()));
  }

  private indexModels(): void {
    const byModel = new Map<string, ServedPool>();
    for (const pool of this.pools) {
      for (const model of pool.models) if (!byModel.has(model)) byModel.set(model, pool);
    }
    this.byModel = byModel;
  }

  private async checkHealth(): Promise<void> {
    await Promise.all(
      this.upstreams.map(async (upstream) => {
        let healthy: boolean;
        try {
          healthy = (await upstream.get('/health', this.config.health.timeoutMs)).status === 200;
        } catch {
          healthy = false;
        }
        if (this.closed) return;
        if (upstream.healthy !== healthy) {
          this.logger.info({ upstream: upstream.name, healthy }, healthy ? 'upstream healthy' : 'upstream unhealthy');
        }
        upstream.healthy = healthy;
      }),
    );
  }

  /** For pools without configured models: the union of model ids the upstreams list at GET /v1/models. */
  private async discover(): Promise<void> {
    for (const pool of this.pools) {
      if (pool.config.models !== undefined) continue;
      const found = new Set<string>();
      await Promise.all(
        pool.upstreams.map(async (upstream) => {
          try {
            const { status, body } = await upstream.get('/v1/models', this.config.health.timeoutMs);
            if (status !== 200) return;
            const parsed = JSON.parse(body) as { data?: Array<{ id?: unknown }> };
            for (const entry of parsed.data ?? []) if (typeof entry.id === 'string') found.add(entry.id);
          } catch (err) {
            this.logger.debug({ upstream: upstream.name, err: (err as Error).message }, 'model discovery failed');
          }
        }),
      );
      if (this.closed) return;
      // Keep the last known list when every upstream is unreachable, so a blip does not unserve a model.
      if (found.size === 0) continue;
      const models = [...found].sort();
      if (models.join('\n') !== pool.models.join('\n')) {
        this.logger.info({ pool: pool.config.name, models }, 'models discovered');
        pool.models = models;
      }
    }
    this.indexModels();
  }
}
