/**
 * The generations of one gateway (http/generation.ts says what a generation is): each configuration applied — at
 * start, then at each reload — builds one, and a generation stays open while any request or exchange holds it. A
 * reload retires the previous generation: its health checks stop at once, and it closes (its upstreams' pools)
 * when the last request it holds is done. The tenants' limiter is counted by reference across generations: a reload
 * that leaves the limits alone keeps the limiter in use, and its counts; it closes with the last generation using it.
 */
import type { Logger } from 'pino';
import { OWN_READS, READ_STOP_REASONS } from '../accounting/outcomes.js';
import type { Config } from '../config/load.js';
import { forWorker } from '../config/workers.js';
import { createAuthenticator, createOpsAccess } from '../http/auth.js';
import type { Generation } from '../http/generation.js';
import type { BackgroundHolds } from '../proxy/background-holds.js';
import type { Exchange, ExchangeDeps } from '../proxy/exchange.js';
import type { ModelLabels } from '../proxy/model-labels.js';
import type { ReadTurns } from '../proxy/read-turns.js';
import type { ResponseHomes } from '../proxy/response-homes.js';
import type { ResponseOwners } from '../proxy/response-owners.js';
import type { RevisionLabels } from '../proxy/revision-labels.js';
import { UpstreamRegistry } from '../proxy/upstreams.js';
import type { ObserverGuard } from '../telemetry/guard.js';
import { ENGINE_RESTART_CAUSES, SCRAPE_RESULTS } from '../telemetry/labels.js';
import type { GatewayMetrics } from '../telemetry/metrics.js';
import type { PublishSettlement } from '../telemetry/settlement.js';
import type { WorkerRole } from './gateway.js';
import { createLimiter, limiterSettings, type LimiterHandle } from './limiter.js';

/** A generation as the gateway keeps it: with its limiter's handle, and its retirement. */
export interface Built extends Generation {
  readonly limiterHandle: LimiterHandle;
  /** No longer current: its health checks stop, and it closes once no request or exchange holds it. */
  retire(): void;
  close(): Promise<void>;
}

/** What every generation shares: the process's observers and the state that outlives a reload. */
export interface GenerationDeps {
  readonly worker: WorkerRole | undefined;
  readonly logger: Logger;
  readonly metrics: GatewayMetrics;
  readonly guard: ObserverGuard;
  readonly random: () => number;
  readonly now: () => number;
  readonly publish: PublishSettlement;
  readonly homes: ResponseHomes;
  readonly owners: ResponseOwners;
  readonly readTurns: ReadTurns;
  readonly backgroundHolds: BackgroundHolds;
  readonly modelLabels: ModelLabels;
  readonly revisionLabels: RevisionLabels;
  /** Tells the other workers and replicas where a cache_aware pick sent which prefix blocks; undefined: nobody. */
  readonly shareRoute: ((pool: string, upstream: string, blocks: readonly number[]) => void) | undefined;
  /** The lifecycle's account of exchanges (for the drain): each that starts, and each that is done. */
  readonly onExchangeStarted: (exchange: Exchange) => void;
  readonly onExchangeDone: (exchange: Exchange) => void;
}

export interface Generations {
  /** A generation of `next`, carrying over from `previous` what a reload keeps (revisions, discovery, routing). */
  build(next: Config, previous: Built | undefined): Built;
  /** Closes every generation still open: the current one, and those a reload retired while requests held them. */
  closeAll(): Promise<void>;
}

export function createGenerations(deps: GenerationDeps): Generations {
  const { worker, logger, metrics, guard, random, now, shareRoute } = deps;
  /** Generations not yet closed: the current one, and those a reload retired while requests still held them. */
  const open = new Set<Built>();
  /** Limiters in use, with the number of open generations using each (a reload with the same limits keeps one). */
  const limiterRefs = new Map<LimiterHandle, number>();

  function build(next: Config, previous: Built | undefined): Built {
    // A worker enforces its share of the per-process limits (admission, upstream max_inflight); the configuration in
    // force (its hash, what reload compares) stays the whole one, the same in every worker.
    const served = worker === undefined ? next : forWorker(next, worker.index, worker.count);
    const upstreams = new UpstreamRegistry(served, logger.child({ component: 'upstreams' }), random, {
      onEjected: (upstream, reason) => metrics.upstreamEjected(upstream, reason),
      onProbeFailed: (upstream, probe) => metrics.probeFailed(upstream, probe),
      onReadStopped: (upstream, read, reason) => metrics.readStopped(upstream, read, reason),
      onModelsRefused: (pool, count) => metrics.discoveredModelsRefusedBy(pool, count),
      onSignalsScraped: (upstream, result) => metrics.engineScraped(upstream, result.ok ? 'ok' : result.reason),
      onEngineRestart: (upstream, cause) => {
        metrics.engineRestarted(upstream, cause);
        logger.info({ upstream, cause }, 'upstream engine restarted: its prefix index entries are dropped');
      },
      ...(shareRoute !== undefined && { onRouted: shareRoute }),
    }, now, deps.modelLabels, deps.revisionLabels);
    if (previous !== undefined) {
      upstreams.carryRevisions(previous.upstreams);
      upstreams.carryDiscovery(previous.upstreams);
      upstreams.carryRouting(previous.upstreams);
    }
    // At zero from the start, so an alert on any increase sees the first one.
    for (const upstream of upstreams.upstreams) for (const read of OWN_READS) for (const reason of READ_STOP_REASONS) metrics.readStopped(upstream.name, read, reason, 0);
    for (const pool of served.pools) if (pool.models === undefined) metrics.discoveredModelsRefusedBy(pool.name, 0);
    if (served.engineSignals.enabled) {
      for (const upstream of upstreams.upstreams) {
        for (const result of SCRAPE_RESULTS) metrics.engineScraped(upstream.name, result, 0);
        for (const cause of ENGINE_RESTART_CAUSES) metrics.engineRestarted(upstream.name, cause, 0);
      }
    }
    const limiter =
      previous !== undefined && previous.limiterHandle.settings === limiterSettings(next)
        ? previous.limiterHandle
        : createLimiter(next, { guard, metrics, logger, now, shared: worker?.limitStore });
    limiterRefs.set(limiter, (limiterRefs.get(limiter) ?? 0) + 1);
    let holds = 0;
    let retired = false;
    let closed: Promise<void> | undefined;
    const closeIfIdle = () => {
      if (!retired || holds > 0 || closed !== undefined) return;
      closed = closeGeneration(generation);
    };
    const release = () => {
      holds--;
      closeIfIdle();
    };
    const exchangeDeps: ExchangeDeps = {
      config: next,
      upstreams,
      metrics,
      logger,
      now,
      wallNow: () => Date.now(),
      random,
      publish: deps.publish,
      guard,
      onDone: (exchange) => {
        deps.onExchangeDone(exchange);
        release();
      },
      homes: deps.homes,
      owners: deps.owners,
      readTurns: deps.readTurns,
      backgroundHolds: deps.backgroundHolds,
      held: worker?.held,
    };
    const generation: Built = {
      config: next,
      upstreams,
      authenticate: createAuthenticator(next.auth),
      opsAccess: createOpsAccess(next.auth),
      limiter: limiter.limiter,
      limiterHandle: limiter,
      exchangeDeps,
      hold: () => {
        holds++;
      },
      release,
      track: (exchange) => {
        holds++;
        deps.onExchangeStarted(exchange);
      },
      retire: () => {
        retired = true;
        upstreams.stop();
        closeIfIdle();
      },
      close: () => (closed ??= closeGeneration(generation)),
    };
    open.add(generation);
    return generation;
  }

  async function closeGeneration(generation: Built): Promise<void> {
    open.delete(generation);
    const refs = (limiterRefs.get(generation.limiterHandle) ?? 1) - 1;
    if (refs > 0) limiterRefs.set(generation.limiterHandle, refs);
    else limiterRefs.delete(generation.limiterHandle);
    await Promise.all([generation.upstreams.close(), refs > 0 ? undefined : generation.limiterHandle.close()]);
  }

  return {
    build,
    closeAll: async () => {
      await Promise.all([...open].map((generation) => generation.close()));
    },
  };
}
