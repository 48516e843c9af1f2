/**
 * src/telemetry/metric-kinds.ts: a counter is one object in both registries (an increment counted once, found by its label values), and
 * each exposition still names it as its format requires, whatever order or overlap the scrapes come in.
 */
import { spawnSync } from 'node:child_process';
import fc from 'fast-check';
import { Counter, Gauge, Histogram, Registry, type OpenMetricsContentType } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { SharedCounter, SharedGauge, SharedHistogram, openMetricsRegistry, type Registries } from '../src/telemetry/metric-kinds.js';
import { GatewayMetrics } from '../src/telemetry/metrics.js';

const SPEC = { name: 'demo_requests_total', type: 'counter', labels: ['model'], help: 'Demo.' } as const;

function registries(): Registries {
  return { text: new Registry(), open: openMetricsRegistry() };
}

/** The sample lines of one exposition (no comments), as they are. */
const samples = (text: string) => text.split('\n').filter((line) => line !== '' && !line.startsWith('#'));

describe('SharedCounter and the OpenMetrics registry', () => {
  it('counts an increment once, in both expositions, each with its own family name', async () => {
    const r = registries();
    const counter = new SharedCounter(r, SPEC);
    counter.inc({ model: 'm' });
    counter.inc({ model: 'm' }, 2);
    expect(r.text.getSingleMetric(SPEC.name)).toBe(r.open.getSingleMetric(SPEC.name));
    const text = await r.text.metrics();
    const open = await r.open.metrics();
    expect(text).toContain('# TYPE demo_requests_total counter');
    expect(samples(text)).toEqual(['demo_requests_total{model="m"} 3']);
    expect(open).toContain('# TYPE demo_requests counter');
    expect(samples(open)).toEqual(['demo_requests_total{model="m"} 3']);
    expect(open.endsWith('# EOF\n')).toBe(true);
  });

  it('keeps the Prometheus name while OpenMetrics scrapes run before, during and after it', async () => {
    const r = registries();
    new SharedCounter(r, SPEC).inc({ model: 'm' });
    const [open1, text, open2] = await Promise.all([r.open.metrics(), r.text.metrics(), r.open.metrics()]);
    const after = await r.text.metrics();
    for (const t of [text, after]) expect(samples(t)).toEqual(['demo_requests_total{model="m"} 1']);
    for (const o of [open1, open2]) expect(o).toContain('# TYPE demo_requests counter');
    // The object itself is untouched.
    expect((r.text.getSingleMetric(SPEC.name) as unknown as { name: string }).name).toBe('demo_requests_total');
  });

  it("is needed: prom-client's own OpenMetrics registry renames a shared counter for the Prometheus text too", async () => {
    const text = new Registry();
    const open = new Registry<OpenMetricsContentType>();
    open.setContentType(Registry.OPENMETRICS_CONTENT_TYPE);
    new Counter({ name: SPEC.name, help: SPEC.help, labelNames: ['model'], registers: [text, open] }).inc({ model: 'm' });
    await open.metrics();
    expect(samples(await text.metrics())).toEqual(['demo_requests{model="m"} 1']);
  });

  it('prints exemplars in OpenMetrics only, and none for an increment without a trace', async () => {
    const r = registries();
    const counter = new SharedCounter(r, SPEC, true);
    counter.inc({ model: 'a' }, 1, { trace_id: '0af7651916cd43dd8448eb211c80319c' });
    counter.inc({ model: 'b' });
    const open = samples(await r.open.metrics());
    expect(open).toHaveLength(2);
    expect(open[0]).toMatch(/^demo_requests_total\{model="a"\} 1 # \{trace_id="0af7651916cd43dd8448eb211c80319c"\} 1 \d+(\.\d+)?$/);
    expect(open[1]).toBe('demo_requests_total{model="b"} 1');
    expect(samples(await r.text.metrics())).toEqual(['demo_requests_total{model="a"} 1', 'demo_requests_total{model="b"} 1']);
  });

  it('formats one counter alone as its family too (getSingleMetricAsString)', async () => {
    const r = registries();
    new SharedCounter(r, SPEC).inc({ model: 'm' });
    const one = await r.open.getSingleMetricAsString(SPEC.name);
    expect(one).toContain('# TYPE demo_requests counter');
    expect(samples(one)).toEqual(['demo_requests_total{model="m"} 1']);
  });
});

describe('process metrics in both expositions', () => {
  it("each format's event-loop lag covers the loop's stall, whichever format was scraped just before", async () => {
    const metrics = new GatewayMetrics({ ttft: [1], itl: [1], tpot: [1], duration: [1], queueWait: [1] });
    const lagMax = (text: string) => Number(/^nodejs_eventloop_lag_max_seconds (\S+)$/m.exec(text)?.[1]);
    // The loop stalls 120 ms; the monitor (10 ms resolution) records its timer that late once the loop runs again.
    // Margin: a reading of at least 80 ms, 30 ms under what any machine records; a slower one only reads more.
    const stall = () => {
      const until = performance.now() + 120;
      while (performance.now() < until) {
        // busy: the event loop does not run
      }
    };
    const settle = () => new Promise((resolve) => setTimeout(resolve, 40));
    await settle();
    stall();
    await settle();
    const text = (await metrics.scrape(undefined)).body;
    expect(lagMax(text)).toBeGreaterThanOrEqual(0.08);
    // A stale window or one emptied by the other format's scrape would read 0 here (prom-client resets the histogram
    // it reads at each scrape).
    const open = (await metrics.scrape('application/openmetrics-text')).body;
    expect(lagMax(open)).toBeGreaterThanOrEqual(0.08);
    expect(open).toContain('# TYPE process_cpu_seconds counter');
    expect(text).toContain('# TYPE process_cpu_seconds_total counter');
  });
});

describe("SharedCounter's samples found by their label values", () => {
  const SPEC3 = { name: 'demo_tokens_total', type: 'counter', labels: ['model', 'tenant', 'kind'], help: 'Demo.' } as const;
  // 'a,tenant:b' with model 'a' collides with model 'a', tenant 'b' in prom-client's key string: one sample there.
  const value = fc.constantFrom('a', 'b', 'a,tenant:b', 'b:', '', undefined);
  const step = fc.record({
    labels: fc.record({ model: value, tenant: value, kind: value }),
    // A key order of its own, as callers write them.
    reversed: fc.boolean(),
    by: fc.oneof(fc.constant(1), fc.constant(0), fc.double({ min: 0, max: 1e6, noNaN: true }), fc.constantFrom(-1, Number.NaN, Infinity)),
  });

  it("counts as prom-client's own counter does, in both expositions, for any increments (refusing what it refuses)", async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(step, { maxLength: 40 }), async (steps) => {
        const r = registries();
        const shared = new SharedCounter(r, SPEC3);
        // The oracle: a plain prom-client counter, in a registry of its own.
        const oracleRegistry = new Registry();
        const oracle = new Counter({ name: SPEC3.name, help: SPEC3.help, labelNames: SPEC3.labels, registers: [oracleRegistry] });
        for (const { labels, reversed, by } of steps) {
          // Undefined drawn: the key left out, or present holding undefined (prom-client skips both).
          const set = (reversed ? Object.fromEntries(Object.entries(labels).filter(([, v]) => v !== undefined)) : labels) as Record<string, string>;
          const given = reversed ? Object.fromEntries(Object.entries(set).reverse()) : set;
          let oracleError: unknown;
          let sharedError: unknown;
          try {
            oracle.inc(given, by);
          } catch (error) {
            oracleError = error;
          }
          try {
            shared.inc(given, by);
          } catch (error) {
            sharedError = error;
          }
          expect(String(sharedError)).toBe(String(oracleError));
        }
        const expected = samples(await oracleRegistry.metrics()).sort();
        expect(samples(await r.text.metrics()).sort()).toEqual(expected);
        expect(samples(await r.open.metrics()).sort()).toEqual(expected);
      }),
      { numRuns: 300 },
    );
  });

  it("counts as prom-client's own exemplar counter does, with and without traces, exemplars included", async () => {
    const trace = fc.constantFrom(undefined, '0af7651916cd43dd8448eb211c80319c', '4bf92f3577b34da6a3ce929d0e0e4736');
    await fc.assert(
      fc.asyncProperty(fc.array(fc.record({ step, trace }), { maxLength: 40 }), async (draws) => {
        const r = registries();
        const shared = new SharedCounter(r, SPEC3, true);
        // The oracle: prom-client's exemplar counter in an OpenMetrics registry of its own, called as it documents.
        const oracleRegistry = new Registry<OpenMetricsContentType>();
        oracleRegistry.setContentType(Registry.OPENMETRICS_CONTENT_TYPE);
        const oracle = new Counter({ name: SPEC3.name, help: SPEC3.help, labelNames: SPEC3.labels, registers: [oracleRegistry], enableExemplars: true });
        for (const { step: { labels, by }, trace: traceId } of draws) {
          const given = labels as Record<string, string>;
          let oracleError: unknown;
          let sharedError: unknown;
          try {
            if (traceId === undefined) oracle.inc({ labels: given, value: by });
            else oracle.inc({ labels: given, value: by, exemplarLabels: { trace_id: traceId } as Record<string, string> });
          } catch (error) {
            oracleError = error;
          }
          try {
            shared.inc(given, by, traceId === undefined ? undefined : { trace_id: traceId });
          } catch (error) {
            sharedError = error;
          }
          expect(String(sharedError)).toBe(String(oracleError));
        }
        // Exemplars carry the time of their increment: compared without it.
        const untimed = (text: string) => samples(text).map((line) => line.replace(/ \d+(\.\d+)?$/, (m) => (line.includes(' # {') ? '' : m)));
        expect(untimed(await r.open.metrics()).sort()).toEqual(untimed(await oracleRegistry.metrics()).sort());
      }),
      { numRuns: 300 },
    );
  });

  it('adds to the sample prom-client made for a label set, without a new one per increment', async () => {
    const r = registries();
    const shared = new SharedCounter(r, SPEC3);
    shared.inc({ model: 'm', tenant: 't', kind: 'prompt' }, 5);
    const metric = r.text.getSingleMetric(SPEC3.name) as unknown as { hashMap: Record<string, { value: number }>; incWithoutExemplar: (...args: unknown[]) => unknown };
    const [sample] = Object.values(metric.hashMap);
    // prom-client's own increment (its key string) is not called again for a set seen before; a new set goes to it.
    const promInc = metric.incWithoutExemplar.bind(metric);
    let promCalls = 0;
    metric.incWithoutExemplar = (...args: unknown[]) => (promCalls++, promInc(...args));
    shared.inc({ kind: 'prompt', tenant: 't', model: 'm' }, 2);
    shared.inc({ model: 'm', tenant: 't', kind: 'prompt' });
    expect(promCalls).toBe(0);
    shared.inc({ model: 'm', tenant: 't', kind: 'completion' });
    expect(promCalls).toBe(1);
    expect(Object.values(metric.hashMap)).toHaveLength(2);
    expect(Object.values(metric.hashMap)[0]).toBe(sample);
    expect(sample?.value).toBe(8);
    expect(samples(await r.text.metrics())).toEqual(['demo_tokens_total{model="m",tenant="t",kind="prompt"} 8', 'demo_tokens_total{model="m",tenant="t",kind="completion"} 1']);
  });

  it('takes the same way for an exemplar counter incremented without a trace, and prom-client\'s with one', () => {
    const r = registries();
    const shared = new SharedCounter(r, SPEC3, true);
    const L = { model: 'm', tenant: 't', kind: 'prompt' };
    shared.inc(L);
    const metric = r.open.getSingleMetric(SPEC3.name) as unknown as { incWithoutExemplar: (...args: unknown[]) => unknown };
    const promInc = metric.incWithoutExemplar.bind(metric);
    let promCalls = 0;
    metric.incWithoutExemplar = (...args: unknown[]) => (promCalls++, promInc(...args));
    shared.inc(L);
    expect(promCalls).toBe(0);
    shared.inc(L, 1, { trace_id: '0af7651916cd43dd8448eb211c80319c' });
    expect(promCalls).toBe(1);
  });

  it("forgets its samples when prom-client's are reset or one is removed, and refuses a label prom-client refuses", async () => {
    const r = registries();
    const shared = new SharedCounter(r, SPEC3);
    const L = { model: 'm', tenant: 't', kind: 'prompt' };
    const metric = r.text.getSingleMetric(SPEC3.name) as unknown as Counter<'model' | 'tenant' | 'kind'>;
    shared.inc(L, 1);
    metric.reset();
    shared.inc(L, 5);
    expect(samples(await r.text.metrics())).toEqual(['demo_tokens_total{model="m",tenant="t",kind="prompt"} 5']);
    r.text.resetMetrics();
    shared.inc(L, 2);
    expect(samples(await r.open.metrics())).toEqual(['demo_tokens_total{model="m",tenant="t",kind="prompt"} 2']);
    metric.remove(L);
    shared.inc(L, 3);
    expect(samples(await r.text.metrics())).toEqual(['demo_tokens_total{model="m",tenant="t",kind="prompt"} 3']);
    // Seen before, with a label the counter does not have: refused as prom-client refuses it on a first increment.
    expect(() => shared.inc({ ...L, bogus: 'x' } as typeof L, 1)).toThrow(/bogus/);
    expect(samples(await r.text.metrics())).toEqual(['demo_tokens_total{model="m",tenant="t",kind="prompt"} 3']);
  });
});

describe("SharedHistogram and SharedGauge: prom-client's samples found by their label values", () => {
  const HSPEC = { name: 'demo_seconds', type: 'histogram', labels: ['model', 'route'], help: 'Demo.' } as const;
  const GSPEC = { name: 'demo_inflight', type: 'gauge', labels: ['model', 'route'], help: 'Demo.' } as const;
  const BUCKETS = [0.005, 0.1, 1, 2.5, 10];
  // 'a,route:b' with model 'a' collides with model 'a', route 'b' in prom-client's key string.
  const value = fc.constantFrom('a', 'b', 'a,route:b', '', undefined);
  const labels = fc.record({ model: value, route: value });
  const amount = fc.oneof(fc.constantFrom(...BUCKETS), fc.double({ min: -5, max: 50, noNaN: true }), fc.constantFrom(0, Number.NaN, Infinity, -Infinity));
  const trace = fc.constantFrom(undefined, '0af7651916cd43dd8448eb211c80319c');
  // An observation (or increment), or what forgets samples: prom-client's reset, the removal of one label set, or a
  // new sample object put in place of one (a gauge's `set`, a histogram's `zero`).
  const plain = fc.record({ model: fc.constantFrom('a', 'b'), route: fc.constantFrom('a', 'b') });
  const op = fc.oneof(
    { weight: 8, arbitrary: fc.record({ kind: fc.constant('observe' as const), labels: fc.oneof(labels, plain), amount, trace, reversed: fc.boolean() }) },
    { weight: 1, arbitrary: fc.record({ kind: fc.constant('reset' as const) }) },
    { weight: 1, arbitrary: fc.record({ kind: fc.constant('remove' as const), labels: plain }) },
    { weight: 1, arbitrary: fc.record({ kind: fc.constant('replace' as const), labels: plain }) },
  );
  /** Undefined drawn: the key left out or holding undefined; `reversed`, another key order. */
  const given = (l: Record<string, string | undefined>, reversed: boolean) => (reversed ? Object.fromEntries(Object.entries(l).filter(([, v]) => v !== undefined).reverse()) : l) as Record<string, string>;
  /** prom-client's error, or undefined. */
  const attempt = (f: () => void) => {
    try {
      f();
      return undefined;
    } catch (error) {
      return String(error);
    }
  };
  /** A reset, a removal or a replacement, applied to every metric given; false for an observation, which the caller makes. */
  type Forgetful = { reset(): void; remove(labels: Record<string, string>): void; set?(labels: Record<string, string>, value: number): void; zero?(labels: Record<string, string>): void };
  const forgets = (o: { kind: string; labels?: Record<string, string | undefined> }, metrics: Forgetful[]) => {
    if (o.kind === 'observe') return false;
    for (const metric of metrics) {
      const set = (o.labels ?? {}) as Record<string, string>;
      if (o.kind === 'reset') metric.reset();
      else if (o.kind === 'remove') metric.remove(set);
      else if (metric.zero !== undefined) metric.zero(set);
      else metric.set?.(set, 7);
    }
    return true;
  };
  // Exemplars carry the time of their observation: compared without it.
  const untimed = (text: string) => samples(text).map((line) => line.replace(/ \d+(\.\d+)?$/, (m) => (line.includes(' # {') ? '' : m)));

  it("observes as prom-client's own exemplar histogram does, in both expositions, for any observations, resets, removals and zeroings", async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(op, { maxLength: 40, size: 'max' }), async (ops) => {
        const r = registries();
        const shared = new SharedHistogram(r, HSPEC, BUCKETS, true);
        // The oracle: prom-client's histogram, called as it documents, in an OpenMetrics registry of its own.
        const oracleRegistry = new Registry<OpenMetricsContentType>();
        oracleRegistry.setContentType(Registry.OPENMETRICS_CONTENT_TYPE);
        const oracle = new Histogram({ name: HSPEC.name, help: HSPEC.help, labelNames: HSPEC.labels, buckets: BUCKETS, registers: [oracleRegistry], enableExemplars: true });
        for (const o of ops) {
          if (!forgets(o, [oracle, shared.metric]) && o.kind === 'observe') {
            const set = given(o.labels, o.reversed);
            const exemplarLabels = o.trace === undefined ? {} : { trace_id: o.trace };
            const oracleError = attempt(() => oracle.observe({ labels: set, value: o.amount, exemplarLabels: exemplarLabels as Record<string, string> }));
            const sharedError = attempt(() => shared.observe(set, o.amount, o.trace === undefined ? undefined : { trace_id: o.trace }));
            expect(sharedError).toBe(oracleError);
          }
        }
        const expected = untimed(await oracleRegistry.metrics()).sort();
        expect(untimed(await r.open.metrics()).sort()).toEqual(expected);
        expect(samples(await r.text.metrics()).sort()).toEqual(expected.map((line) => line.replace(/ # \{.*$/, '')).sort());
      }),
      { numRuns: 300 },
    );
  });

  it("counts as prom-client's own gauge does, for any increments, decrements, resets, removals and sets", async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(fc.tuple(op, fc.boolean()), { maxLength: 40, size: 'max' }), async (ops) => {
        const r = registries();
        const shared = new SharedGauge(r, GSPEC);
        const oracleRegistry = new Registry();
        const oracle = new Gauge({ name: GSPEC.name, help: GSPEC.help, labelNames: GSPEC.labels, registers: [oracleRegistry] });
        for (const [o, down] of ops) {
          if (!forgets(o, [oracle, shared.metric]) && o.kind === 'observe') {
            const set = given(o.labels, o.reversed);
            const oracleError = attempt(() => (down ? oracle.dec(set, o.amount) : oracle.inc(set, o.amount)));
            const sharedError = attempt(() => (down ? shared.dec(set, o.amount) : shared.inc(set, o.amount)));
            expect(sharedError).toBe(oracleError);
          }
        }
        const expected = samples(await oracleRegistry.metrics()).sort();
        expect(samples(await r.text.metrics()).sort()).toEqual(expected);
        expect(samples(await r.open.metrics()).sort()).toEqual(expected);
      }),
      { numRuns: 300 },
    );
  });

  it("adds to prom-client's sample of a label set seen before without prom-client's observe; a trace's exemplar goes to it", async () => {
    const r = registries();
    const shared = new SharedHistogram(r, HSPEC, BUCKETS, true);
    const L = { model: 'm', route: 'chat' };
    shared.observe(L, 0.05);
    const metric = shared.metric as unknown as { hashMap: Record<string, { count: number; sum: number }>; observe: (...args: unknown[]) => unknown };
    const [sample] = Object.values(metric.hashMap);
    const promObserve = metric.observe.bind(metric);
    let promCalls = 0;
    metric.observe = (...args: unknown[]) => (promCalls++, promObserve(...args));
    shared.observe({ route: 'chat', model: 'm' }, 1);
    shared.observe(L, 20);
    expect(promCalls).toBe(0);
    expect(Object.values(metric.hashMap)).toEqual([sample]);
    expect(sample).toMatchObject({ count: 3, sum: 21.05 });
    shared.observe(L, 0.2, { trace_id: '0af7651916cd43dd8448eb211c80319c' });
    expect(promCalls).toBe(1);
    shared.observe({ model: 'm', route: 'embeddings' }, 0.2);
    expect(promCalls).toBe(2);
    expect(samples(await r.text.metrics())).toContain('demo_seconds_bucket{le="1",model="m",route="chat"} 3');
  });

  it("forgets a sample it found when prom-client puts a new one in its place (a gauge's set, a histogram's zero)", async () => {
    const r = registries();
    const histogram = new SharedHistogram(r, HSPEC, BUCKETS);
    const gauge = new SharedGauge(r, GSPEC);
    const L = { model: 'm', route: 'chat' };
    for (let i = 0; i < 2; i++) {
      histogram.observe(L, 0.05);
      gauge.inc(L);
    }
    histogram.metric.zero(L);
    gauge.metric.set(L, 10);
    histogram.observe(L, 0.05);
    gauge.inc(L);
    const text = samples(await r.text.metrics());
    expect(text).toContain('demo_seconds_count{model="m",route="chat"} 1');
    expect(text).toContain('demo_inflight{model="m",route="chat"} 11');
  });

  it("forgets the samples it found when prom-client's are reset or one is removed", async () => {
    const r = registries();
    const histogram = new SharedHistogram(r, HSPEC, BUCKETS);
    const gauge = new SharedGauge(r, GSPEC);
    const L = { model: 'm', route: 'chat' };
    const twice = () => {
      // The second finds prom-client's sample and keeps it: what a reset or a removal must make it forget.
      for (let i = 0; i < 2; i++) {
        histogram.observe(L, 0.05);
        gauge.inc(L);
      }
    };
    twice();
    histogram.metric.reset();
    gauge.metric.reset();
    twice();
    histogram.metric.remove(L);
    gauge.metric.remove(L);
    histogram.observe(L, 0.05);
    gauge.inc(L, 5);
    expect(samples(await r.text.metrics())).toEqual([
      'demo_seconds_bucket{le="0.005",model="m",route="chat"} 0',
      'demo_seconds_bucket{le="0.1",model="m",route="chat"} 1',
      'demo_seconds_bucket{le="1",model="m",route="chat"} 1',
      'demo_seconds_bucket{le="2.5",model="m",route="chat"} 1',
      'demo_seconds_bucket{le="10",model="m",route="chat"} 1',
      'demo_seconds_bucket{le="+Inf",model="m",route="chat"} 1',
      'demo_seconds_sum{model="m",route="chat"} 0.05',
      'demo_seconds_count{model="m",route="chat"} 1',
      'demo_inflight{model="m",route="chat"} 5',
    ]);
  });
});

describe('metric-kinds in a process that forbids code from strings', () => {
  // Runs the built module (dist/), as test/live-list-gc.test.ts does: `npm test` builds first.
  const MODULE = new URL('../dist/src/telemetry/metric-kinds.js', import.meta.url);

  it('counts with closures instead of generated readers under node --disallow-code-generation-from-strings', () => {
    const source = `
import { Registry } from 'prom-client';
import { SharedCounter, SharedHistogram, openMetricsRegistry } from ${JSON.stringify(MODULE.href)};
let refused = false;
try { new Function('return 1'); } catch (error) { refused = error instanceof EvalError; }
const r = { text: new Registry(), open: openMetricsRegistry() };
const counter = new SharedCounter(r, { name: 'c_total', type: 'counter', labels: ['model', 'route'], help: 'h' });
const histogram = new SharedHistogram(r, { name: 'h_seconds', type: 'histogram', labels: ['model', 'route'], help: 'h' }, [1]);
// prom-client prints a sample's labels in the order of its first set; the later ones name them the other way.
for (let i = 0; i < 3; i++) { counter.inc({ model: 'm', route: 'x' }); histogram.observe(i === 0 ? { model: 'm', route: 'x' } : { route: 'x', model: 'm' }, 0.5); }
const plain = new SharedCounter(r, { name: 'p_total', type: 'counter', labels: [], help: 'h' });
plain.inc({});
plain.inc({});
let unknown = '';
try { counter.inc({ model: 'm', nope: 'y' }); } catch (error) { unknown = String(error); }
const text = await r.text.metrics();
console.log(JSON.stringify({ refused, text, unknown }));
`;
    const child = spawnSync(process.execPath, ['--disallow-code-generation-from-strings', '--input-type=module', '-e', source], { cwd: new URL('..', import.meta.url), encoding: 'utf8' });
    expect(child.stderr).toBe('');
    const out = JSON.parse(child.stdout) as { refused: boolean; text: string; unknown: string };
    expect(out.refused).toBe(true);
    expect(samples(out.text)).toContain('c_total{model="m",route="x"} 3');
    expect(samples(out.text)).toContain('h_seconds_count{model="m",route="x"} 3');
    expect(samples(out.text)).toContain('p_total 2');
    expect(out.unknown).toContain('nope');
  });
});
