/**
 * A generation: everything built from one configuration that a request uses — the configuration itself, the upstream
 * registry, the client keys, the tenant limiter, the Exchange's dependencies. The gateway holds the current one; the
 * front door gives each request the generation in force when it arrived, and the request (and its Exchange) keeps it
 * to its end, so a reload never changes what a request in flight sees.
 */
import type { Config } from '../config/load.js';
import type { Exchange, ExchangeDeps } from '../proxy/exchange.js';
import type { TenantLimiter } from '../proxy/tenant-limits.js';
import type { UpstreamRegistry } from '../proxy/upstreams.js';
import type { Authenticate, CheckOpsAccess } from './auth.js';

export interface Generation {
  readonly config: Config;
  readonly upstreams: UpstreamRegistry;
  readonly authenticate: Authenticate;
  /** Who may read /metrics and the status page where the API port serves them. */
  readonly opsAccess: CheckOpsAccess;
  readonly limiter: TenantLimiter;
  /** The Exchange's dependencies: the same config and upstreams, and onDone releasing the exchange's hold. */
  readonly exchangeDeps: ExchangeDeps;
  /** A request of this generation arrived: it holds the generation until `release`. */
  hold(): void;
  release(): void;
  /** An Exchange of this generation started: it holds the generation until it is done (exchangeDeps.onDone). */
  track(exchange: Exchange): void;
}

declare module 'fastify' {
  interface FastifyRequest {
    /** The generation in force when the request arrived (set by the front door before anything else). */
    generation: Generation;
  }
}
