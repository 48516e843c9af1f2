/**
 * How a declared metric (metric-table.ts) becomes prom-client objects, each one object in both registries GatewayMetrics
 * serves — Prometheus text and OpenMetrics, the one with exemplars — and how a gauge's values from several workers combine.
 */
import { Counter, Gauge, Histogram, Registry, type OpenMetricsContentType } from 'prom-client';
import type { MetricSpec } from './metric-table.js';

export type Labels<S extends MetricSpec> = S['labels'][number];

/** Finds what nested Maps hold under a label set's values, in label order (one Map per label); undefined if absent. */
type NestedLookup = (root: Map<unknown, unknown>, labels: object) => unknown;

/**
 * A metric's NestedLookup, made from its label names. Each metric has a function of its own, so each reads its label
 * objects at sites of its own: one function shared by all metrics (`labels[name]` in a loop) saw every metric's label
 * objects at one site, a megamorphic keyed load per label of every increment — the largest single cost V8's
 * `--log-ic` and callgrind showed in a request's settlement (issue 27). The names are the metric table's label names,
 * identifiers prom-client has already checked, and each is written into the code as a JSON string literal.
 */
function nestedLookup(names: readonly string[]): NestedLookup {
  let body = 'let level = root;';
  names.forEach((name, i) => {
    const read = `labels[${JSON.stringify(name)}]`;
    body += i < names.length - 1 ? ` level = level.get(${read}); if (level === undefined) return undefined;` : ` return level.get(${read});`;
  });
  return generated<NestedLookup>(['root', 'labels'], body, (root, labels) => {
    // As the generated body: no label names, no lookup (undefined, not the root map).
    if (names.length === 0) return undefined;
    let level: unknown = root;
    for (const name of names) {
      if (level === undefined) return undefined;
      level = (level as Map<unknown, unknown>).get((labels as Record<string, unknown>)[name]);
    }
    return level;
  });
}

/**
 * `new Function(params, body)`, or `fallback` (the same function as a closure, read at one shared site) in a process
 * that forbids code from strings (`node --disallow-code-generation-from-strings`, a hardening some deployments use).
 */
function generated<F>(params: readonly string[], body: string, fallback: F): F {
  try {
    // eslint-disable-next-line @typescript-eslint/no-implied-eval -- code made from the metric table's label names (callers)
    return new Function(...params, body) as F;
  } catch (error) {
    if (error instanceof EvalError) return fallback;
    throw error;
  }
}

/**
 * A metric's check that a label set names none but its labels (inherited keys included, as prom-client's check walks
 * them): its keys counted against those of its label names it has. Made like nestedLookup, for the same reason: no
 * lookup of each key in a Set of names per increment.
 */
function onlyLabels(names: readonly string[]): (labels: object) => boolean {
  const known = names.length === 0 ? '0' : names.map((name) => `(${JSON.stringify(name)} in labels ? 1 : 0)`).join(' + ');
  return generated<(labels: object) => boolean>(['labels'], `let keys = 0; for (const _ in labels) keys++; return keys === ${known};`, (labels) => {
    let keys = 0;
    for (const _ in labels) keys++;
    return keys === names.filter((name) => name in labels).length;
  });
}
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
  private readonly onlyLabels: (labels: object) => boolean;
  private readonly lookup: NestedLookup;

  constructor(
    registries: Registries,
    spec: S,
    private readonly exemplars = false,
  ) {
    this.lookup = nestedLookup(spec.labels);
    // One with exemplars must be created in the OpenMetrics registry (prom-client refuses it in a Prometheus one).
    this.counter = new Counter({ name: spec.name, help: spec.help, labelNames: spec.labels, registers: [registries.open], enableExemplars: exemplars });
    registries.text.registerMetric(this.counter);
    this.labelNames = spec.labels;
    this.onlyLabels = onlyLabels(spec.labels);
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
    if (!this.onlyLabels(labels)) return void this.promInc(labels, value);
    const seen = this.lookup(this.seen, labels) as { value: number } | undefined;
    // A value prom-client would refuse (negative, not finite) goes to it, to be refused as before.
    if (seen !== undefined && value >= 0 && Number.isFinite(value)) {
      seen.value += value;
      return;
    }
    const { labelHash } = this.promInc(labels, value) ?? {};
    const sample = labelHash === undefined ? undefined : samples?.[labelHash];
    if (sample !== undefined) this.lastLevel(labels, true)?.set(labels[names[names.length - 1] as Labels<S>], sample);
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

/** A prom-client sample: a histogram's (buckets, sum, count) or a gauge's (value), with the label set it was made for. */
interface PromSample {
  readonly labels: Record<string, unknown>;
}

/**
 * prom-client's samples of one metric found by their label values, in label order, one Map per label: what SharedCounter
 * does for counters, for a histogram or a gauge. prom-client builds the label set's key string on every observation
 * (and a closure, for a histogram); here a label set seen before is a few Map lookups. Only a plain label set takes this
 * way — exactly the metric's label names, each a string — and only once prom-client has its sample: anything else
 * goes through prom-client, to be counted or refused as before. The samples are prom-client's own objects, so its
 * expositions read them as before; forgotten when prom-client replaces its map of them (`reset`), removes one, or
 * puts a new object in one's place (a gauge's `set`, a histogram's `zero`).
 */
class SampleIndex<T extends PromSample> {
  private readonly root = new Map<string, unknown>();
  /** The prom-client map `root` holds samples of. */
  private seenIn: unknown;
  private readonly names: readonly string[];
  private readonly lookup: NestedLookup;

  constructor(private readonly metric: { labelNames: readonly string[]; remove: (...args: never[]) => void }) {
    this.names = metric.labelNames;
    this.lookup = nestedLookup(this.names);
    // prom-client's methods that remove a sample or put a new object in its place (a gauge's `set`, which
    // setToCurrentTime, startTimer and labels().set call; a histogram's `zero`): the index forgets what it found.
    const target = metric as unknown as Record<string, unknown>;
    for (const name of ['remove', 'set', 'zero']) {
      const method = target[name];
      if (typeof method !== 'function') continue;
      target[name] = (...args: unknown[]): unknown => {
        this.root.clear();
        return (method as (...a: unknown[]) => unknown).apply(metric, args);
      };
    }
  }

  /** prom-client's sample of `labels`, when the set is plain and prom-client has made it; else undefined. */
  find(labels: Readonly<Record<string, string | undefined>>): T | undefined {
    const samples = (this.metric as unknown as { hashMap?: Record<string, T> }).hashMap;
    if (samples !== this.seenIn) {
      this.root.clear();
      this.seenIn = samples;
    }
    // Only a plain set: as many keys as label names (a set found below has each of them), none holding undefined.
    let keys = 0;
    for (const _ in labels) keys++;
    if (keys !== this.names.length || keys === 0) return undefined;
    return (this.lookup(this.root, labels) as T | undefined) ?? this.learn(labels, samples);
  }

  /** A label set not seen before: prom-client's sample of it, found by its label values once, then kept. */
  private learn(labels: Readonly<Record<string, string | undefined>>, samples: Record<string, T> | undefined): T | undefined {
    const names = this.names;
    if (samples === undefined) return undefined;
    for (const key in labels) if (!names.includes(key) || typeof labels[key] !== 'string') return undefined;
    let found: T | undefined;
    for (const sample of Object.values(samples)) {
      if (names.every((name) => sample.labels[name] === labels[name])) {
        found = sample;
        break;
      }
    }
    if (found === undefined) return undefined;
    let level = this.root;
    for (let i = 0; i < names.length - 1; i++) {
      const key = labels[names[i] as string] as string;
      let next = level.get(key) as Map<string, unknown> | undefined;
      if (next === undefined) level.set(key, (next = new Map()));
      level = next;
    }
    level.set(labels[names[names.length - 1] as string] as string, found);
    return found;
  }
}

interface HistogramSample extends PromSample {
  readonly bucketValues: Record<string, number>;
  sum: number;
  count: number;
}

/**
 * A histogram in both expositions (one prom-client object, `histogram()` below) whose observations of a label set seen
 * before add to prom-client's sample directly (SampleIndex): the first bucket whose bound holds the value, the sum
 * and the count, as prom-client's observe does. One with a trace's exemplar goes through prom-client.
 */
export class SharedHistogram<S extends MetricSpec> {
  readonly metric: Histogram<Labels<S>>;
  private readonly samples: SampleIndex<HistogramSample>;
  private readonly bounds: readonly number[];
  /** Each bound as prom-client keys its bucket. */
  private readonly keys: readonly string[];
  private readonly exemplars: boolean;

  constructor(registries: Registries, spec: S, buckets: readonly number[], enableExemplars = false) {
    this.metric = histogram(registries, spec, buckets, enableExemplars);
    this.samples = new SampleIndex(this.metric as unknown as ConstructorParameters<typeof SampleIndex>[0]);
    this.bounds = (this.metric as unknown as { upperBounds: readonly number[] }).upperBounds;
    this.keys = this.bounds.map(String);
    this.exemplars = enableExemplars;
  }

  observe(labels: LabelSet<S>, value: number, exemplarLabels?: Record<string, string>): void {
    const sample = Number.isFinite(value) && (exemplarLabels === undefined || !this.exemplars) ? this.samples.find(labels) : undefined;
    if (sample === undefined) {
      if (this.exemplars) this.metric.observe({ labels, value, exemplarLabels: (exemplarLabels ?? NO_EXEMPLAR) });
      else this.metric.observe(labels, value);
      return;
    }
    const bounds = this.bounds;
    let i = 0;
    while (i < bounds.length && value > (bounds[i] as number)) i++;
    sample.sum += value;
    sample.count += 1;
    if (i < bounds.length) sample.bucketValues[this.keys[i] as string] = (sample.bucketValues[this.keys[i] as string] as number) + 1;
  }
}

interface GaugeSample extends PromSample {
  value: number;
}

/** A gauge (prom-client's, registered in both registries) whose increments of a label set seen before skip its key string. */
export class SharedGauge<S extends MetricSpec> {
  readonly metric: Gauge<Labels<S>>;
  private readonly samples: SampleIndex<GaugeSample>;

  constructor(registries: Registries, spec: S) {
    this.metric = new Gauge({ name: spec.name, help: spec.help, labelNames: spec.labels, registers: [registries.text, registries.open] });
    this.samples = new SampleIndex(this.metric as unknown as ConstructorParameters<typeof SampleIndex>[0]);
  }

  inc(labels: LabelSet<S>, value = 1): void {
    const sample = Number.isFinite(value) ? this.samples.find(labels) : undefined;
    if (sample === undefined) this.metric.inc(labels, value);
    else sample.value += value;
  }

  dec(labels: LabelSet<S>, value = 1): void {
    this.inc(labels, -value);
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
const NO_EXEMPLAR = {};
