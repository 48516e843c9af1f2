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
 */
import cluster, { type Worker } from 'node:cluster';
import { readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import type { Logger } from 'pino';
import { AggregatorRegistry, type Registry } from 'prom-client';
import { workerCount } from '../config/workers.js';
import { LimitHost, type LimitCall, type LimitChannel } from '../proxy/cluster-limit-store.js';
import type { HeldRequest, HeldRequests } from '../proxy/exchange.js';
import { RouteBatch } from '../routing/route-batch.js';
import { isRoute, MAX_ROUTES_PER_MESSAGE, type RouteRecord } from '../routing/route-records.js';
import { METRICS } from '../telemetry/metrics.js';

/**
 * A label set of requests a worker holds, as it travels: JSON of [model, tenant, route, stream, code], code '' until
 * the response head went out. Bounded: the labels come from closed sets and configuration, the codes from HTTP.
 */
type HeldKey = string;
/** The `code` of a lost request whose worker died before its response head went out: the client saw no status. */
export const LOST_CODE = '_lost';

/** One metric of a worker's registry, as collected (prom-client's JSON form). */
type MetricJson = Awaited<ReturnType<Registry['getMetricsAsJSON']>>[number];

/** How a forked worker knows its place. */
const INDEX_ENV = 'WAYBILL_WORKER_INDEX';
const COUNT_ENV = 'WAYBILL_WORKERS';

type ToPrimary =
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

type ToWorker =
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
function isOwner(id: unknown, tenant: unknown): boolean {
  return typeof id === 'string' && id.length > 0 && id.length <= 256 && typeof tenant === 'string' && tenant.length > 0 && tenant.length <= 256;
}

/** How long a worker waits for its primary: an aggregated scrape, a limit step. */
const METRICS_TIMEOUT_MS = 10_000;
const LIMIT_TIMEOUT_MS = 1_000;
const RESTART_MAX_MS = 30_000;

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

// ---------------------------------------------------------------------------------------------------------------
// A worker's side.

/**
 * The callback of every message a worker sends: one that cannot be written (the primary died, the channel is closing
 * under it) is dropped. Without a callback Node emits the failure as an 'error' event on `process`, which nothing
 * listens to, so it would kill the worker — and cut the streams it is draining because its primary died.
 */
const ignoreLostMessage = (): void => undefined;

/** A worker's line to its primary: scrapes, limit steps, and what the primary tells it to do. */
export class WorkerLink {
  private nextId = 0;
  private readonly pending = new Map<number, { resolve: (value: ToWorker) => void; reject: (error: Error) => void; timer: NodeJS.Timeout }>();
  private readonly onReload = new Set<() => void>();
  private onOwner: ((id: string, tenant: string) => void) | undefined;
  private onRoutes: ((pool: string, upstream: string, blocks: readonly number[]) => void) | undefined;
  /** This worker's route records not yet sent (flushed once per event-loop turn that had any). */
  private readonly routeBatch = new RouteBatch((routes) => this.send({ type: 'waybill:routes', routes }));
  private drainRequested: (() => void) | undefined;
  /** Resolves when the primary asks for a drain, or is gone. */
  readonly drain: Promise<void>;

  private registry: Registry | undefined;
  /** What changed in the requests held since the last report (flushed once per event-loop turn). */
  private readonly heldChanges = new Map<HeldKey, number>();
  private heldFlush: NodeJS.Immediate | undefined;

  /** Made first thing in a worker, so no word of the primary (a drain right after the fork) is missed. */
  constructor() {
    this.drain = new Promise((resolve) => (this.drainRequested = resolve));
    process.on('message', (message: ToWorker) => this.received(message));
    // The primary died (its IPC channel closed): drain rather than serve on alone, unsupervised. Node's cluster
    // would otherwise exit the worker at once on a disconnect it did not ask for, cutting every stream.
    if (cluster.worker !== undefined) cluster.worker.exitedAfterDisconnect = true;
    process.once('disconnect', () => this.drainRequested?.());
    // Signals reach a worker from a terminal's process group too; only its primary's word counts.
    for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(signal, () => undefined);
  }

  /** Answers the primary's collections of this worker's metrics from `registry`. */
  serveMetrics(registry: Registry): void {
    this.registry = registry;
  }

  /** Every worker's metrics, added up by the primary. */
  async scrape(): Promise<{ contentType: string; body: string }> {
    const answer = await this.ask({ type: 'waybill:metrics', id: this.id() }, METRICS_TIMEOUT_MS);
    if (answer.type !== 'waybill:metrics' || answer.body === undefined) throw new Error(`aggregated metrics unavailable: ${answer.type === 'waybill:metrics' ? (answer.error ?? 'no body') : 'wrong answer'}`);
    return { contentType: AggregatorRegistry.PROMETHEUS_CONTENT_TYPE, body: answer.body };
  }

  /** The tenants' limit steps, counted by the primary. */
  readonly limits: LimitChannel = async (call) => {
    const id = this.id();
    // A reserve answered after the deadline took something the request will never give back: the primary undoes it.
    const onTimeout = call.op === 'reserve' ? () => this.send({ type: 'waybill:limit-cancel', id }) : undefined;
    const answer = await this.ask({ type: 'waybill:limit', id, call }, LIMIT_TIMEOUT_MS, onTimeout);
    if (answer.type !== 'waybill:limit' || answer.error !== undefined) throw new Error(`limit step failed in the primary: ${answer.type === 'waybill:limit' ? answer.error : 'wrong answer'}`);
    return answer.result;
  };

  /**
   * The requests this worker holds, reported to the primary (which counts them as lost if the worker dies): each
   * request changes a count by label set at its start, its response head and its settlement, and the changes go in
   * one message per event-loop turn that had any, not one per request.
   */
  /**
   * Owners of stored responses under client-chosen ids (proxy/response-owners.ts), shared with the other workers so
   * a read that lands on another worker finds its owner: one message per such answer, relayed by the primary.
   */
  readonly owners = {
    share: (id: string, tenant: string): void => {
      this.send({ type: 'waybill:owner', id, tenant });
    },
    onShared: (listener: (id: string, tenant: string) => void): void => {
      this.onOwner = listener;
    },
  };

  /**
   * Where cache_aware picks sent which prefix blocks (docs/routing.md, "With workers"), shared with the other workers
   * so that every worker's prefix index knows what any worker sent: one message per event-loop turn that picked,
   * relayed by the primary. Lost messages (a worker starting, the primary busy) only make an index less complete.
   */
  readonly routes = {
    share: (pool: string, upstream: string, blocks: readonly number[]): void => this.routeBatch.push(pool, upstream, blocks),
    onShared: (listener: (pool: string, upstream: string, blocks: readonly number[]) => void): void => {
      this.onRoutes = listener;
    },
  };

  readonly held: HeldRequests = {
    begin: (labels) => {
      const base = [labels.model, labels.tenant, labels.route, String(labels.stream)];
      let key: HeldKey = JSON.stringify([...base, '']);
      this.heldChange(key, 1);
      const request: HeldRequest = {
        answered: (status) => {
          const next = JSON.stringify([...base, String(status)]);
          this.heldChange(key, -1);
          this.heldChange(next, 1);
          key = next;
        },
        ended: () => this.heldChange(key, -1),
      };
      return request;
    },
  };

  private heldChange(key: HeldKey, delta: number): void {
    const value = (this.heldChanges.get(key) ?? 0) + delta;
    if (value === 0) this.heldChanges.delete(key);
    else this.heldChanges.set(key, value);
    this.heldFlush ??= setImmediate(() => {
      this.heldFlush = undefined;
      if (this.heldChanges.size === 0) return;
      const deltas = [...this.heldChanges];
      this.heldChanges.clear();
      this.send({ type: 'waybill:held', deltas });
    });
  }

  reloads(listener: () => void): void {
    this.onReload.add(listener);
  }

  listening(url: string, adminUrl: string | undefined, models: readonly string[]): void {
    this.send({ type: 'waybill:listening', url, adminUrl, models });
  }

  /** The worker cannot serve (a busy port): the primary reports `problem` once and stops every worker. */
  fatal(problem: string, code: number): Promise<void> {
    const message: ToPrimary = { type: 'waybill:fatal', problem, code };
    // Written before the channel closes behind it (close).
    return new Promise((resolve) => (process.connected && process.send !== undefined ? process.send(message, () => resolve()) : resolve()));
  }

  /** Lets the process end: the IPC channel would otherwise keep it alive. */
  close(): void {
    for (const { reject, timer } of this.pending.values()) {
      clearTimeout(timer);
      reject(new Error('worker closing'));
    }
    this.pending.clear();
    if (process.connected) process.disconnect();
  }

  private collect(id: number): void {
    const registry = this.registry;
    if (registry === undefined) {
      this.send({ type: 'waybill:collected', id, error: 'not serving yet' });
      return;
    }
    registry.getMetricsAsJSON().then(
      (metrics) => this.send({ type: 'waybill:collected', id, metrics }),
      (error: unknown) => this.send({ type: 'waybill:collected', id, error: String(error) }),
    );
  }

  private id(): number {
    return this.nextId++;
  }

  private send(message: ToPrimary): void {
    if (process.connected) process.send?.(message, ignoreLostMessage);
  }

  private ask(message: Extract<ToPrimary, { type: 'waybill:metrics' | 'waybill:limit' }>, timeoutMs: number, onTimeout?: () => void): Promise<ToWorker> {
    return new Promise((resolve, reject) => {
      if (!process.connected) {
        reject(new Error('no primary'));
        return;
      }
      const timer = setTimeout(() => {
        this.pending.delete(message.id);
        onTimeout?.();
        reject(new Error(`the primary did not answer within ${timeoutMs} ms`));
      }, timeoutMs);
      this.pending.set(message.id, { resolve, reject, timer });
      process.send?.(message, ignoreLostMessage);
    });
  }

  private received(message: ToWorker): void {
    if (typeof message !== 'object' || message === null) return;
    if (message.type === 'waybill:drain') this.drainRequested?.();
    else if (message.type === 'waybill:reload') for (const listener of this.onReload) listener();
    else if (message.type === 'waybill:collect') this.collect(message.id);
    else if (message.type === 'waybill:owner') {
      if (isOwner(message.id, message.tenant)) this.onOwner?.(message.id, message.tenant);
    } else if (message.type === 'waybill:routes') {
      if (!Array.isArray(message.routes) || message.routes.length > MAX_ROUTES_PER_MESSAGE) return;
      for (const route of message.routes) if (isRoute(route)) this.onRoutes?.(route[0], route[1], route[2]);
    }
    else if (message.type === 'waybill:metrics' || message.type === 'waybill:limit') {
      const waiting = this.pending.get(message.id);
      if (waiting === undefined) return;
      this.pending.delete(message.id);
      clearTimeout(waiting.timer);
      waiting.resolve(message);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The primary.

export interface PrimaryOptions {
  readonly count: number;
  readonly logger: Logger;
  /** Once every worker listens (the first time): where, for the start-up line. */
  readonly onListening: (url: string, adminUrl: string | undefined, models: readonly string[]) => void;
  /** A worker's start-up failure, reported once (the CLI prints it as one line). */
  readonly onFatal: (problem: string) => void;
  /** Resolves on the first SIGINT/SIGTERM (the CLI's waitForSignal). */
  readonly stopSignal: Promise<NodeJS.Signals>;
}

/** Runs the workers until a signal (then drains them all) or a start-up failure; resolves to the exit code. */
export async function runPrimary(options: PrimaryOptions): Promise<number> {
  const { count, logger } = options;
  const limits = new LimitHost(() => performance.now());
  const listening = new Set<number>();
  let started = false;
  let stopping = false;
  let fatal: { problem: string; code: number } | undefined;
  let crashes = 0;
  let lastCrash = 0;
  const workers = new Map<number, Worker>();
  /** Workers waiting out their restart pause: they hold the primary (with every worker dead, nothing else does). */
  const restarts = new Set<NodeJS.Timeout>();
  let allExited: (() => void) | undefined;
  const exited = new Promise<void>((resolve) => (allExited = resolve));
  const metrics = new MetricsCollector(logger);
  /** The requests each worker holds, by label set, as it reported them. */
  const held = new Map<number, Map<HeldKey, number>>();

  /** A send to a worker that is going away fails (EPIPE): never the primary's problem. */
  const tell = (worker: Worker, message: ToWorker) => {
    if (worker.isConnected()) worker.send(message, (error: Error | null) => error !== null && logger.debug({ err: error }, 'a message to a worker was lost'));
  };

  const stopAll = () => {
    if (stopping) return;
    stopping = true;
    for (const timer of restarts) clearTimeout(timer);
    restarts.clear();
    for (const worker of workers.values()) tell(worker, { type: 'waybill:drain' });
  };

  const fork = (index: number) => {
    const worker = cluster.fork({ [INDEX_ENV]: String(index), [COUNT_ENV]: String(count) });
    workers.set(index, worker);
    // An IPC write to a worker that just died: logged, never an uncaught error that ends the primary (and with it
    // every worker).
    worker.on('error', (error: Error) => logger.warn({ worker: index, err: error }, 'worker channel error'));
    worker.on('message', (message: ToPrimary) => {
      if (typeof message !== 'object' || message === null) return;
      if (message.type === 'waybill:listening') {
        listening.add(index);
        logger.info({ worker: index, pid: worker.process.pid }, 'worker listening');
        // Told to drain before it could hear it (a signal during its start-up): tell it again.
        if (stopping) tell(worker, { type: 'waybill:drain' });
        else if (!started && listening.size === count) {
          started = true;
          options.onListening(message.url, message.adminUrl, message.models);
        }
      } else if (message.type === 'waybill:fatal') {
        if (fatal === undefined) {
          fatal = { problem: message.problem, code: message.code };
          if (!started) options.onFatal(message.problem);
          else logger.error({ worker: index, problem: message.problem }, 'worker cannot serve');
        }
        if (!started) stopAll();
      } else if (message.type === 'waybill:metrics') {
        const serving = [...listening].map((i) => [i, workers.get(i)] as const).filter((entry): entry is readonly [number, Worker] => entry[1] !== undefined);
        metrics.collect(serving, tell).then(
          (body) => tell(worker, { type: 'waybill:metrics', id: message.id, body }),
          (error: unknown) => tell(worker, { type: 'waybill:metrics', id: message.id, error: String(error) }),
        );
      } else if (message.type === 'waybill:collected') {
        metrics.collected(index, message);
      } else if (message.type === 'waybill:limit') {
        let answer: ToWorker;
        try {
          answer = { type: 'waybill:limit', id: message.id, result: limits.answer(message.call, index, message.id) };
        } catch (error) {
          answer = { type: 'waybill:limit', id: message.id, error: String(error) };
        }
        tell(worker, answer);
      } else if (message.type === 'waybill:limit-cancel') {
        limits.cancel(index, message.id);
      } else if (message.type === 'waybill:owner') {
        // Relayed as it came to every other worker that serves; one that starts later does not learn it (its
        // residual: docs/security.md).
        if (!isOwner(message.id, message.tenant)) return;
        for (const i of listening) if (i !== index) {
          const other = workers.get(i);
          if (other !== undefined) tell(other, { type: 'waybill:owner', id: message.id, tenant: message.tenant });
        }
      } else if (message.type === 'waybill:routes') {
        // Relayed as it came to every other worker that serves (each checks the records' shape).
        if (!Array.isArray(message.routes)) return;
        const relayed: ToWorker = { type: 'waybill:routes', routes: message.routes };
        for (const i of listening) if (i !== index) {
          const other = workers.get(i);
          if (other !== undefined) tell(other, relayed);
        }
      } else if (message.type === 'waybill:held') {
        let counts = held.get(index);
        if (counts === undefined) held.set(index, (counts = new Map<HeldKey, number>()));
        for (const [key, delta] of message.deltas) {
          const value = (counts.get(key) ?? 0) + delta;
          if (value === 0) counts.delete(key);
          else counts.set(key, value);
        }
      }
    });
    // A worker's last messages (its fatal problem) arrive before its channel's 'disconnect', not always before 'exit'.
    worker.on('exit', (code, signal) => {
      if (worker.isConnected()) worker.once('disconnect', () => ended(code, signal));
      else ended(code, signal);
    });
    const ended = (code: number | null, signal: string | null) => {
      if (workers.get(index) === worker) workers.delete(index);
      listening.delete(index);
      metrics.retire(index);
      // Its requests in flight ended with it, in a reset the worker never counted: counted here.
      const lost = metrics.lost(held.get(index));
      held.delete(index);
      if (lost > 0) logger.warn({ worker: index, requests: lost }, 'a worker died with requests in flight: counted as lost (waybill_worker_lost_requests_total)');
      const freed = limits.workerGone(index);
      if (freed > 0) logger.warn({ worker: index, slots: freed }, "a worker's tenant-limit slots were given back");
      if (stopping || (fatal !== undefined && !started)) {
        if (workers.size === 0) allExited?.();
        return;
      }
      if (!started) {
        // Died before the gateway ever listened, without saying why: nothing to restart into.
        fatal = { problem: `waybill serve: worker ${index} exited during start-up (${signal ?? `code ${code}`})`, code: 1 };
        options.onFatal(fatal.problem);
        stopAll();
        if (workers.size === 0) allExited?.();
        return;
      }
      // The pause doubles while workers keep dying, and starts over after a minute without a death.
      const at = performance.now();
      crashes = at - lastCrash > 60_000 ? 1 : crashes + 1;
      lastCrash = at;
      const delay = Math.min(RESTART_MAX_MS, 500 * 2 ** Math.min(crashes - 1, 10));
      logger.error({ worker: index, code, signal, restartInMs: delay }, 'worker died; starting another');
      // Not unref'd: with every worker dead at once the cluster closed the listening handle, and this timer is all
      // that keeps the primary alive to start them again.
      const timer = setTimeout(() => {
        restarts.delete(timer);
        if (!stopping) fork(index);
        else if (workers.size === 0) allExited?.();
      }, delay);
      restarts.add(timer);
    };
  };

  const onHangup = () => {
    logger.info({ workers: workers.size }, 'SIGHUP: every worker reloads the configuration');
    for (const worker of workers.values()) tell(worker, { type: 'waybill:reload' });
  };
  process.on('SIGHUP', onHangup);
  for (let index = 0; index < count; index++) fork(index);

  void options.stopSignal.then((signal) => {
    process.off('SIGHUP', onHangup);
    process.on('SIGHUP', () => logger.warn('SIGHUP ignored: the gateway is shutting down'));
    logger.info({ signal, workers: workers.size }, 'shutting down: every worker drains');
    stopAll();
    if (workers.size === 0) allExited?.();
  });
  // A second signal: the CLI's waitForSignal exits at once; the workers go with it.
  process.once('exit', () => {
    for (const worker of workers.values()) worker.process.kill('SIGKILL');
  });

  await exited;
  return fatal !== undefined && !started ? fatal.code : 0;
}

/** How long the primary waits for every worker's metrics before a scrape fails (503). */
const COLLECT_TIMEOUT_MS = 5_000;

/**
 * The primary's half of /metrics: asks each serving worker for its registry, adds them up with prom-client's
 * aggregation, and keeps the counters and histograms of workers that died as last collected, so the sums never go
 * backwards (Prometheus would read a drop as a counter reset). Bounded: one pending collection per scrape, dropped
 * at its deadline; one snapshot per worker index, the dead ones folded into one.
 */
class MetricsCollector {
  private nextId = 0;
  private readonly pending = new Map<number, { readonly want: Set<number>; readonly done: (error: Error | undefined) => void }>();
  /** Each serving worker's last collected metrics. */
  private readonly last = new Map<number, MetricJson[]>();
  /** The counters and histograms of workers that died, as last collected, added up. */
  private retired: MetricJson[] = [];

  constructor(private readonly logger: Logger) {}

  collect(serving: ReadonlyArray<readonly [number, Worker]>, tell: (worker: Worker, message: ToWorker) => void): Promise<string> {
    const id = this.nextId++;
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Error(`workers did not send their metrics within ${COLLECT_TIMEOUT_MS} ms`));
      }, COLLECT_TIMEOUT_MS);
      const done = (error: Error | undefined) => {
        clearTimeout(timer);
        this.pending.delete(id);
        if (error === undefined) resolve();
        else reject(error);
      };
      const entry = { want: new Set(serving.map(([index]) => index)), done };
      this.pending.set(id, entry);
      if (entry.want.size === 0) done(undefined);
      for (const [, worker] of serving) tell(worker, { type: 'waybill:collect', id });
    }).then(() => AggregatorRegistry.aggregate([...this.last.values(), this.retired]).metrics());
  }

  collected(index: number, message: Extract<ToPrimary, { type: 'waybill:collected' }>): void {
    if (message.metrics !== undefined) this.last.set(index, message.metrics);
    const entry = this.pending.get(message.id);
    if (entry === undefined || !entry.want.delete(index)) return;
    if (message.error !== undefined) this.logger.warn({ worker: index, error: message.error }, 'a worker could not send its metrics');
    if (entry.want.size === 0) entry.done(undefined);
  }

  /**
   * A dead worker's requests in flight: each counted once in waybill_requests_total under its own model, tenant,
   * route and stream, `outcome="incomplete"`, `code` the status its client had already received (LOST_CODE if
   * none), and in waybill_worker_lost_requests_total. Returns how many.
   */
  lost(counts: ReadonlyMap<HeldKey, number> | undefined): number {
    const values: Array<{ labels: Record<string, string>; value: number }> = [];
    let total = 0;
    for (const [key, count] of counts ?? []) {
      if (count <= 0) continue;
      const [model = '', tenant = '', route = '', stream = '', code = ''] = JSON.parse(key) as string[];
      values.push({ labels: { model, tenant, route, stream, code: code === '' ? LOST_CODE : code, outcome: 'incomplete' }, value: count });
      total += count;
    }
    if (total === 0) return 0;
    const counter = (name: string, help: string, of: typeof values) => ({ name, help, type: 'counter', values: of, aggregator: 'sum' }) as unknown as MetricJson;
    this.fold([counter(METRICS.requests.name, METRICS.requests.help, values), counter(METRICS.workerLostRequests.name, METRICS.workerLostRequests.help, [{ labels: {}, value: total }])]);
    return total;
  }

  /** A worker died: its counters and histograms stay in the sums; its gauges (its own state) go with it. */
  retire(index: number): void {
    const last = this.last.get(index);
    this.last.delete(index);
    for (const entry of this.pending.values()) if (entry.want.delete(index) && entry.want.size === 0) entry.done(undefined);
    if (last === undefined) return;
    this.fold(last.filter((metric) => String(metric.type) === 'counter' || String(metric.type) === 'histogram'));
  }

  /** Adds `kept` to the retired sums. */
  private fold(kept: MetricJson[]): void {
    // Folded at once (the next scrape must already see them): prom-client's aggregate registers each result as an
    // object carrying its values, readable without its async get().
    this.retired = AggregatorRegistry.aggregate([this.retired, kept])
      .getMetricsAsArray()
      .map((metric) => {
        const { name, help, type, values, aggregator } = metric as unknown as MetricJson;
        return { name, help, type, values, aggregator } as MetricJson;
      });
  }
}
