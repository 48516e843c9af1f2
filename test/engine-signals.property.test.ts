/**
 * Properties of the /metrics parser (src/routing/engine-metrics.ts). The oracle is the generator: it knows the values
 * it wrote, so the expected sums and maxima never come from parsing.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { DEFAULT_PARSE_LIMITS, EngineSignals, PARSE_FAILURES, parseEngineMetrics, type ParseLimits, type ScrapeResult } from '../src/routing/engine-signals.js';

interface Series {
  readonly labels: ReadonlyArray<readonly [string, string]>;
  readonly waiting: number;
  readonly running: number;
  readonly kv: number;
  readonly queries: number;
  readonly hits: number;
}

/** Label values full of what a careless scanner trips on: quotes, backslashes, braces, commas, newlines. */
const labelValue = fc.string({ unit: fc.constantFrom('a', 'Z', '0', '"', '\\', '}', '{', ',', '=', ' ', '\n', '#', 'é', '/'), maxLength: 12 });
const escape = (value: string) => value.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');

const series: fc.Arbitrary<Series> = fc.record({
  labels: fc
    .tuple(labelValue, labelValue, fc.option(labelValue, { nil: undefined }), fc.boolean())
    .map(([engine, model, extra, reversed]) => {
      const labels: Array<readonly [string, string]> = [
        ['engine', engine],
        ['model_name', model],
      ];
      if (extra !== undefined) labels.push(['le', extra]);
      return reversed ? labels.reverse() : labels;
    }),
  waiting: fc.nat(100_000),
  running: fc.nat(100_000),
  kv: fc.double({ min: 0, max: 1, noNaN: true }),
  queries: fc.nat(1_000_000_000),
  hits: fc.nat(1_000_000_000),
});

/** The spellings the text format allows for one number (each parses back to exactly `value`). */
const spelling = (value: number): fc.Arbitrary<string> => {
  const forms = [String(value), value.toExponential(), `+${value}`];
  if (Number.isInteger(value)) forms.push(`${value}.0`, `${value}.`);
  return fc.constantFrom(...forms);
};

const sample = (name: string, labels: Series['labels'], value: number, trailing: fc.Arbitrary<string>) =>
  fc.tuple(spelling(value), trailing, fc.boolean()).map(([v, after, bare]) => {
    const set = labels.map(([k, l]) => `${k}="${escape(l)}"`).join(',');
    return `${name}${bare && labels.length === 0 ? ' ' : `{${set}} `}${v}${after}`;
  });

/** Lines that are not the metrics read, some of them close enough to fool a prefix match. */
const noise = fc.oneof(
  fc.constantFrom(
    '# HELP vllm:num_requests_waiting Number of requests waiting to be processed.',
    '# TYPE vllm:num_requests_waiting gauge',
    '# vllm:num_requests_running 99999',
    'vllm:num_requests_waiting_sum{engine="0"} 5',
    'vllm:kv_cache_usage_perc_max 7',
    'vllm:prefix_cache_queries_created{engine="0"} 1.7e9',
    'process_start_time_seconds_x 3',
    'vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 12.0',
    '',
    '   ',
  ),
  fc.tuple(labelValue, fc.nat()).map(([v, n]) => `python_gc_objects_collected_total{generation="${escape(v)}"} ${n}`),
);

const trailing = fc.oneof(fc.constant(''), fc.nat().map((t) => ` ${t}`), fc.constant('\t1764743838450'), fc.constant(' # {trace_id="x"} 1'));

interface Exposition {
  readonly text: string;
  readonly expected: { waiting: number; running: number; kvUsage: number; prefixQueries: number; prefixHits: number; startTime?: number };
  readonly kvMetric: 'kv_cache_usage_perc' | 'gpu_cache_usage_perc';
}

const exposition: fc.Arbitrary<Exposition> = fc
  .record({
    all: fc.array(series, { minLength: 1, maxLength: 8 }),
    startTime: fc.option(fc.double({ min: 1, max: 2e9, noNaN: true }), { nil: undefined }),
    names: fc.constantFrom('new', 'old', 'both'),
    noise: fc.array(noise, { maxLength: 20 }),
    crlf: fc.boolean(),
  })
  .chain(({ all, startTime, names, noise: extra, crlf }) => {
    const lines: Array<fc.Arbitrary<string>> = [];
    for (const s of all) {
      lines.push(sample('vllm:num_requests_waiting', s.labels, s.waiting, trailing));
      lines.push(sample('vllm:num_requests_running', s.labels, s.running, trailing));
      if (names !== 'old') lines.push(sample('vllm:kv_cache_usage_perc', s.labels, s.kv, trailing));
      // With both names the old one carries other values: the new one must win.
      if (names !== 'new') lines.push(sample('vllm:gpu_cache_usage_perc', s.labels, names === 'both' ? 1 - s.kv : s.kv, trailing));
      lines.push(sample('vllm:prefix_cache_queries_total', s.labels, s.queries, trailing));
      lines.push(sample('vllm:prefix_cache_hits_total', s.labels, s.hits, trailing));
    }
    if (startTime !== undefined) lines.push(sample('process_start_time_seconds', [], startTime, trailing));
    for (const line of extra) lines.push(fc.constant(line));
    return fc
      .tuple(...lines)
      .chain((written) => fc.shuffledSubarray(written, { minLength: written.length, maxLength: written.length }))
      .map((shuffled) => ({
        text: shuffled.join(crlf ? '\r\n' : '\n') + (crlf ? '\r\n' : '\n'),
        expected: {
          waiting: all.reduce((sum, s) => sum + s.waiting, 0),
          running: all.reduce((sum, s) => sum + s.running, 0),
          kvUsage: Math.max(...all.map((s) => s.kv)),
          prefixQueries: all.reduce((sum, s) => sum + s.queries, 0),
          prefixHits: all.reduce((sum, s) => sum + s.hits, 0),
          ...(startTime === undefined ? {} : { startTime }),
        },
        kvMetric: names === 'old' ? ('gpu_cache_usage_perc' as const) : ('kv_cache_usage_perc' as const),
      }));
  });

const limits: fc.Arbitrary<ParseLimits> = fc.record({
  maxBodyChars: fc.integer({ min: 0, max: 4096 }),
  maxLineChars: fc.integer({ min: 0, max: 256 }),
  maxSeriesPerName: fc.integer({ min: 0, max: 4 }),
});

/** Anything the parser answers must be one of its shapes, with numbers a picker can use. */
function expectWellFormed(result: ReturnType<typeof parseEngineMetrics>): void {
  expect(Number.isInteger(result.ignored.longLines) && result.ignored.longLines >= 0).toBe(true);
  expect(Number.isInteger(result.ignored.extraSeries) && result.ignored.extraSeries >= 0).toBe(true);
  if (!result.ok) {
    expect(PARSE_FAILURES).toContain(result.reason);
    return;
  }
  const { waiting, running, kvUsage, kvMetric, startTime, prefixQueries, prefixHits } = result.signals;
  for (const value of [waiting, running, startTime ?? 0, prefixQueries ?? 0, prefixHits ?? 0]) {
    expect(Number.isFinite(value) && value >= 0).toBe(true);
  }
  expect(kvUsage >= 0 && kvUsage <= 1).toBe(true);
  expect(['kv_cache_usage_perc', 'gpu_cache_usage_perc']).toContain(kvMetric);
}

describe('parseEngineMetrics (properties)', () => {
  it('returns exactly the generated sums and maxima of any well-formed exposition', () => {
    fc.assert(
      fc.property(exposition, ({ text, expected, kvMetric }) => {
        expect(parseEngineMetrics(text)).toEqual({ ok: true, signals: { ...expected, kvMetric }, ignored: { longLines: 0, extraSeries: 0 } });
      }),
      { numRuns: 500 },
    );
  });

  it('never throws on garbage and answers only from the closed set', () => {
    const garbage = fc.oneof(
      fc.string({ unit: 'binary', maxLength: 300 }),
      fc.string({ unit: fc.constantFrom('v', 'l', 'm', ':', '{', '}', '"', '\\', ' ', '\n', '\r', '#', '1', '.', 'e', '-', '+', 'N', 'a', 'I', 'n', 'f'), maxLength: 300 }),
    );
    fc.assert(
      fc.property(garbage, limits, (text, bounds) => {
        expectWellFormed(parseEngineMetrics(text, bounds));
        expectWellFormed(parseEngineMetrics(text));
      }),
      { numRuns: 2000 },
    );
  });

  it('never throws on a well-formed exposition cut, spliced or squeezed by small limits', () => {
    const mutated = fc
      .tuple(exposition, fc.nat(), fc.nat(), fc.string({ unit: fc.constantFrom('"', '\\', '}', '{', '\n', ' ', 'NaN', '-1', '9e9', '#'), maxLength: 6 }))
      .map(([{ text }, at, cut, insert]) => {
        const i = at % (text.length + 1);
        return text.slice(0, i) + insert + text.slice(Math.min(text.length, i + (cut % 40)));
      });
    fc.assert(
      fc.property(mutated, fc.option(limits, { nil: undefined }), (text, bounds) => {
        expectWellFormed(parseEngineMetrics(text, bounds ?? DEFAULT_PARSE_LIMITS));
      }),
      { numRuns: 1000 },
    );
  });
});

describe('EngineSignals (properties)', () => {
  it('is fresh exactly when the latest valid scrape is at most staleAfterMs old, whatever failures came between', () => {
    const step = fc.record({ gap: fc.nat(3_000), ok: fc.boolean(), startTime: fc.constantFrom(1, 2) });
    fc.assert(
      fc.property(fc.array(step, { maxLength: 30 }), fc.integer({ min: 1, max: 5_000 }), fc.nat(10_000), (steps, staleAfterMs, probe) => {
        let restarts = 0;
        const signals = new EngineSignals(staleAfterMs, () => restarts++);
        let now = 0;
        let lastValidAt: number | undefined;
        let lastStart: number | undefined;
        let expectedRestarts = 0;
        for (const { gap, ok, startTime } of steps) {
          now += gap;
          const result: ScrapeResult = ok
            ? { ok: true, signals: { waiting: 0, running: 0, kvUsage: 0, kvMetric: 'kv_cache_usage_perc', startTime }, ignored: { longLines: 0, extraSeries: 0 } }
            : { ok: false, reason: 'deadline' };
          signals.record('u', result, now);
          if (!ok) continue;
          if (lastStart !== undefined && lastStart !== startTime) expectedRestarts++;
          lastStart = startTime;
          lastValidAt = now;
        }
        const at = now + probe;
        const expected = lastValidAt === undefined ? 'missing' : at - lastValidAt > staleAfterMs ? 'stale' : 'fresh';
        expect(signals.state('u', at)).toBe(expected);
        expect(restarts).toBe(expectedRestarts);
      }),
      { numRuns: 1000 },
    );
  });
});
