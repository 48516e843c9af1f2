/**
 * How a declared metric (metric-table.ts) becomes prom-client objects in the two registries GatewayMetrics serves —
 * Prometheus text and OpenMetrics, the one with exemplars — and how a gauge's values from several workers combine.
 */
import { Counter, Gauge, Histogram, Registry, type OpenMetricsContentType } from 'prom-client';
import type { MetricSpec } from './metric-table.js';

export type Labels<S extends MetricSpec> = S['labels'][number];
export type LabelSet<S extends MetricSpec> = Partial<Record<Labels<S>, string>>;

/**
 * A counter in both expositions. prom-client names a counter differently by the registry it is created in (an
 * OpenMetrics counter drops `_total` from its family name, and prints it only on samples), so one object cannot
 * serve both formats: each registry gets its own, and every increment goes to both (two hash lookups, per request,
 * not per event).
 */
export class CounterPair<S extends MetricSpec> {
  private readonly text: Counter<Labels<S>>;
  private readonly open: Counter<Labels<S>>;

  constructor(
    registries: Registries,
    spec: S,
    private readonly exemplars = false,
  ) {
    const config = { name: spec.name, help: spec.help, labelNames: spec.labels };
    this.text = new Counter({ ...config, registers: [registries.text] });
    this.open = new Counter({ ...config, registers: [registries.open], enableExemplars: exemplars });
  }

  inc(labels: LabelSet<S>, value = 1, exemplarLabels?: Record<string, string>): void {
    this.text.inc(labels, value);
    if (!this.exemplars) this.open.inc(labels, value);
    // Without a trace, no exemplar label set at all: prom-client's counter skips only its own default empty set,
    // and would record any other `{}` as an exemplar, replacing a real one. prom-client types exemplar labels as
    // the metric's own label names; trace_id is not one of them.
    else if (exemplarLabels === undefined) this.open.inc({ labels, value });
    else this.open.inc({ labels, value, exemplarLabels: exemplarLabels as LabelSet<S> });
  }
}

export interface Registries {
  readonly text: Registry;
  readonly open: Registry<OpenMetricsContentType>;
}

/**
 * A histogram or gauge is one object in both registries (their names do not change between formats). One with
 * exemplars must be created in the OpenMetrics registry (prom-client refuses it in a Prometheus one) and is then
 * added to the Prometheus registry, whose text simply leaves the exemplars out.
 */
export function histogram<S extends MetricSpec>(registries: Registries, spec: S, buckets: readonly number[], enableExemplars = false): Histogram<Labels<S>> {
  const metric = new Histogram({
    name: spec.name,
    help: spec.help,
    labelNames: spec.labels,
    buckets: [...buckets],
    registers: [registries.open],
    enableExemplars,
  });
  registries.text.registerMetric(metric);
  return metric;
}

/**
 * How a gauge's values from several worker processes combine into the one /metrics (app/metrics-collector.ts; counters and
 * histograms add up): `sum` for what each worker holds a part of (requests in flight), `min` for a state every
 * worker must see (an upstream up, the limit store reachable), `first`/`max` for what is the same everywhere.
 */
export type WorkerAggregator = 'sum' | 'min' | 'max' | 'first';

export function scrapeGauge<S extends MetricSpec>(registries: Registries, spec: S, collect: (gauge: Gauge<Labels<S>>) => void, aggregator: WorkerAggregator = 'sum'): Gauge<Labels<S>> {
  return new Gauge({
    name: spec.name,
    help: spec.help,
    labelNames: spec.labels,
    aggregator,
    registers: [registries.text, registries.open],
    collect() {
      collect(this);
    },
  });
}

export function openMetricsRegistry(): Registry<OpenMetricsContentType> {
  const registry = new Registry<OpenMetricsContentType>();
  registry.setContentType(Registry.OPENMETRICS_CONTENT_TYPE);
  return registry;
}

/** No exemplar, for histograms: prom-client's histogram skips any empty label set (its counter does not). */
export const NO_EXEMPLAR = {};
