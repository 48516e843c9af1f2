/**
 * Engine signals (src/routing/engine-signals.ts): the /metrics parser by value, the per-upstream state on an injected
 * clock, and the scraper over real sockets.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { describe, expect, it } from 'vitest';
import { request } from 'undici';
import { parseConfig } from '../src/config/load.js';
import { ReadStopped, Upstream } from '../src/proxy/upstreams.js';
import {
  DEFAULT_PARSE_LIMITS,
  DEFAULT_SIGNAL_OPTIONS,
  EngineSignals,
  PARSE_FAILURES,
  SCRAPE_RESULTS,
  SignalScraper,
  parseEngineMetrics,
  parseSampleValue,
  readFailure,
  type ParseResult,
  type RestartCause,
  type MetricsRead,
  type ScrapeResult,
  type ScrapeTarget,
} from '../src/routing/engine-signals.js';
import { useCleanups } from './helpers/cleanups.js';

const MODEL = 'meta-llama/Llama-3.1-8B-Instruct';

/** What vLLM v1 (prometheus_client) exposes, abridged: two data-parallel engines, then a LoRA-ish second name. */
const VLLM_SAMPLE = `# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 13642.0
python_gc_objects_collected_total{generation="1"} 2781.0
# HELP process_virtual_memory_bytes Virtual memory size in bytes.
# TYPE process_virtual_memory_bytes gauge
process_virtual_memory_bytes 6.2385414144e+10
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.76474383845e+09
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="${MODEL}"} 7.0
vllm:num_requests_running{engine="1",model_name="${MODEL}"} 5.0
vllm:num_requests_running{model_name="sql-lora",engine="0"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="${MODEL}"} 3.0
vllm:num_requests_waiting{engine="1",model_name="${MODEL}"} 0.0
vllm:num_requests_waiting{model_name="sql-lora",engine="0"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="${MODEL}"} 0.4183
vllm:kv_cache_usage_perc{engine="1",model_name="${MODEL}"} 0.6021
vllm:kv_cache_usage_perc{model_name="sql-lora",engine="0"} 0.4183
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="${MODEL}"} 120000.0
vllm:prefix_cache_queries_total{engine="1",model_name="${MODEL}"} 80000.0
vllm:prefix_cache_queries_created{engine="0",model_name="${MODEL}"} 1.764743858e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="${MODEL}"} 90000.0
vllm:prefix_cache_hits_total{engine="1",model_name="${MODEL}"} 10000.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="${MODEL}"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.005",model_name="${MODEL}"} 12.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="${MODEL}"} 1402.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="${MODEL}"} 1402.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="${MODEL}"} 211.53
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="27648"} 1.0
`;

/** A minimal exposition with the required three, KV under `kvName`. */
function minimal(waiting: string, running: string, kv: string, kvName = 'vllm:kv_cache_usage_perc'): string {
  return `vllm:num_requests_waiting{engine="0"} ${waiting}\nvllm:num_requests_running{engine="0"} ${running}\n${kvName}{engine="0"} ${kv}\n`;
}

function signalsOf(result: ParseResult) {
  if (!result.ok) throw new Error(`expected signals, got ${result.reason}`);
  return result.signals;
}

function reasonOf(result: ParseResult): string {
  if (result.ok) throw new Error('expected a failure');
  return result.reason;
}

describe('parseEngineMetrics', () => {
  it('reads a real vLLM exposition: sums waiting and running over engines and label orders, max KV, counters, start time', () => {
    const result = parseEngineMetrics(VLLM_SAMPLE);
    expect(result).toEqual({
      ok: true,
      signals: {
        waiting: 5,
        running: 13,
        kvUsage: 0.6021,
        kvMetric: 'kv_cache_usage_perc',
        startTime: 1764743838.45,
        prefixQueries: 200000,
        prefixHits: 100000,
        kvCapacityTokens: 27648 * 16,
      },
      ignored: { longLines: 0, extraSeries: 0 },
    });
  });

  it('reads the KV capacity from cache_config_info: num_gpu_blocks × block_size, the smallest engine, bounded', () => {
    const info = (labels: string) => `vllm:cache_config_info{${labels}} 1.0\n`;
    const capacity = (...lines: string[]) => signalsOf(parseEngineMetrics(minimal('0', '0', '0.1') + lines.join(''))).kvCapacityTokens;
    // Label order does not matter, and num_gpu_blocks_override is not num_gpu_blocks.
    expect(capacity(info('num_gpu_blocks_override="None",num_gpu_blocks="320",block_size="16",engine="0"'))).toBe(5120);
    expect(capacity(info('engine="0",block_size="32",num_gpu_blocks="1000"'), info('engine="1",block_size="32",num_gpu_blocks="800"'))).toBe(25600);
    // Before KV profiling vLLM renders None; a lie or a unit slip beyond the bounds is not believed; none is unknown.
    expect(capacity(info('block_size="16",num_gpu_blocks="None"'))).toBeUndefined();
    expect(capacity(info('block_size="16",num_gpu_blocks="0"'))).toBeUndefined();
    expect(capacity(info('block_size="16",num_gpu_blocks="99999999999"'))).toBeUndefined();
    expect(capacity(info('block_size="8192",num_gpu_blocks="100"'))).toBeUndefined();
    expect(capacity(info('block_size="16",num_gpu_blocks="-5"'))).toBeUndefined();
    expect(capacity(info('num_gpu_blocks="100"'))).toBeUndefined();
    expect(capacity()).toBeUndefined();
    // A value inside another label's quotes is not a label; one unusable series makes the capacity unknown.
    expect(capacity(info('note="x num_gpu_blocks=\\"5\\"",block_size="16",num_gpu_blocks="10"'))).toBe(160);
    expect(capacity(info('engine="0",block_size="16",num_gpu_blocks="10"'), info('engine="1",block_size="16",num_gpu_blocks="None"'))).toBeUndefined();
    // An unterminated label set is malformed, and the required signals still stand.
    expect(capacity('vllm:cache_config_info{block_size="16",num_gpu_blocks="10" 1\n')).toBeUndefined();
  });

  it('falls back to the pre-rename gpu_cache_usage_perc and says so', () => {
    const old = VLLM_SAMPLE.replaceAll('vllm:kv_cache_usage_perc', 'vllm:gpu_cache_usage_perc');
    expect(signalsOf(parseEngineMetrics(old))).toMatchObject({ kvUsage: 0.6021, kvMetric: 'gpu_cache_usage_perc' });
  });

  it('prefers kv_cache_usage_perc when both names are exposed, even when the new one is the invalid one', () => {
    const both = minimal('1', '2', '0.25') + 'vllm:gpu_cache_usage_perc{engine="0"} 0.75\n';
    expect(signalsOf(parseEngineMetrics(both))).toMatchObject({ kvUsage: 0.25, kvMetric: 'kv_cache_usage_perc' });
    const badNew = minimal('1', '2', 'NaN') + 'vllm:gpu_cache_usage_perc{engine="0"} 0.75\n';
    expect(reasonOf(parseEngineMetrics(badNew))).toBe('invalid');
  });

  it('skips label values with escaped quotes and backslashes, commas, braces and newlines inside quotes', () => {
    const text = [
      String.raw`vllm:num_requests_waiting{model_name="a\"} 99\\",engine="0"} 4`,
      String.raw`vllm:num_requests_waiting{model_name="x,y}z\n",engine="1",} 6`,
      String.raw`vllm:num_requests_running{model_name="\\\\"} 2`,
      String.raw`vllm:kv_cache_usage_perc{model_name="}{\""} 0.5`,
    ].join('\n');
    expect(signalsOf(parseEngineMetrics(text))).toMatchObject({ waiting: 10, running: 2, kvUsage: 0.5 });
  });

  it('tolerates timestamps, exemplars, blank lines, leading blanks, tabs and CRLF', () => {
    const text =
      'vllm:num_requests_waiting{engine="0"} 3 1764743838450\r\n' +
      '\r\n' +
      '   vllm:num_requests_running\t4\t-12\r\n' +
      'vllm:kv_cache_usage_perc 0.5 # {trace_id="abc"} 1.0\r\n' +
      'vllm:prefix_cache_hits_total{engine="0"} 7 1764743838450 # {trace_id="abc"} 1.0\r\n';
    expect(signalsOf(parseEngineMetrics(text))).toEqual({ waiting: 3, running: 4, kvUsage: 0.5, kvMetric: 'kv_cache_usage_perc', prefixHits: 7 });
  });

  it('accepts the value spellings of the text format', () => {
    expect(signalsOf(parseEngineMetrics(minimal('1e3', '2.', '-0')))).toMatchObject({ waiting: 1000, running: 2, kvUsage: 0 });
    expect(signalsOf(parseEngineMetrics(minimal('+3.5E1', '.5', '1.0')))).toMatchObject({ waiting: 35, running: 0.5, kvUsage: 1 });
    expect([parseSampleValue('+Inf'), parseSampleValue('-inf'), parseSampleValue('Infinity')]).toEqual([Infinity, -Infinity, Infinity]);
    expect(parseSampleValue('NaN')).toBeNaN();
    for (const bad of ['', '0x10', '1_000', 'one', '1e', '--1', 'Inff']) expect(parseSampleValue(bad)).toBeUndefined();
  });

  it('refuses NaN, ±Inf and negative values of a required signal as invalid', () => {
    for (const [w, r, kv] of [
      ['NaN', '1', '0.1'],
      ['1', '+Inf', '0.1'],
      ['-1', '1', '0.1'],
      ['1', '1', '-Inf'],
      ['1', '1', '-0.2'],
    ] as const) {
      expect(reasonOf(parseEngineMetrics(minimal(w, r, kv))), `${w} ${r} ${kv}`).toBe('invalid');
    }
    // One bad engine spoils the sum: a partial sum would under-report the load.
    const oneBad = minimal('1', '1', '0.1') + 'vllm:num_requests_waiting{engine="1"} NaN\n';
    expect(reasonOf(parseEngineMetrics(oneBad))).toBe('invalid');
  });

  it('refuses KV usage above 1 (a percentage is not rescaled) but clamps float noise', () => {
    expect(reasonOf(parseEngineMetrics(minimal('1', '1', '1.5')))).toBe('invalid');
    expect(reasonOf(parseEngineMetrics(minimal('1', '1', '42')))).toBe('invalid');
    expect(signalsOf(parseEngineMetrics(minimal('1', '1', '1.0000000001'))).kvUsage).toBe(1);
  });

  it('drops an invalid or malformed optional signal and keeps the rest', () => {
    const text = minimal('1', '2', '0.3') + 'vllm:prefix_cache_queries_total{engine="0"} NaN\nvllm:prefix_cache_hits_total{engine="0"} x\nprocess_start_time_seconds -5\n';
    expect(signalsOf(parseEngineMetrics(text))).toEqual({ waiting: 1, running: 2, kvUsage: 0.3, kvMetric: 'kv_cache_usage_perc' });
  });

  it('says missing when waiting, running or KV usage has no series', () => {
    const lines = minimal('1', '2', '0.3').split('\n');
    for (const drop of [0, 1, 2]) expect(reasonOf(parseEngineMetrics(lines.filter((_, i) => i !== drop).join('\n')))).toBe('missing');
    expect(reasonOf(parseEngineMetrics(''))).toBe('missing');
    expect(reasonOf(parseEngineMetrics('<html>404</html>'))).toBe('missing');
    // Exact names only: a longer name and a comment do not count.
    expect(reasonOf(parseEngineMetrics('# vllm:num_requests_waiting 1\nvllm:num_requests_waiting_x 1\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0'))).toBe('missing');
  });

  it('says malformed for a required line that does not parse', () => {
    const good = minimal('1', '2', '0.3');
    for (const bad of ['vllm:num_requests_waiting{engine="0" 1', 'vllm:num_requests_waiting{engine="0} 1', 'vllm:num_requests_waiting', 'vllm:num_requests_waiting one', 'vllm:num_requests_waiting 1 2 3']) {
      expect(reasonOf(parseEngineMetrics(`${good}${bad}\n`)), bad).toBe('malformed');
    }
  });

  it('scans a 10 MB body of junk lines in bounded time and finds nothing', () => {
    const junk = 'node_like_metric{a="b"} 1\n#comment\n}}}{{{"\\\n'.repeat(Math.ceil((10 * 1024 * 1024) / 44));
    const limits = { ...DEFAULT_PARSE_LIMITS, maxBodyChars: 16 * 1024 * 1024 };
    const started = performance.now();
    expect(reasonOf(parseEngineMetrics(junk, limits))).toBe('missing');
    expect(signalsOf(parseEngineMetrics(junk + minimal('1', '2', '0.3'), limits)).waiting).toBe(1);
    // Generous for a shared CI core; a quadratic scan of 10 MB would take minutes.
    expect(performance.now() - started).toBeLessThan(5_000);
    expect(reasonOf(parseEngineMetrics(junk))).toBe('too_large');
  });

  it('ignores and counts a line over maxLineChars, of any metric', () => {
    const long = `vllm:num_requests_waiting{model_name="${'x'.repeat(70 * 1024)}"} 100\n`;
    const result = parseEngineMetrics(minimal('1', '2', '0.3') + long + `junk ${'y'.repeat(65 * 1024)}\n`);
    expect(result).toMatchObject({ ok: true, signals: { waiting: 1 }, ignored: { longLines: 2, extraSeries: 0 } });
    expect(parseEngineMetrics(long + minimal('1', '2', '0.3').split('\n').slice(1).join('\n'))).toMatchObject({ ok: false, reason: 'missing', ignored: { longLines: 1 } });
  });

  it('reads at most maxSeriesPerName series of a name and counts the rest', () => {
    const many = Array.from({ length: 1030 }, (_, i) => `vllm:num_requests_waiting{engine="${i}"} 1`).join('\n');
    const result = parseEngineMetrics(`${many}\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.1\n`);
    expect(result).toMatchObject({ ok: true, signals: { waiting: 1024 }, ignored: { longLines: 0, extraSeries: 6 } });
  });

  it('has a closed set of reasons, all of them scrape results', () => {
    expect([...PARSE_FAILURES]).toEqual(['missing', 'invalid', 'malformed', 'too_large']);
    for (const reason of PARSE_FAILURES) expect(SCRAPE_RESULTS).toContain(reason);
    expect(new Set(SCRAPE_RESULTS).size).toBe(SCRAPE_RESULTS.length);
  });
});

const load = (waiting: number, extra: Partial<{ startTime: number; prefixQueries: number; prefixHits: number }> = {}): ScrapeResult => ({
  ok: true,
  signals: { waiting, running: 1, kvUsage: 0.5, kvMetric: 'kv_cache_usage_perc', ...extra },
  ignored: { longLines: 0, extraSeries: 0 },
});

describe('EngineSignals', () => {
  it('is missing, then fresh, then stale after staleAfterMs without a valid scrape; a failure keeps the last signals', () => {
    const signals = new EngineSignals(5_000);
    expect(signals.state('u', 0)).toBe('missing');
    signals.record('u', load(3), 1_000);
    expect(signals.state('u', 1_000)).toBe('fresh');
    signals.record('u', { ok: false, reason: 'deadline' }, 2_000);
    expect(signals.lastFailure('u')).toBe('deadline');
    expect(signals.state('u', 6_000)).toBe('fresh');
    expect(signals.fresh('u', 6_000)?.waiting).toBe(3);
    expect(signals.state('u', 6_001)).toBe('stale');
    expect(signals.fresh('u', 6_001)).toBeUndefined();
    expect(signals.latest('u')).toMatchObject({ signals: { waiting: 3 }, at: 1_000 });
    signals.record('u', load(4), 7_000);
    expect([signals.state('u', 7_000), signals.lastFailure('u')]).toEqual(['fresh', undefined]);
  });

  it('forgets upstreams no longer listed', () => {
    const signals = new EngineSignals(5_000);
    signals.record('a', load(1), 0);
    signals.record('b', load(1), 0);
    signals.retain(new Set(['b']));
    expect([signals.state('a', 0), signals.state('b', 0)]).toEqual(['missing', 'fresh']);
  });

  it('tells onRestart when the start time changes or a prefix counter goes down, not on the first scrape', () => {
    const restarts: Array<[string, RestartCause]> = [];
    const signals = new EngineSignals(5_000, (upstream, cause) => restarts.push([upstream, cause]));
    expect(signals.record('u', load(1, { startTime: 100, prefixQueries: 50 }), 0)).toBeUndefined();
    expect(signals.record('u', load(1, { startTime: 100, prefixQueries: 60 }), 1)).toBeUndefined();
    expect(signals.record('u', load(1, { startTime: 200, prefixQueries: 70 }), 2)).toBe('start_time');
    expect(signals.record('u', load(1, { prefixQueries: 10 }), 3)).toBe('counter_reset');
    expect(signals.record('u', load(1, { prefixQueries: 20 }), 4)).toBeUndefined();
    expect(restarts).toEqual([
      ['u', 'start_time'],
      ['u', 'counter_reset'],
    ]);
  });
});

// ---- The scraper over real sockets ----

type Route = (req: IncomingMessage, res: ServerResponse) => void;

interface MetricsServer {
  readonly url: string;
  hits: number;
  route: Route;
  close(): Promise<void>;
}

const cleanups = useCleanups();

async function metricsServer(route: Route): Promise<MetricsServer> {
  const sockets = new Set<Socket>();
  const handle = { url: '', hits: 0, route, close: async () => {} };
  const server: Server = createServer((req, res) => {
    if (req.url !== '/metrics') return void res.writeHead(404).end();
    handle.hits++;
    handle.route(req, res);
  });
  server.on('connection', (socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  handle.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  let closed = false;
  handle.close = () =>
    closed
      ? Promise.resolve()
      : new Promise<void>((resolve) => {
          closed = true;
          for (const socket of sockets) socket.destroy();
          server.close(() => resolve());
        });
  cleanups.push(() => handle.close());
  return handle;
}

const serve =
  (body: () => string): Route =>
  (_req, res) => {
    res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' }).end(body());
  };

interface Target {
  readonly name: string;
  readonly url: string;
}

/** A read straight over undici, deadline-bound like Upstream.get. */
const undiciRead = async (target: Target, timeoutMs: number) => {
  const response = await request(`${target.url}/metrics`, { signal: AbortSignal.timeout(timeoutMs) });
  return { status: response.statusCode, body: await response.body.text() };
};

/** A scraper whose clock the test sets, with every result queued for the test to await. */
function scraperFor<T extends ScrapeTarget>(
  targets: () => readonly T[],
  read: MetricsRead<T>,
  options: Partial<typeof DEFAULT_SIGNAL_OPTIONS> = {},
  onRestart: (upstream: string, cause: RestartCause) => void = () => {},
) {
  const clock = { now: 0 };
  const results: Array<[string, ScrapeResult]> = [];
  const waiters: Array<() => void> = [];
  const signals = new EngineSignals(options.staleAfterMs ?? DEFAULT_SIGNAL_OPTIONS.staleAfterMs, onRestart);
  const scraper = new SignalScraper(
    targets,
    read,
    signals,
    options,
    {
      onResult: (upstream, result) => {
        results.push([upstream, result]);
        for (const wake of waiters.splice(0)) wake();
      },
    },
    () => clock.now,
  );
  cleanups.push(() => scraper.stop());
  /** Resolves once `count` results have been reported in all. */
  const resultCount = async (count: number) => {
    while (results.length < count) await new Promise<void>((resolve) => waiters.push(resolve));
  };
  return { clock, results, signals, scraper, resultCount };
}

describe('SignalScraper', () => {
  it('has the documented defaults', () => {
    expect(DEFAULT_SIGNAL_OPTIONS).toMatchObject({ enabled: true, intervalMs: 1_000, timeoutMs: 500, staleAfterMs: 5_000 });
  });

  it('makes signals fresh after a scrape, then stale once the server stops answering for staleAfterMs', async () => {
    const server = await metricsServer(serve(() => VLLM_SAMPLE));
    const { clock, results, signals, scraper } = scraperFor(() => [{ name: 'u', url: server.url }], undiciRead);
    await scraper.round();
    expect(results).toEqual([['u', { ok: true, signals: expect.objectContaining({ waiting: 5, running: 13 }) as unknown, ignored: { longLines: 0, extraSeries: 0 } }]]);
    expect(signals.state('u', 0)).toBe('fresh');
    await server.close();
    clock.now = 1_000;
    await scraper.round();
    expect(results[1]).toEqual(['u', { ok: false, reason: 'unreachable' }]);
    expect(signals.state('u', 5_000)).toBe('fresh');
    expect(signals.state('u', 5_001)).toBe('stale');
  });

  it('scrapes on its interval once started, and stops', async () => {
    const server = await metricsServer(serve(() => VLLM_SAMPLE));
    const { results, scraper, resultCount } = scraperFor(() => [{ name: 'u', url: server.url }], undiciRead, { intervalMs: 20 });
    scraper.start();
    await resultCount(3);
    scraper.stop();
    const count = results.length;
    // Stopped: a round asked for now reads nothing, and a read in flight at stop reports nothing.
    await scraper.round();
    expect(results.length).toBe(count);
    // A round that comes while the previous read is still out (a loaded CI core) skips it: busy, never a second read.
    const kinds = new Set(results.map(([, r]) => (r.ok ? 'ok' : r.reason)));
    expect(kinds.has('ok')).toBe(true);
    expect([...kinds].every((kind) => kind === 'ok' || kind === 'busy')).toBe(true);
  });

  it('never sends a second concurrent scrape to a hung /metrics: later rounds are busy', async () => {
    let arrived = () => {};
    const arrival = new Promise<void>((resolve) => (arrived = resolve));
    const server = await metricsServer(() => arrived()); // never answers
    let reads = 0;
    // A read that ignores its deadline: the scraper's own one still reports on time.
    const stubborn = async (target: Target) => {
      reads++;
      const response = await request(`${target.url}/metrics`);
      return { status: response.statusCode, body: await response.body.text() };
    };
    const { results, scraper } = scraperFor(() => [{ name: 'u', url: server.url }], stubborn, { timeoutMs: 50 });
    await scraper.round();
    await scraper.round();
    await scraper.round();
    expect(results.map(([, r]) => (r.ok ? 'ok' : r.reason))).toEqual(['deadline', 'busy', 'busy']);
    await arrival;
    expect([reads, server.hits]).toEqual([1, 1]);
  });

  it('answers http_status for a non-200 and counts every result by upstream', async () => {
    const server = await metricsServer((_req, res) => void res.writeHead(401).end('unauthorized'));
    const { results, signals, scraper } = scraperFor(() => [{ name: 'u', url: server.url }], undiciRead);
    await scraper.round();
    expect(results).toEqual([['u', { ok: false, reason: 'http_status' }]]);
    expect(signals.state('u', 0)).toBe('missing');
  });

  it('sees the list change between rounds and forgets upstreams that left it', async () => {
    const a = await metricsServer(serve(() => VLLM_SAMPLE));
    const b = await metricsServer(serve(() => minimal('9', '9', '0.9')));
    let list: Target[] = [{ name: 'a', url: a.url }];
    const { results, signals, scraper } = scraperFor(() => list, undiciRead);
    await scraper.round();
    list = [{ name: 'b', url: b.url }];
    await scraper.round();
    expect(results.map(([name]) => name)).toEqual(['a', 'b']);
    expect([signals.state('a', 0), signals.fresh('b', 0)?.waiting]).toEqual(['missing', 9]);
  });

  it('tells onRestart when the served start time changes', async () => {
    let start = 100;
    const server = await metricsServer(serve(() => `${minimal('1', '1', '0.1')}process_start_time_seconds ${start}\n`));
    const restarts: string[] = [];
    const { scraper } = scraperFor(() => [{ name: 'u', url: server.url }], undiciRead, {}, (upstream, cause) => restarts.push(`${upstream}:${cause}`));
    await scraper.round();
    await scraper.round();
    start = 200;
    await scraper.round();
    expect(restarts).toEqual(['u:start_time']);
  });

  it('maps read errors to reasons without importing the reader', () => {
    expect(readFailure(new ReadStopped('too_large', 'x'))).toBe('too_large');
    expect(readFailure(new ReadStopped('deadline', 'x'))).toBe('deadline');
    expect(readFailure(new DOMException('timed out', 'TimeoutError'))).toBe('deadline');
    expect(readFailure(Object.assign(new Error('headers'), { code: 'UND_ERR_HEADERS_TIMEOUT' }))).toBe('deadline');
    expect(readFailure(Object.assign(new Error('connect'), { code: 'UND_ERR_CONNECT_TIMEOUT' }))).toBe('unreachable');
    expect(readFailure(Object.assign(new Error('refused'), { code: 'ECONNREFUSED' }))).toBe('unreachable');
    expect(readFailure(undefined)).toBe('unreachable');
  });

  it('reports a read stopped at its size limit as too_large (a ReadStopped-like error)', async () => {
    const tooLarge = () => Promise.reject(Object.assign(new Error('over health.max_body_bytes'), { reason: 'too_large' }));
    const { results, scraper } = scraperFor(() => [{ name: 'u', url: 'http://unused' }], tooLarge);
    await scraper.round();
    expect(results).toEqual([['u', { ok: false, reason: 'too_large' }]]);
  });

  it('through a real Upstream: reads /metrics as the "signals" read, its body capped at health.max_body_bytes', async () => {
    let closed = false;
    let written = 0;
    const chunk = Buffer.alloc(64 * 1024, 0x23); // '#' lines: a comment that never ends
    const server = await metricsServer(serve(() => VLLM_SAMPLE));
    const config = parseConfig(
      { pools: [{ name: 'p', models: ['m'], upstreams: [{ name: 'u', url: server.url }] }], health: { max_body_bytes: 256 * 1024 } },
      'test',
      {},
    );
    const stops: string[] = [];
    const upstreamConfig = config.pools[0]?.upstreams[0];
    if (upstreamConfig === undefined) throw new Error('no upstream configured');
    const upstream = new Upstream(upstreamConfig, config, (name, read, reason) => stops.push(`${name}:${read}:${reason}`));
    cleanups.push(() => upstream.close());
    const { results, scraper } = scraperFor(() => [upstream], (u, timeoutMs) => u.get('/metrics', timeoutMs, 'signals'), { timeoutMs: 5_000 });
    await scraper.round();
    expect(results[0]).toEqual(['u', { ok: true, signals: expect.objectContaining({ waiting: 5, kvUsage: 0.6021 }) as unknown, ignored: { longLines: 0, extraSeries: 0 } }]);

    server.route = (_req, res) => {
      res.writeHead(200);
      res.on('close', () => (closed = true));
      const pump = () => {
        while (!closed && written < 64 * 1024 * 1024) {
          written += chunk.length;
          if (!res.write(chunk)) return void res.once('drain', pump);
        }
      };
      pump();
    };
    await scraper.round();
    expect(results[1]).toEqual(['u', { ok: false, reason: 'too_large' }]);
    expect(stops).toEqual(['u:signals:too_large']);
    expect(written).toBeLessThan(32 * 1024 * 1024);
  });

  it('does nothing when disabled, and an observer that throws does not break it', async () => {
    const server = await metricsServer(serve(() => VLLM_SAMPLE));
    let reads = 0;
    const counting = (target: Target, timeoutMs: number) => {
      reads++;
      return undiciRead(target, timeoutMs);
    };
    const off = new SignalScraper(() => [{ name: 'u', url: server.url }], counting, new EngineSignals(5_000), { enabled: false });
    // A started round calls its reads synchronously, so none having been called means none will be.
    off.start();
    off.stop();
    expect(reads).toBe(0);
    const signals = new EngineSignals(5_000, () => {
      throw new Error('observer bug');
    });
    let calls = 0;
    const scraper = new SignalScraper(() => [{ name: 'u', url: server.url }], undiciRead, signals, {}, {
      onResult: () => {
        calls++;
        throw new Error('observer bug');
      },
    });
    await expect(scraper.round()).resolves.toBeUndefined();
    await expect(scraper.round()).resolves.toBeUndefined();
    expect([calls, server.hits, signals.state('u', performance.now())]).toEqual([2, 2, 'fresh']);
  });
});
