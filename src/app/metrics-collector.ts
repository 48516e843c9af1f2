/**
 * The primary's half of /metrics with workers (cluster.ts): every worker's registry, added up.
 */
import type { Worker } from 'node:cluster';
import type { Logger } from 'pino';
import { AggregatorRegistry } from 'prom-client';
import { METRICS } from '../telemetry/metrics.js';
import { LOST_CODE, type HeldKey, type MetricJson, type ToPrimary, type ToWorker } from './cluster.js';

/** How long the primary waits for every worker's metrics before a scrape fails (503). */
const COLLECT_TIMEOUT_MS = 5_000;

/**
 * The primary's half of /metrics: asks each serving worker for its registry, adds them up with prom-client's
 * aggregation, and keeps the counters and histograms of workers that died as last collected, so the sums never go
 * backwards (Prometheus would read a drop as a counter reset). Bounded: one pending collection per scrape, dropped
 * at its deadline; one snapshot per worker index, the dead ones folded into one.
 */
export class MetricsCollector {
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
