/**
 * src/telemetry/metric-kinds.ts: a counter is one object in both registries (one increment, one hash lookup), and
 * each exposition still names it as its format requires, whatever order or overlap the scrapes come in.
 */
import { Counter, Registry, type OpenMetricsContentType } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { SharedCounter, openMetricsRegistry, type Registries } from '../src/telemetry/metric-kinds.js';
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
