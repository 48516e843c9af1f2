/**
 * How a declared metric (metric-table.ts) becomes prom-client objects, each one object in both registries GatewayMetrics
 * serves — Prometheus text and OpenMetrics, the one with exemplars — and how a gauge's values from several workers combine.
 */
import { Counter, Gauge, Histogram, Registry, type OpenMetricsContentType } from 'prom-client';
import type { MetricSpec } from './metric-table.js';

export type Labels<S extends MetricSpec> = S['labels'][number];
export type LabelSet<S extends MetricSpec> = Partial<Record<Labels<S>, string>>;

/**
 * A counter in both expositions: one object, registered in both registries, so an increment is counted once.
 * prom-client names a counter differently by exposition (OpenMetrics drops `_total` from the family name and prints
 * it only on samples), and its own OpenMetrics `metrics()` does so by renaming the counter object itself, which would
 * rename it in the Prometheus text too; `OpenMetricsRegistry` below formats a renamed view instead. With exemplars,
 * the Prometheus text simply leaves them out.
 */
export class SharedCounter<S extends MetricSpec> {
  private readonly counter: Counter<Labels<S>>;
  private readonly labelNames: readonly Labels<S>[];
  /**
   * prom-client's sample of each label set seen, found by the set's values in label order, one Map per label: an
   * increment of a set seen before adds to its sample without prom-client's key string (a string per increment, ~20
   * per settlement). The samples are prom-client's own objects, so its expositions read them as before; bounded as
   * they are, by the label sets the process uses. Forgotten when prom-client's map of them is replaced (`reset`,
   * a registry's `resetMetrics`) or a sample is removed (`remove`).
   */
  private readonly seen = new Map<string | undefined, unknown>();
  /** The prom-client map `seen` holds samples of. */
  private seenIn: unknown;
  private readonly labelNameSet: ReadonlySet<string>;

  constructor(
    registries: Registries,
    spec: S,
    private readonly exemplars = false,
  ) {
    // One with exemplars must be created in the OpenMetrics registry (prom-client refuses it in a Prometheus one).
    this.counter = new Counter({ name: spec.name, help: spec.help, labelNames: spec.labels, registers: [registries.open], enableExemplars: exemplars });
    registries.text.registerMetric(this.counter);
    this.labelNames = spec.labels;
    this.labelNameSet = new Set(spec.labels);
    const counter = this.counter as unknown as { remove: (...args: unknown[]) => void };
    const remove = counter.remove.bind(this.counter);
    counter.remove = (...args: unknown[]) => {
      this.seen.clear();
      remove(...args);
    };
  }

  inc(labels: LabelSet<S>, value = 1, exemplarLabels?: Record<string, string>): void {
    // Without a trace, no exemplar: what prom-client's exemplar increment does then is its plain one (it skips its
    // own default empty set, and would record any other `{}` as an exemplar, replacing a real one), so the samples
    // seen serve it too. prom-client types exemplar labels as the metric's own label names; trace_id is not one.
    if (!this.exemplars || exemplarLabels === undefined) this.incSeen(labels, value);
    else this.counter.inc({ labels, value, exemplarLabels: exemplarLabels as LabelSet<S> });
  }

  /** prom-client's plain increment, whichever `inc` an exemplar counter has (it takes an object): the label set's key. */
  private promInc(labels: LabelSet<S>, value: number): { labelHash?: string } | undefined {
    return (this.counter as unknown as { incWithoutExemplar: (labels: LabelSet<S>, value: number) => { labelHash?: string } | undefined }).incWithoutExemplar(labels, value);
  }

  private incSeen(labels: LabelSet<S>, value: number): void {
    const names = this.labelNames;
    if (names.length === 0) return void this.promInc(labels, value);
    const samples = (this.counter as unknown as { hashMap?: Record<string, { value: number }> }).hashMap;
    if (samples !== this.seenIn) {
      this.seen.clear();
      this.seenIn = samples;
    }
    // A label prom-client does not know goes to it, to be refused as before (its check walks inherited keys too).
    for (const key in labels) if (!this.labelNameSet.has(key)) return void this.promInc(labels, value);
    const last = labels[names[names.length - 1] as Labels<S>];
    const seen = this.lastLevel(labels, false)?.get(last) as { value: number } | undefined;
    // A value prom-client would refuse (negative, not finite) goes to it, to be refused as before.
    if (seen !== undefined && value >= 0 && Number.isFinite(value)) {
      seen.value += value;
      return;
    }
    const { labelHash } = this.promInc(labels, value) ?? {};
    const sample = labelHash === undefined ? undefined : samples?.[labelHash];
    if (sample !== undefined) this.lastLevel(labels, true)?.set(last, sample);
  }

  /** The Map holding the samples under `labels`' values but the last; made on the way down when `create`. */
  private lastLevel(labels: LabelSet<S>, create: boolean): Map<string | undefined, unknown> | undefined {
    const names = this.labelNames;
    let map = this.seen;
    for (let i = 0; i < names.length - 1; i++) {
      const key = labels[names[i] as Labels<S>];
      let next = map.get(key) as Map<string | undefined, unknown> | undefined;
      if (next === undefined) {
        if (!create) return undefined;
        map.set(key, (next = new Map()));
      }
      map = next;
    }
    return map;
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

/**
 * An OpenMetrics registry whose exposition leaves its metrics as they are. prom-client's `metrics()` strips `_total`
 * from each counter's own `name` before formatting it, which is harmless only when no other registry holds the same
 * object; here a counter is formatted through a view whose `get()` reports the stripped name. The output is the same
 * as prom-client's (`getMetricsAsString` appends `_total` to each counter sample, and reads the name from `get()`).
 */
export class OpenMetricsRegistry extends Registry<OpenMetricsContentType> {
  override async metrics(): Promise<string> {
    const parts = await Promise.all((this.getMetricsAsArray() as unknown as Formattable[]).map((metric) => this.format(metric)));
    return `${parts.join('\n')}\n# EOF\n`;
  }

  override async getSingleMetricAsString(name: string): Promise<string> {
    const metric = this.getSingleMetric(name) as unknown as Formattable | undefined;
    return metric === undefined ? super.getSingleMetricAsString(name) : this.format(metric);
  }

  /** prom-client's formatting of one metric, a counter through its family view. */
  private format(metric: Formattable): Promise<string> {
    return (this as unknown as Formatting).getMetricsAsString(metric.type === 'counter' ? familyView(metric) : metric);
  }
}

/** What prom-client's registry formats (untyped in its declarations): anything with `get()`. */
interface Formattable {
  readonly name: string;
  readonly type: string;
  get(): Promise<{ name: string }>;
}
interface Formatting {
  getMetricsAsString(metric: Formattable): Promise<string>;
}

/** A counter as OpenMetrics names its family: without `_total`, the object itself untouched. */
function familyView(metric: Formattable): Formattable {
  const family = metric.name.replace(/_total$/, '');
  return { name: family, type: metric.type, get: async () => ({ ...(await metric.get()), name: family }) };
}

export function openMetricsRegistry(): OpenMetricsRegistry {
  const registry = new OpenMetricsRegistry();
  registry.setContentType(Registry.OPENMETRICS_CONTENT_TYPE);
  return registry;
}

/** No exemplar, for histograms: prom-client's histogram skips any empty label set (its counter does not). */
export const NO_EXEMPLAR = {};
