/**
 * `waybill serve` on every core (`server.workers`; docs/operations.md, "Workers"): a primary process forks N workers,
 * each a whole gateway, and Node's cluster module hands each incoming connection to one of them (round robin: the
 * primary accepts, a worker serves the connection for its life). The primary serves no request itself. It keeps what
 * must be one for all workers:
 *
 * - **One /metrics, exact.** A worker asked for /metrics asks the primary, which collects the registry of every worker
 *   that listens and adds them up (prom-client's aggregation): counters and histograms sum, each gauge by its own
 *   rule (telemetry/metrics.ts). Every scrape sees every request once, whichever worker it lands on. A worker that
 *   dies leaves its counters and histograms as last collected (so they never go backwards; what it counted after
 *   the last scrape is lost with it). (Prometheus text only: exemplars do not survive the aggregation.)
 * - **The tenants' limits.** Without Redis, the count lives in the primary (proxy/cluster-limit-store.ts); with
 *   `limits.redis_url`, in Redis as for replicas.
 * - **Signals.** SIGTERM/SIGINT: every worker drains (the same drain as one process), then the primary exits; a
 *   second signal kills them. SIGHUP: every worker re-reads the configuration. Workers ignore signals sent to them
 *   directly (a terminal's Ctrl-C reaches the whole process group): they act on their primary's word only, and drain
 *   by themselves if their primary dies.
 * - **Crashes.** A worker that dies is replaced, after a pause that doubles while they keep dying (up to 30 s, back to
 *   0.5 s after a minute without a death); the slots it held in the tenants' limits are given back (with Redis,
 *   its slots' leases run out: redis-limit-store.ts). The requests it held in flight — each worker reports them
 *   by label set, once per event-loop turn (WorkerLink.held) — are counted by the primary as lost
 *   (waybill_worker_lost_requests_total, and waybill_requests_total with outcome incomplete). One that fails before
 *   the gateway ever listened (a busy port) stops them all with its one-line reason.
 *
 * Per-process limits (pool admission, upstream max_inflight) are split between the workers (config/workers.ts).
 *
 * The files: this one, the messages between the two sides and a process's place; worker-link.ts, a worker's side;
 * primary.ts, the primary; metrics-collector.ts, the primary's half of /metrics.
 */
import cluster from 'node:cluster';
import { readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import type { Registry } from 'prom-client';
import { workerCount } from '../config/workers.js';
import type { LimitCall } from '../proxy/cluster-limit-store.js';
import type { RouteRecord } from '../routing/route-records.js';

/**
 * A label set of requests a worker holds, as it travels: JSON of [model, tenant, route, stream, code], code '' until
 * the response head went out. Bounded: the labels come from closed sets and configuration, the codes from HTTP.
 */
export type HeldKey = string;
/** The `code` of a lost request whose worker died before its response head went out: the client saw no status. */
export const LOST_CODE = '_lost';

/** One metric of a worker's registry, as collected (prom-client's JSON form). */
export type MetricJson = Awaited<ReturnType<Registry['getMetricsAsJSON']>>[number];

/** How a forked worker knows its place. */
export const INDEX_ENV = 'WAYBILL_WORKER_INDEX';
export const COUNT_ENV = 'WAYBILL_WORKERS';

export type ToPrimary =
  | { readonly type: 'waybill:listening'; readonly url: string; readonly adminUrl: string | undefined; readonly models: readonly string[] }
  | { readonly type: 'waybill:fatal'; readonly problem: string; readonly code: number }
  | { readonly type: 'waybill:metrics'; readonly id: number }
  | { readonly type: 'waybill:collected'; readonly id: number; readonly metrics?: MetricJson[]; readonly error?: string }
  | { readonly type: 'waybill:limit'; readonly id: number; readonly call: LimitCall }
  | { readonly type: 'waybill:limit-cancel'; readonly id: number }
  /** Changes to the requests the worker holds, by label set (HeldKey), since its last such message. */
  | { readonly type: 'waybill:held'; readonly deltas: ReadonlyArray<readonly [key: string, delta: number]> }
  /** A stored response's id the client chose, and the tenant whose request created it: for the other workers. */
  | { readonly type: 'waybill:owner'; readonly id: string; readonly tenant: string }
  /** Where this worker's cache_aware picks sent which prefix blocks since its last such message: for the others. */
  | { readonly type: 'waybill:routes'; readonly routes: readonly RouteRecord[] };

export type ToWorker =
  | { readonly type: 'waybill:drain' }
  | { readonly type: 'waybill:reload' }
  | { readonly type: 'waybill:metrics'; readonly id: number; readonly body?: string; readonly error?: string }
  | { readonly type: 'waybill:collect'; readonly id: number }
  | { readonly type: 'waybill:limit'; readonly id: number; readonly result?: unknown; readonly error?: string }
  /** Another worker relayed the answer that created a stored response under a client-chosen id. */
  | { readonly type: 'waybill:owner'; readonly id: string; readonly tenant: string }
  /** Other workers' route records, relayed. */
  | { readonly type: 'waybill:routes'; readonly routes: readonly RouteRecord[] };

/** An owner message's fields are a response id and a tenant name: bounded strings, or the message is ignored. */
export function isOwner(id: unknown, tenant: unknown): boolean {
  return typeof id === 'string' && id.length > 0 && id.length <= 256 && typeof tenant === 'string' && tenant.length > 0 && tenant.length <= 256;
}

/** How long a worker waits for its primary: an aggregated scrape, a limit step. */
export const METRICS_TIMEOUT_MS = 10_000;
export const LIMIT_TIMEOUT_MS = 1_000;
export const RESTART_MAX_MS = 30_000;

/** `server.workers` on this machine: `auto` is its CPU affinity, capped by the cgroup v2 quota. */
export function workersOnThisMachine(setting: 'auto' | number): number {
  let cgroupCpuMax: string | undefined;
  try {
    cgroupCpuMax = readFileSync('/sys/fs/cgroup/cpu.max', 'utf8');
  } catch {
    // No cgroup v2 CPU controller here: the affinity alone.
  }
  return workerCount(setting, { availableParallelism: availableParallelism(), cgroupCpuMax });
}

/** Whether this process was forked by a cluster primary (ours or another supervisor's). */
export function isClusterWorker(): boolean {
  return cluster.isWorker;
}

/** This process's place among the workers, when it is one. */
export function workerIdentity(): { readonly index: number; readonly count: number } | undefined {
  if (!cluster.isWorker) return undefined;
  const index = Number(process.env[INDEX_ENV]);
  const count = Number(process.env[COUNT_ENV]);
  return Number.isInteger(index) && Number.isInteger(count) && count > 0 ? { index, count } : undefined;
}
