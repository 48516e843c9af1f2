/**
 * A histogram labelled by model only, for observations made per streamed event (inter-token latency). prom-client's
 * histogram hashes its label set on every observation, even through a bound child; at tens of thousands of events a
 * second that was 4-5% of the gateway's CPU (docs/performance.md). Here each model's series is a plain object found
 * once per stream, and an observation is a short scan of the bucket bounds and three additions. prom-client's
 * registries serialise it like any other metric through `get()`.
 */

interface Series {
  /** Non-cumulative counts per bucket; the last slot is +Inf. */
  readonly counts: Float64Array;
  sum: number;
  count: number;
}

/** What an observer holds: the series of one model. */
export interface EventObserver {
  observe(seconds: number): void;
}

interface MetricValue {
  value: number;
  labels: Record<string, string | number>;
  metricName: string;
}

export class EventHistogram {
  readonly type = 'histogram';
  readonly aggregator = 'sum';
  private readonly series = new Map<string, Series>();
  private readonly bounds: Float64Array;

  constructor(
    readonly name: string,
    readonly help: string,
    buckets: readonly number[],
  ) {
    this.bounds = Float64Array.from(buckets);
  }

  /** The observer for a model's series (created on first use). */
  for(model: string): EventObserver {
    let series = this.series.get(model);
    if (series === undefined) {
      series = { counts: new Float64Array(this.bounds.length + 1), sum: 0, count: 0 };
      this.series.set(model, series);
    }
    const bounds = this.bounds;
    const target = series;
    return {
      observe(seconds: number): void {
        let i = 0;
        while (i < bounds.length && seconds > (bounds[i] as number)) i++;
        target.counts[i] = (target.counts[i] as number) + 1;
        target.sum += seconds;
        target.count++;
      },
    };
  }

  /** prom-client's metric interface: the samples in exposition order (cumulative buckets, then sum and count). */
  get(): { name: string; help: string; type: string; aggregator: string; values: MetricValue[] } {
    const values: MetricValue[] = [];
    for (const [model, series] of this.series) {
      let cumulative = 0;
      for (let i = 0; i <= this.bounds.length; i++) {
        cumulative += series.counts[i] as number;
        const le = i < this.bounds.length ? (this.bounds[i] as number) : '+Inf';
        values.push({ metricName: `${this.name}_bucket`, labels: { le, model }, value: cumulative });
      }
      values.push({ metricName: `${this.name}_sum`, labels: { model }, value: series.sum });
      values.push({ metricName: `${this.name}_count`, labels: { model }, value: series.count });
    }
    return { name: this.name, help: this.help, type: this.type, aggregator: this.aggregator, values };
  }

  reset(): void {
    this.series.clear();
  }
}
