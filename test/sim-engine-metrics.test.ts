/**
 * The simulated engine's /metrics against vLLM's own exposition. The oracle below is written from vLLM's source
 * (vllm/v1/metrics/loggers.py PrometheusStatLogger, vllm/config/cache.py metrics_info, prometheus_client's
 * generate_latest), not from the module's constants: every family's exposed name, TYPE, HELP and label names. The
 * rendered text is read back with a small parser written here, checked against the oracle, checked by value after
 * known observations, and — when `promtool` is on PATH — linted by Prometheus itself.
 */
import { spawnSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import {
  EngineMetrics,
  type EngineMetricsOptions,
  formatValue,
  pythonFloatRepr,
  renderEngines,
} from '../src/sim/engine/metrics.js';

// ------------------------------------------------------------------------------------------------------------------
// A tiny exposition parser (text format 0.0.4)
// ------------------------------------------------------------------------------------------------------------------

interface ParsedSample {
  name: string;
  labels: Record<string, string>;
  value: number;
  raw: string;
}

interface ParsedFamily {
  name: string;
  type: string;
  help: string;
  samples: ParsedSample[];
}

function parseLabels(text: string): Record<string, string> {
  const labels: Record<string, string> = {};
  let i = 0;
  while (i < text.length) {
    const eq = text.indexOf('=', i);
    const name = text.slice(i, eq);
    if (!/^[a-zA-Z_][a-zA-Z0-9_]*$/.test(name) || text[eq + 1] !== '"') throw new Error(`bad label at ${text.slice(i)}`);
    let j = eq + 2;
    let value = '';
    for (; j < text.length && text[j] !== '"'; j++) {
      if (text[j] === '\\') {
        j++;
        value += text[j] === 'n' ? '\n' : (text[j] ?? '');
      } else {
        value += text[j] ?? '';
      }
    }
    if (name in labels) throw new Error(`duplicate label ${name}`);
    labels[name] = value;
    i = j + 1;
    if (text[i] === ',') i++;
  }
  return labels;
}

function parseValue(text: string): number {
  if (text === '+Inf') return Infinity;
  if (text === '-Inf') return -Infinity;
  if (text === 'NaN') return NaN;
  if (!/^-?\d+(\.\d+)?(e[+-]\d+)?$/.test(text)) throw new Error(`bad value ${text}`);
  return Number(text);
}

/** Families by exposed name, in order; throws on anything the text format does not allow. */
function parseExposition(text: string): ParsedFamily[] {
  expect(text.endsWith('\n')).toBe(true);
  const families: ParsedFamily[] = [];
  const helps = new Map<string, string>();
  const seen = new Set<string>();
  let current: ParsedFamily | undefined;
  for (const line of text.slice(0, -1).split('\n')) {
    const help = /^# HELP (\S+) (.*)$/.exec(line);
    const type = /^# TYPE (\S+) (counter|gauge|histogram|summary|untyped)$/.exec(line);
    if (help) {
      helps.set(help[1] ?? '', help[2] ?? '');
      continue;
    }
    if (type) {
      const name = type[1] ?? '';
      if (seen.has(name)) throw new Error(`family ${name} declared twice`);
      seen.add(name);
      current = { name, type: type[2] ?? '', help: helps.get(name) ?? '', samples: [] };
      families.push(current);
      continue;
    }
    const sample = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!sample || current === undefined) throw new Error(`unparseable line: ${line}`);
    const name = sample[1] ?? '';
    const suffixes = current.type === 'histogram' ? ['_bucket', '_count', '_sum'] : [''];
    if (!suffixes.some((suffix) => name === `${current?.name ?? ''}${suffix}`)) {
      throw new Error(`sample ${name} outside its family ${current.name}`);
    }
    current.samples.push({ name, labels: parseLabels(sample[2] ?? ''), value: parseValue(sample[3] ?? ''), raw: sample[3] ?? '' });
  }
  return families;
}

function family(families: ParsedFamily[], name: string): ParsedFamily {
  const found = families.find((f) => f.name === name);
  if (found === undefined) throw new Error(`no family ${name}`);
  return found;
}

function one(families: ParsedFamily[], name: string, labels: Record<string, string> = {}): number {
  const base = name.replace(/_(bucket|count|sum)$/, '');
  const f = families.find((x) => x.name === name) ?? family(families, base);
  const matches = f.samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v));
  expect(matches).toHaveLength(1);
  return matches[0]?.value ?? NaN;
}

/** Cumulative bucket counts by `le`, in order. */
function buckets(families: ParsedFamily[], name: string): Array<[string, number]> {
  return family(families, name)
    .samples.filter((s) => s.name === `${name}_bucket`)
    .map((s) => [s.labels.le ?? '', s.value]);
}

// ------------------------------------------------------------------------------------------------------------------
// The oracle, from vLLM's source
// ------------------------------------------------------------------------------------------------------------------

const ENGINE = ['engine', 'model_name'];

interface OracleEntry {
  /** As exposed: counters with `_total`. */
  name: string;
  type: 'counter' | 'gauge' | 'histogram';
  /** Sorted label names of every sample (histogram `_bucket` samples add `le`). */
  labels: string[];
  help: string;
}

/** CacheConfig's fields (vllm/config/cache.py) — metrics_info() makes every one a label. */
const CACHE_CONFIG_FIELDS = [
  'block_size', 'gpu_memory_utilization', 'swap_space', 'cache_dtype', 'is_attention_free', 'num_gpu_blocks_override',
  'sliding_window', 'enable_prefix_caching', 'prefix_caching_hash_algo', 'cpu_offload_gb', 'calculate_kv_scales',
  'cpu_kvcache_space_bytes', 'mamba_page_size_padded', 'mamba_block_size', 'mamba_cache_dtype', 'mamba_ssm_cache_dtype',
  'num_gpu_blocks', 'num_cpu_blocks', 'kv_sharing_fast_prefill', 'kv_cache_memory_bytes', 'kv_offloading_size',
  'kv_offloading_backend',
];

const CURRENT_ORACLE: OracleEntry[] = [
  { name: 'process_start_time_seconds', type: 'gauge', labels: [], help: 'Start time of the process since unix epoch in seconds.' },
  { name: 'vllm:num_requests_running', type: 'gauge', labels: ENGINE, help: 'Number of requests in model execution batches.' },
  { name: 'vllm:num_requests_waiting', type: 'gauge', labels: ENGINE, help: 'Number of requests waiting to be processed.' },
  {
    name: 'vllm:engine_sleep_state', type: 'gauge', labels: ['engine', 'model_name', 'sleep_state'],
    help: 'Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.',
  },
  { name: 'vllm:kv_cache_usage_perc', type: 'gauge', labels: ENGINE, help: 'KV-cache usage. 1 means 100 percent usage.' },
  { name: 'vllm:prefix_cache_queries_total', type: 'counter', labels: ENGINE, help: 'Prefix cache queries, in terms of number of queried tokens.' },
  { name: 'vllm:prefix_cache_hits_total', type: 'counter', labels: ENGINE, help: 'Prefix cache hits, in terms of number of cached tokens.' },
  { name: 'vllm:num_preemptions_total', type: 'counter', labels: ENGINE, help: 'Cumulative number of preemption from the engine.' },
  { name: 'vllm:prompt_tokens_total', type: 'counter', labels: ENGINE, help: 'Number of prefill tokens processed.' },
  { name: 'vllm:generation_tokens_total', type: 'counter', labels: ENGINE, help: 'Number of generation tokens processed.' },
  { name: 'vllm:request_success_total', type: 'counter', labels: ['engine', 'finished_reason', 'model_name'], help: 'Count of successfully processed requests.' },
  { name: 'vllm:request_prompt_tokens', type: 'histogram', labels: ENGINE, help: 'Number of prefill tokens processed.' },
  { name: 'vllm:request_generation_tokens', type: 'histogram', labels: ENGINE, help: 'Number of generation tokens processed.' },
  { name: 'vllm:time_to_first_token_seconds', type: 'histogram', labels: ENGINE, help: 'Histogram of time to first token in seconds.' },
  { name: 'vllm:inter_token_latency_seconds', type: 'histogram', labels: ENGINE, help: 'Histogram of inter-token latency in seconds.' },
  { name: 'vllm:request_time_per_output_token_seconds', type: 'histogram', labels: ENGINE, help: 'Histogram of time_per_output_token_seconds per request.' },
  { name: 'vllm:e2e_request_latency_seconds', type: 'histogram', labels: ENGINE, help: 'Histogram of e2e request latency in seconds.' },
  { name: 'vllm:request_queue_time_seconds', type: 'histogram', labels: ENGINE, help: 'Histogram of time spent in WAITING phase for request.' },
  { name: 'vllm:request_inference_time_seconds', type: 'histogram', labels: ENGINE, help: 'Histogram of time spent in RUNNING phase for request.' },
  { name: 'vllm:request_prefill_time_seconds', type: 'histogram', labels: ENGINE, help: 'Histogram of time spent in PREFILL phase for request.' },
  { name: 'vllm:request_decode_time_seconds', type: 'histogram', labels: ENGINE, help: 'Histogram of time spent in DECODE phase for request.' },
  {
    name: 'vllm:request_prefill_kv_computed_tokens', type: 'histogram', labels: ENGINE,
    help: 'Histogram of new KV tokens computed during prefill (excluding cached tokens).',
  },
  { name: 'vllm:cache_config_info', type: 'gauge', labels: [...CACHE_CONFIG_FIELDS, 'engine'].sort(), help: 'Information of the LLMEngine CacheConfig' },
];

const KV_RESIDENCY_ORACLE: OracleEntry[] = [
  {
    name: 'vllm:kv_block_lifetime_seconds', type: 'histogram', labels: ENGINE,
    help: 'Histogram of KV cache block lifetime from allocation to eviction. Sampled metrics (controlled by --kv-cache-metrics-sample).',
  },
  {
    name: 'vllm:kv_block_idle_before_evict_seconds', type: 'histogram', labels: ENGINE,
    help: 'Histogram of idle time before KV cache block eviction. Sampled metrics (controlled by --kv-cache-metrics-sample).',
  },
  {
    name: 'vllm:kv_block_reuse_gap_seconds', type: 'histogram', labels: ENGINE,
    help: 'Histogram of time gaps between consecutive KV cache block accesses. Only the most recent accesses are recorded (ring buffer). Sampled metrics (controlled by --kv-cache-metrics-sample).',
  },
];

/** A vLLM from before the renames (0.8.x: gpu_* names, time_per_output_token_seconds, no engine on cache_config_info). */
const OLD_ORACLE: OracleEntry[] = [
  CURRENT_ORACLE[0]!, CURRENT_ORACLE[1]!, CURRENT_ORACLE[2]!,
  { name: 'vllm:gpu_cache_usage_perc', type: 'gauge', labels: ENGINE, help: 'GPU KV-cache usage. 1 means 100 percent usage.' },
  { name: 'vllm:gpu_prefix_cache_queries_total', type: 'counter', labels: ENGINE, help: 'GPU prefix cache queries, in terms of number of queried blocks.' },
  { name: 'vllm:gpu_prefix_cache_hits_total', type: 'counter', labels: ENGINE, help: 'GPU prefix cache hits, in terms of number of cached blocks.' },
  ...CURRENT_ORACLE.filter((e) =>
    ['vllm:num_preemptions_total', 'vllm:prompt_tokens_total', 'vllm:generation_tokens_total', 'vllm:request_success_total',
      'vllm:request_prompt_tokens', 'vllm:request_generation_tokens', 'vllm:time_to_first_token_seconds'].includes(e.name)),
  { name: 'vllm:time_per_output_token_seconds', type: 'histogram', labels: ENGINE, help: 'Histogram of time per output token in seconds.' },
  ...CURRENT_ORACLE.filter((e) =>
    ['vllm:e2e_request_latency_seconds', 'vllm:request_queue_time_seconds', 'vllm:request_inference_time_seconds',
      'vllm:request_prefill_time_seconds', 'vllm:request_decode_time_seconds'].includes(e.name)),
  { name: 'vllm:cache_config_info', type: 'gauge', labels: [...CACHE_CONFIG_FIELDS].sort(), help: 'Information of the LLMEngine CacheConfig' },
];

/** prometheus_client's `_created` family for a counter (registered name, without `_total`) or a histogram. */
function createdName(entry: OracleEntry): string | null {
  if (entry.type === 'gauge') return null;
  return `${entry.type === 'counter' ? entry.name.replace(/_total$/, '') : entry.name}_created`;
}

function options(overrides: Partial<EngineMetricsOptions> = {}): EngineMetricsOptions {
  return {
    modelName: 'sim-model',
    engineIndex: 0,
    blockSize: 16,
    enablePrefixCaching: true,
    maxModelLen: 4096,
    kvCacheMetrics: false,
    compat: 'current',
    startTimeSeconds: 1_764_634_950.5,
    numGpuBlocks: 1024,
    ...overrides,
  };
}

const IDLE = { running: 0, waiting: 0, kvUsage: 0 };

function checkAgainstOracle(text: string, oracle: OracleEntry[]): void {
  const families = parseExposition(text);
  const expected: string[] = [];
  for (const entry of oracle) {
    expected.push(entry.name);
    const created = createdName(entry);
    if (created !== null) expected.push(created);
  }
  // Exactly these families, in vLLM's order (registration order; each `_created` right after its family).
  expect(families.map((f) => f.name)).toEqual(expected);
  for (const entry of oracle) {
    const f = family(families, entry.name);
    expect(f.type, entry.name).toBe(entry.type);
    expect(f.help, entry.name).toBe(entry.help);
    expect(f.samples.length, entry.name).toBeGreaterThan(0);
    for (const s of f.samples) {
      const want = s.name.endsWith('_bucket') ? [...entry.labels, 'le'].sort() : entry.labels;
      expect(Object.keys(s.labels).sort(), s.name).toEqual(want);
      if (entry.labels.includes('model_name')) expect(s.labels.model_name).toBe('sim-model');
      if (entry.labels.includes('engine')) expect(s.labels.engine).toBe('0');
    }
    const created = createdName(entry);
    if (created !== null) {
      const c = family(families, created);
      expect(c.type).toBe('gauge');
      expect(c.help).toBe(entry.help);
      for (const s of c.samples) {
        expect(Object.keys(s.labels).sort()).toEqual(entry.labels);
        expect(s.value).toBe(1_764_634_950.5);
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------------------------

describe('the exposition matches vLLM', () => {
  it("serves vLLM v1's families with their TYPE, HELP and label names ('current')", () => {
    checkAgainstOracle(new EngineMetrics(options()).render(IDLE), CURRENT_ORACLE);
  });

  it('adds the KV block residency histograms with kvCacheMetrics, after the request histograms', () => {
    const text = new EngineMetrics(options({ kvCacheMetrics: true })).render(IDLE);
    const withResidency = [...CURRENT_ORACLE.slice(0, -1), ...KV_RESIDENCY_ORACLE, CURRENT_ORACLE.at(-1)!];
    checkAgainstOracle(text, withResidency);
  });

  it("'old' serves the pre-rename names instead of today's, and 'current' the reverse", () => {
    const old = new EngineMetrics(options({ compat: 'old' })).render(IDLE);
    checkAgainstOracle(old, OLD_ORACLE);
    const current = new EngineMetrics(options()).render(IDLE);
    for (const [was, now] of [
      ['vllm:gpu_cache_usage_perc', 'vllm:kv_cache_usage_perc'],
      ['vllm:gpu_prefix_cache_queries_total', 'vllm:prefix_cache_queries_total'],
      ['vllm:gpu_prefix_cache_hits_total', 'vllm:prefix_cache_hits_total'],
      ['vllm:time_per_output_token_seconds', 'vllm:inter_token_latency_seconds'],
    ] as const) {
      expect(old).toContain(`# TYPE ${was} `);
      expect(old).not.toContain(`${now}`);
      expect(current).toContain(`# TYPE ${now} `);
      expect(current).not.toContain(`${was}`);
    }
  });

  it("lays a counter and a histogram out line for line as prometheus_client's generate_latest", () => {
    const m = new EngineMetrics(options({ maxModelLen: 10 }));
    m.addPromptTokens(12);
    m.observeFinished({
      finishedReason: 'stop', promptTokens: 3, generationTokens: 1, prefillKvComputedTokens: 3, queueSeconds: 0,
      prefillSeconds: 0, decodeSeconds: 0, inferenceSeconds: 0, e2eSeconds: 0,
    });
    const text = m.render(IDLE);
    const l = 'engine="0",model_name="sim-model"';
    expect(text).toContain([
      '# HELP vllm:prompt_tokens_total Number of prefill tokens processed.',
      '# TYPE vllm:prompt_tokens_total counter',
      `vllm:prompt_tokens_total{${l}} 12.0`,
      '# HELP vllm:prompt_tokens_created Number of prefill tokens processed.',
      '# TYPE vllm:prompt_tokens_created gauge',
      `vllm:prompt_tokens_created{${l}} 1.7646349505e+09`,
      '',
    ].join('\n'));
    expect(text).toContain([
      '# HELP vllm:request_prompt_tokens Number of prefill tokens processed.',
      '# TYPE vllm:request_prompt_tokens histogram',
      'vllm:request_prompt_tokens_bucket{engine="0",le="1.0",model_name="sim-model"} 0.0',
      'vllm:request_prompt_tokens_bucket{engine="0",le="2.0",model_name="sim-model"} 0.0',
      'vllm:request_prompt_tokens_bucket{engine="0",le="5.0",model_name="sim-model"} 1.0',
      'vllm:request_prompt_tokens_bucket{engine="0",le="10.0",model_name="sim-model"} 1.0',
      'vllm:request_prompt_tokens_bucket{engine="0",le="+Inf",model_name="sim-model"} 1.0',
      `vllm:request_prompt_tokens_count{${l}} 1.0`,
      `vllm:request_prompt_tokens_sum{${l}} 3.0`,
      '# HELP vllm:request_prompt_tokens_created Number of prefill tokens processed.',
      '# TYPE vllm:request_prompt_tokens_created gauge',
      `vllm:request_prompt_tokens_created{${l}} 1.7646349505e+09`,
      '',
    ].join('\n'));
    expect(text.startsWith('# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n' +
      '# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1.7646349505e+09\n')).toBe(true);
  });

  it('pre-creates request_success for every FinishReason at 0', () => {
    const families = parseExposition(new EngineMetrics(options()).render(IDLE));
    const reasons = family(families, 'vllm:request_success_total').samples.map((s) => [s.labels.finished_reason, s.raw]);
    expect(reasons).toEqual([['stop', '0.0'], ['length', '0.0'], ['abort', '0.0'], ['error', '0.0'], ['repetition', '0.0']]);
  });

  it("renders cache_config_info as vLLM's str() of each CacheConfig field, at 1.0", () => {
    const families = parseExposition(new EngineMetrics(options({ enablePrefixCaching: false, blockSize: 32 })).render(IDLE));
    const [sample] = family(families, 'vllm:cache_config_info').samples;
    expect(sample?.raw).toBe('1.0');
    expect(sample?.labels).toMatchObject({
      block_size: '32', enable_prefix_caching: 'False', num_gpu_blocks: '1024', gpu_memory_utilization: '0.9',
      cache_dtype: 'auto', sliding_window: 'None', engine: '0',
    });
    expect(sample?.labels).not.toHaveProperty('model_name');
  });

  it('spells numbers as prometheus_client does', () => {
    const cases: Array<[number, string]> = [
      [0, '0.0'], [1, '1.0'], [0.25, '0.25'], [2560, '2560.0'], [123456.7, '123456.7'], [1e-5, '1e-05'],
      [0.0001, '0.0001'], [1_000_000, '1e+06'], [1_234_567, '1.234567e+06'], [1_764_634_950.5, '1.7646349505e+09'],
      [12_345_678_901, '1.2345678901e+010'], [1e16, '1e+16'], [Infinity, '+Inf'], [0.30000000000000004, '0.30000000000000004'],
    ];
    for (const [x, want] of cases) expect(formatValue(x), String(x)).toBe(want);
    expect(pythonFloatRepr(1_000_000)).toBe('1000000.0');
    expect(pythonFloatRepr(1.5e-7)).toBe('1.5e-07');
    expect(pythonFloatRepr(-2)).toBe('-2.0');
  });

  it('builds the token-count buckets 1-2-5 up to max_model_len, as build_1_2_5_buckets', () => {
    const families = parseExposition(new EngineMetrics(options({ maxModelLen: 1_000_000 })).render(IDLE));
    const les = buckets(families, 'vllm:request_prompt_tokens').map(([le]) => le);
    expect(les.slice(0, 4)).toEqual(['1.0', '2.0', '5.0', '10.0']);
    expect(les.slice(-3)).toEqual(['500000.0', '1e+06', '+Inf']);
    expect(les).toHaveLength(19 + 1);
    for (const name of ['vllm:request_generation_tokens', 'vllm:request_prefill_kv_computed_tokens']) {
      expect(buckets(families, name).map(([le]) => le)).toEqual(les);
    }
  });

  it("uses vLLM's fixed bounds for the latency histograms", () => {
    const families = parseExposition(new EngineMetrics(options({ kvCacheMetrics: true })).render(IDLE));
    const les = (name: string): string[] => buckets(families, name).map(([le]) => le);
    expect(les('vllm:time_to_first_token_seconds')).toEqual(
      ['0.001', '0.005', '0.01', '0.02', '0.04', '0.06', '0.08', '0.1', '0.25', '0.5', '0.75', '1.0', '2.5', '5.0', '7.5',
        '10.0', '20.0', '40.0', '80.0', '160.0', '640.0', '2560.0', '+Inf']);
    const itl = ['0.01', '0.025', '0.05', '0.075', '0.1', '0.15', '0.2', '0.3', '0.4', '0.5', '0.75', '1.0', '2.5', '5.0',
      '7.5', '10.0', '20.0', '40.0', '80.0', '+Inf'];
    expect(les('vllm:inter_token_latency_seconds')).toEqual(itl);
    expect(les('vllm:request_time_per_output_token_seconds')).toEqual(itl);
    const latency = ['0.3', '0.5', '0.8', '1.0', '1.5', '2.0', '2.5', '5.0', '10.0', '15.0', '20.0', '30.0', '40.0',
      '50.0', '60.0', '120.0', '240.0', '480.0', '960.0', '1920.0', '7680.0', '+Inf'];
    for (const name of ['vllm:e2e_request_latency_seconds', 'vllm:request_queue_time_seconds',
      'vllm:request_inference_time_seconds', 'vllm:request_prefill_time_seconds', 'vllm:request_decode_time_seconds']) {
      expect(les(name), name).toEqual(latency);
    }
    const residency = ['0.001', '0.002', '0.005', '0.01', '0.02', '0.05', '0.1', '0.2', '0.5', '1.0', '2.0', '5.0',
      '10.0', '20.0', '30.0', '60.0', '120.0', '300.0', '600.0', '1200.0', '1800.0', '+Inf'];
    for (const name of ['vllm:kv_block_lifetime_seconds', 'vllm:kv_block_idle_before_evict_seconds', 'vllm:kv_block_reuse_gap_seconds']) {
      expect(les(name), name).toEqual(residency);
    }
  });

  it('passes promtool check metrics, but for the colon lint vLLM itself triggers', () => {
    if (spawnSync('which', ['promtool']).status !== 0) return;
    const m = new EngineMetrics(options({ kvCacheMetrics: true }));
    m.observeTtft(0.2);
    const run = spawnSync('promtool', ['check', 'metrics'], { input: m.render({ running: 2, waiting: 1, kvUsage: 0.5 }), encoding: 'utf8' });
    // 0: clean; 3: lint problems only (1 would be a parse error).
    expect([0, 3]).toContain(run.status);
    const problems = `${run.stdout}${run.stderr}`.split('\n').filter((line) => line.trim() !== '');
    expect(problems.length).toBeGreaterThan(0);
    for (const line of problems) expect(line).toMatch(/^vllm:\S+ metric names should not contain ':'$/);
  });
});

describe('values', () => {
  it('counts counters and gauges by value', () => {
    const m = new EngineMetrics(options());
    m.addPromptTokens(100);
    m.addPromptTokens(28);
    m.addGenerationTokens(7);
    m.addPrefixCache(128, 64);
    m.addPrefixCache(16, 0);
    m.addPreemptions(2);
    const f = parseExposition(m.render({ running: 3, waiting: 5, kvUsage: 0.375 }));
    expect(one(f, 'vllm:prompt_tokens_total')).toBe(128);
    expect(one(f, 'vllm:generation_tokens_total')).toBe(7);
    expect(one(f, 'vllm:prefix_cache_queries_total')).toBe(144);
    expect(one(f, 'vllm:prefix_cache_hits_total')).toBe(64);
    expect(one(f, 'vllm:num_preemptions_total')).toBe(2);
    expect(one(f, 'vllm:num_requests_running')).toBe(3);
    expect(one(f, 'vllm:num_requests_waiting')).toBe(5);
    expect(one(f, 'vllm:kv_cache_usage_perc')).toBe(0.375);
    expect(one(f, 'vllm:engine_sleep_state', { sleep_state: 'awake' })).toBe(1);
  });

  it('fills histogram buckets inclusively (le), with exact counts and sums', () => {
    const m = new EngineMetrics(options());
    for (const s of [0.001, 0.0015, 0.1, 0.1, 3000]) m.observeTtft(s);
    for (const s of [0.01, 0.02, 0.02]) m.observeItl(s);
    const f = parseExposition(m.render(IDLE));
    const ttft = new Map(buckets(f, 'vllm:time_to_first_token_seconds'));
    expect(ttft.get('0.001')).toBe(1);
    expect(ttft.get('0.005')).toBe(2);
    expect(ttft.get('0.08')).toBe(2);
    expect(ttft.get('0.1')).toBe(4);
    expect(ttft.get('2560.0')).toBe(4);
    expect(ttft.get('+Inf')).toBe(5);
    expect(one(f, 'vllm:time_to_first_token_seconds_count')).toBe(5);
    expect(one(f, 'vllm:time_to_first_token_seconds_sum')).toBeCloseTo(3000.2025, 9);
    const itl = new Map(buckets(f, 'vllm:inter_token_latency_seconds'));
    expect(itl.get('0.01')).toBe(1);
    expect(itl.get('0.025')).toBe(3);
    expect(one(f, 'vllm:inter_token_latency_seconds_count')).toBe(3);
    expect(one(f, 'vllm:inter_token_latency_seconds_sum')).toBeCloseTo(0.05, 12);
  });

  it('observes a finished request into request_success and every per-request histogram', () => {
    const m = new EngineMetrics(options());
    m.observeFinished({
      finishedReason: 'length', promptTokens: 300, generationTokens: 5, prefillKvComputedTokens: 44, queueSeconds: 0.4,
      prefillSeconds: 0.9, decodeSeconds: 0.2, inferenceSeconds: 1.1, e2eSeconds: 1.6,
    });
    m.observeFinished({
      finishedReason: 'abort', promptTokens: 1, generationTokens: 1, prefillKvComputedTokens: 1, queueSeconds: 9000,
      prefillSeconds: 0, decodeSeconds: 0, inferenceSeconds: 0, e2eSeconds: 9000,
    });
    const f = parseExposition(m.render(IDLE));
    expect(one(f, 'vllm:request_success_total', { finished_reason: 'length' })).toBe(1);
    expect(one(f, 'vllm:request_success_total', { finished_reason: 'abort' })).toBe(1);
    expect(one(f, 'vllm:request_success_total', { finished_reason: 'stop' })).toBe(0);
    const at = (name: string, le: string): number | undefined => new Map(buckets(f, name)).get(le);
    expect(at('vllm:request_prompt_tokens', '200.0')).toBe(1);
    expect(at('vllm:request_prompt_tokens', '500.0')).toBe(2);
    expect(one(f, 'vllm:request_prompt_tokens_sum')).toBe(301);
    expect(at('vllm:request_generation_tokens', '5.0')).toBe(2);
    expect(one(f, 'vllm:request_generation_tokens_sum')).toBe(6);
    expect(at('vllm:request_prefill_kv_computed_tokens', '1.0')).toBe(1);
    expect(at('vllm:request_prefill_kv_computed_tokens', '50.0')).toBe(2);
    expect(one(f, 'vllm:request_prefill_kv_computed_tokens_sum')).toBe(45);
    expect(at('vllm:request_queue_time_seconds', '0.5')).toBe(1);
    expect(at('vllm:request_queue_time_seconds', '7680.0')).toBe(1);
    expect(at('vllm:request_queue_time_seconds', '+Inf')).toBe(2);
    expect(one(f, 'vllm:request_queue_time_seconds_sum')).toBe(9000.4);
    expect(at('vllm:request_prefill_time_seconds', '0.3')).toBe(1);
    expect(at('vllm:request_prefill_time_seconds', '1.0')).toBe(2);
    expect(at('vllm:request_decode_time_seconds', '0.3')).toBe(2);
    expect(at('vllm:request_inference_time_seconds', '1.5')).toBe(2);
    expect(one(f, 'vllm:e2e_request_latency_seconds_sum')).toBe(9001.6);
    expect(one(f, 'vllm:e2e_request_latency_seconds_count')).toBe(2);
    // vLLM's mean TPOT: decode time over the tokens after the first (0.2 / 4), and 0 for a one-token answer.
    expect(at('vllm:request_time_per_output_token_seconds', '0.01')).toBe(1);
    expect(at('vllm:request_time_per_output_token_seconds', '0.05')).toBe(2);
    expect(one(f, 'vllm:request_time_per_output_token_seconds_sum')).toBeCloseTo(0.05, 12);
  });

  it('observes block residency only with kvCacheMetrics', () => {
    const event = { lifetimeSeconds: 12, idleSeconds: 0.004, reuseGapsSeconds: [0.5, 2, 2000] };
    const on = new EngineMetrics(options({ kvCacheMetrics: true }));
    on.observeBlockResidency(event);
    const f = parseExposition(on.render(IDLE));
    expect(new Map(buckets(f, 'vllm:kv_block_lifetime_seconds')).get('20.0')).toBe(1);
    expect(new Map(buckets(f, 'vllm:kv_block_lifetime_seconds')).get('10.0')).toBe(0);
    expect(new Map(buckets(f, 'vllm:kv_block_idle_before_evict_seconds')).get('0.005')).toBe(1);
    const gaps = new Map(buckets(f, 'vllm:kv_block_reuse_gap_seconds'));
    expect([gaps.get('0.5'), gaps.get('2.0'), gaps.get('1800.0'), gaps.get('+Inf')]).toEqual([1, 2, 2, 3]);
    expect(one(f, 'vllm:kv_block_reuse_gap_seconds_sum')).toBe(2002.5);
    const off = new EngineMetrics(options());
    off.observeBlockResidency(event);
    expect(off.render(IDLE)).not.toContain('kv_block_');
  });

  it('reset zeroes counters and histograms and moves process_start_time_seconds and every _created', () => {
    const m = new EngineMetrics(options({ kvCacheMetrics: true }));
    m.addPromptTokens(5);
    m.addGenerationTokens(5);
    m.addPrefixCache(5, 5);
    m.addPreemptions(1);
    m.observeTtft(1);
    m.observeItl(1);
    m.observeBlockResidency({ lifetimeSeconds: 1, idleSeconds: 1, reuseGapsSeconds: [1] });
    m.observeFinished({
      finishedReason: 'stop', promptTokens: 5, generationTokens: 5, prefillKvComputedTokens: 5, queueSeconds: 1,
      prefillSeconds: 1, decodeSeconds: 1, inferenceSeconds: 1, e2eSeconds: 1,
    });
    m.reset(1_800_000_000);
    const text = m.render(IDLE);
    const f = parseExposition(text);
    expect(one(f, 'process_start_time_seconds')).toBe(1_800_000_000);
    for (const fam of f) {
      if (fam.name.endsWith('_created')) {
        for (const s of fam.samples) expect(s.value, fam.name).toBe(1_800_000_000);
      } else if (fam.type === 'counter' || fam.type === 'histogram') {
        for (const s of fam.samples) expect(s.value, s.name).toBe(0);
      }
    }
    expect(m.startTimeSeconds).toBe(1_800_000_000);
  });

  it('rejects what prometheus_client rejects, and NaN, rather than serve an invalid scrape', () => {
    const m = new EngineMetrics(options());
    expect(() => m.addPromptTokens(-1)).toThrow(RangeError);
    expect(() => m.addGenerationTokens(NaN)).toThrow(RangeError);
    expect(() => m.addPrefixCache(1, 2)).toThrow(RangeError);
    expect(() => m.observeTtft(NaN)).toThrow(RangeError);
    expect(() => m.observeItl(Infinity)).toThrow(RangeError);
    expect(() => m.render({ running: 0, waiting: 0, kvUsage: NaN })).toThrow(RangeError);
    expect(() => m.observeFinished({
      finishedReason: 'nope' as 'stop', promptTokens: 1, generationTokens: 1, prefillKvComputedTokens: 1,
      queueSeconds: 0, prefillSeconds: 0, decodeSeconds: 0, inferenceSeconds: 0, e2eSeconds: 0,
    })).toThrow(RangeError);
    expect(m.render(IDLE)).not.toMatch(/NaN/);
  });
});

describe('several engines in one process', () => {
  it('merges every engine under one HELP/TYPE per family, with its own engine label', () => {
    const a = new EngineMetrics(options());
    const b = new EngineMetrics(options({ engineIndex: 1, startTimeSeconds: 1_764_634_999 }));
    a.addPromptTokens(10);
    b.addPromptTokens(20);
    const text = renderEngines([{ metrics: a, gauges: { running: 1, waiting: 0, kvUsage: 0.1 } }, { metrics: b, gauges: IDLE }]);
    const f = parseExposition(text);
    expect(text.match(/^# TYPE vllm:prompt_tokens_total /gm)).toHaveLength(1);
    expect(one(f, 'vllm:prompt_tokens_total', { engine: '0' })).toBe(10);
    expect(one(f, 'vllm:prompt_tokens_total', { engine: '1' })).toBe(20);
    // prometheus_client's child order: vLLM creates request_success children reason first, engine second.
    expect(family(f, 'vllm:request_success_total').samples.slice(0, 4).map((s) => [s.labels.finished_reason, s.labels.engine]))
      .toEqual([['stop', '0'], ['stop', '1'], ['length', '0'], ['length', '1']]);
    expect(family(f, 'vllm:request_success_total').samples).toHaveLength(10);
    const ttftEngines = family(f, 'vllm:time_to_first_token_seconds').samples.map((s) => s.labels.engine);
    expect(ttftEngines.indexOf('1')).toBe(ttftEngines.lastIndexOf('0') + 1);
    expect(family(f, 'vllm:cache_config_info').samples.map((s) => s.labels.engine)).toEqual(['0', '1']);
    expect(one(f, 'process_start_time_seconds')).toBe(1_764_634_950.5);
    expect(renderEngines([])).toBe('');
  });

  it('escapes label values as the text format requires', () => {
    const m = new EngineMetrics(options({ modelName: 'org/m "q"\\x' }));
    const f = parseExposition(m.render(IDLE));
    expect(family(f, 'vllm:num_requests_running').samples[0]?.labels.model_name).toBe('org/m "q"\\x');
  });
});
