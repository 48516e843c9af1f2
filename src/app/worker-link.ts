/**
 * A worker's side of the cluster (cluster.ts): its line to its primary for aggregated scrapes, the tenants' limit
 * steps, the requests it holds, and the owners and routes it shares with the other workers.
 */
import cluster from 'node:cluster';
import { AggregatorRegistry, type Registry } from 'prom-client';
import type { LimitChannel } from '../proxy/cluster-limit-store.js';
import type { HeldRequest, HeldRequests } from '../proxy/exchange.js';
import { RouteBatch } from '../routing/route-batch.js';
import { isRoute, MAX_ROUTES_PER_MESSAGE } from '../routing/route-records.js';
import { isOwner, LIMIT_TIMEOUT_MS, METRICS_TIMEOUT_MS, type HeldKey, type ToPrimary, type ToWorker } from './cluster.js';

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
