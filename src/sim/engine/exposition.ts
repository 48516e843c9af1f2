/**
 * The Prometheus text exposition as prometheus_client writes it (`generate_latest`), for the engine's /metrics
 * (metrics.ts): vLLM's bucket layouts, Python's float spelling, metric families and their rendering across engines,
 * and the fixed-bucket histogram the recorder fills. Pure: no clock, no I/O.
 */

// ---------------------------------------------------------------------------------------------------------------
// Buckets (vllm/v1/metrics/loggers.py)
// ---------------------------------------------------------------------------------------------------------------

/** vLLM's build_buckets: mantissas × 10^k, ascending, while ≤ max. */
export function buildBuckets(mantissas: readonly number[], max: number): number[] {
  const buckets: number[] = [];
  for (let scale = 1; ; scale *= 10) {
    for (const m of mantissas) {
      const value = m * scale;
      if (value > max) return buckets;
      buckets.push(value);
    }
  }
}

/** vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, … ≤ max (request_prompt_tokens and the other token counts). */
export function build125Buckets(max: number): number[] {
  return buildBuckets([1, 2, 5], max);
}

export const TTFT_BUCKETS: readonly number[] = [
  0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
  640.0, 2560.0,
];

/** inter_token_latency_seconds, request_time_per_output_token_seconds and the old time_per_output_token_seconds. */
export const ITL_BUCKETS: readonly number[] = [
  0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];

/** e2e, queue, inference, prefill and decode time (vLLM's request_latency_buckets). */
export const REQUEST_LATENCY_BUCKETS: readonly number[] = [
  0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
  1920.0, 7680.0,
];

/** kv_cache_residency_buckets, for the three --kv-cache-metrics histograms. */
export const KV_RESIDENCY_BUCKETS: readonly number[] = [
  0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800,
];

// ---------------------------------------------------------------------------------------------------------------
// Python's number spelling, as prometheus_client writes it
// ---------------------------------------------------------------------------------------------------------------

/**
 * Python's repr(float(x)): the same shortest round-trip digits as JavaScript, but exponent notation below 1e-4 and
 * from 1e16, a two-digit exponent (`1e-05`), and `.0` on whole numbers. JavaScript switches at other points
 * (1e-7, 1e21), so String(x) alone would misspell small sums and bucket bounds.
 */
export function pythonFloatRepr(x: number): string {
  if (Number.isNaN(x)) return 'nan';
  if (x === Infinity) return 'inf';
  if (x === -Infinity) return '-inf';
  if (x === 0) return Object.is(x, -0) ? '-0.0' : '0.0';
  const sign = x < 0 ? '-' : '';
  const [mantissa = '', exponentText = '0'] = Math.abs(x).toExponential().split('e');
  const digits = mantissa.replace('.', '');
  const exponent = Number(exponentText);
  if (exponent < -4 || exponent >= 16) {
    const rest = digits.slice(1);
    const magnitude = String(Math.abs(exponent)).padStart(2, '0');
    return `${sign}${digits[0] ?? ''}${rest ? `.${rest}` : ''}e${exponent < 0 ? '-' : '+'}${magnitude}`;
  }
  if (exponent < 0) return `${sign}0.${'0'.repeat(-exponent - 1)}${digits}`;
  const whole = digits.slice(0, exponent + 1).padEnd(exponent + 1, '0');
  const fraction = digits.slice(exponent + 1);
  return `${sign}${whole}.${fraction || '0'}`;
}

/**
 * prometheus_client's floatToGoString, used for every sample value and `le` bound: Python's repr, except `+Inf`
 * and `-Inf`, and positive numbers with more than six integer digits in Go's exponent form — including its quirk
 * of always writing `e+0` before the exponent (1.7e9 → `1.7e+09`, 1.2e10 → `1.2e+010`).
 */
export function formatValue(x: number): string {
  if (x === Infinity) return '+Inf';
  if (x === -Infinity) return '-Inf';
  if (Number.isNaN(x)) return 'NaN';
  const s = pythonFloatRepr(x);
  const dot = s.indexOf('.');
  if (x > 0 && dot > 6) {
    const mantissa = `${s[0] ?? ''}.${s.slice(1, dot)}${s.slice(dot + 1)}`.replace(/[0.]+$/, '');
    return `${mantissa}e+0${dot - 1}`;
  }
  return s;
}

export function escapeHelp(text: string): string {
  return text.replace(/\\/g, '\\\\').replace(/\n/g, '\\n');
}

export function escapeLabelValue(value: string): string {
  return value.replace(/\\/g, '\\\\').replace(/\n/g, '\\n').replace(/"/g, '\\"');
}

// ---------------------------------------------------------------------------------------------------------------
// Families: the exposition's data model
// ---------------------------------------------------------------------------------------------------------------

export type Labels = Readonly<Record<string, string>>;

export interface Sample {
  readonly name: string;
  readonly labels: Labels;
  readonly value: number;
}

/** One metric family: what prometheus_client's collect() yields for one registered metric. */
export interface MetricFamily {
  /** The registered name (a counter's without `_total`, as prometheus_client stores it). */
  readonly name: string;
  readonly type: 'counter' | 'gauge' | 'histogram';
  readonly help: string;
  readonly samples: readonly Sample[];
  /** The `<name>_created` samples, rendered as a gauge family after the family's own samples. */
  readonly created: readonly Sample[];
}

/** prometheus_client's sample_line: labels sorted by name, values in Go's float spelling. */
export function sampleLine(sample: Sample): string {
  const names = Object.keys(sample.labels).sort();
  const labels = names.map((name) => `${name}="${escapeLabelValue(sample.labels[name] ?? '')}"`).join(',');
  return `${sample.name}${labels ? `{${labels}}` : ''} ${formatValue(sample.value)}\n`;
}

/** The exposition name of a family: prometheus_client appends `_total` to counters in the text format. */
export function exposedName(family: MetricFamily): string {
  return family.type === 'counter' ? `${family.name}_total` : family.name;
}

/**
 * Several engines' samples in prometheus_client's child order. vLLM creates a labelled family's children label value
 * first, engine second (`for reason in FinishReason: {idx: ... for idx in engine_indexes}`), so counters and gauges
 * interleave the engines sample by sample; a histogram child is a whole run of samples, so histograms concatenate.
 */
export function mergeSamples(type: MetricFamily['type'], perEngine: ReadonlyArray<readonly Sample[]>): Sample[] {
  if (type === 'histogram') return perEngine.flat();
  const merged: Sample[] = [];
  const longest = Math.max(0, ...perEngine.map((samples) => samples.length));
  for (let i = 0; i < longest; i++) {
    for (const samples of perEngine) {
      const sample = samples[i];
      if (sample !== undefined) merged.push(sample);
    }
  }
  return merged;
}

/**
 * Several engines' families as one exposition: families with the same name merge (one HELP/TYPE, every engine's
 * samples under it), as vLLM's single PrometheusStatLogger holds one metric with a child per engine. Family order is
 * first appearance.
 */
export function renderFamilies(perEngine: ReadonlyArray<readonly MetricFamily[]>): string {
  const merged = new Map<string, { family: MetricFamily; samples: Array<readonly Sample[]>; created: Array<readonly Sample[]> }>();
  for (const families of perEngine) {
    for (const family of families) {
      const entry = merged.get(family.name);
      if (entry === undefined) {
        merged.set(family.name, { family, samples: [family.samples], created: [family.created] });
      } else {
        entry.samples.push(family.samples);
        entry.created.push(family.created);
      }
    }
  }
  let out = '';
  for (const { family, samples, created } of merged.values()) {
    const name = exposedName(family);
    const help = escapeHelp(family.help);
    out += `# HELP ${name} ${help}\n# TYPE ${name} ${family.type}\n`;
    for (const sample of mergeSamples(family.type, samples)) out += sampleLine(sample);
    const createdSamples = mergeSamples('gauge', created);
    if (createdSamples.length > 0) {
      out += `# HELP ${family.name}_created ${help}\n# TYPE ${family.name}_created gauge\n`;
      for (const sample of createdSamples) out += sampleLine(sample);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Recording
// ---------------------------------------------------------------------------------------------------------------

export function checkAmount(what: string, n: number): void {
  // prometheus_client raises on a negative counter increment; a NaN would make the exposition unparseable for
  // consumers that reject NaN, so both are the caller's bug and fail loudly rather than serve a broken scrape.
  if (!Number.isFinite(n) || n < 0) throw new RangeError(`${what}: expected a finite amount >= 0, got ${n}`);
}

export function checkObservation(what: string, v: number): void {
  // Infinite observations are a caller's bug too, and +Inf and -Inf together would sum to NaN.
  if (!Number.isFinite(v)) throw new RangeError(`${what}: expected a finite value, got ${v}`);
}

/** A fixed-bucket histogram: per-bucket counts (the last is +Inf) and a sum, cumulated only when rendered. */
export class FixedHistogram {
  readonly bounds: readonly number[];
  private counts: number[];
  private total = 0;

  constructor(bounds: readonly number[]) {
    this.bounds = bounds;
    this.counts = new Array<number>(bounds.length + 1).fill(0);
  }

  /** O(log buckets): the first bound >= v (prometheus_client's `amount <= bound`, so `le` is inclusive). */
  observe(v: number): void {
    let lo = 0;
    let hi = this.bounds.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (v <= (this.bounds[mid] ?? Infinity)) hi = mid;
      else lo = mid + 1;
    }
    this.counts[lo] = (this.counts[lo] ?? 0) + 1;
    this.total += v;
  }

  get count(): number {
    return this.counts.reduce((a, b) => a + b, 0);
  }

  get sum(): number {
    return this.total;
  }

  /** Cumulative counts per bound, +Inf last (what `_bucket{le}` shows). */
  cumulative(): number[] {
    let acc = 0;
    return this.counts.map((c) => (acc += c));
  }

  reset(): void {
    this.counts.fill(0);
    this.total = 0;
  }
}
