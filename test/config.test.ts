import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ConfigError, loadConfigFile, parseConfig } from '../src/config/load.js';
import { configSchema } from '../src/config/schema.js';

const minimal = { pools: [{ name: 'p', models: ['m'], upstreams: [{ url: 'http://127.0.0.1:9' }] }] };

function problemsOf(input: unknown): string[] {
  try {
    parseConfig(input, 'test');
  } catch (err) {
    if (err instanceof ConfigError) return [...err.problems];
    throw err;
  }
  return [];
}

/** Every key path of a parsed configuration: containers and leaves, arrays of objects as `key[]`. */
function keyPaths(value: unknown, prefix = ''): { all: string[]; leaves: string[] } {
  const all: string[] = [];
  const leaves: string[] = [];
  const visit = (node: unknown, path: string) => {
    if (Array.isArray(node) && node.length > 0 && typeof node[0] === 'object') {
      all.push(path);
      for (const [key, child] of Object.entries(node[0] as object)) visit(child, `${path}[].${key}`);
    } else if (node !== null && typeof node === 'object' && !Array.isArray(node) && Object.keys(node).length > 0) {
      if (path !== '') all.push(path);
      for (const [key, child] of Object.entries(node)) visit(child, path === '' ? key : `${path}.${key}`);
    } else {
      all.push(path);
      leaves.push(path);
    }
  };
  visit(value, prefix);
  return { all, leaves };
}

describe('configuration', () => {
  it('fills every default and resolves durations to milliseconds', () => {
    const config = parseConfig(minimal);
    expect(config.server).toEqual({
      host: '0.0.0.0',
      port: 8080,
      body_limit_bytes: 16 * 1024 * 1024,
      read_timeout: 30_000,
      headers_timeout: 10_000,
      max_header_bytes: 16 * 1024,
      workers: 'auto',
      helper_threads: 'auto',
      max_connections: 4096,
      max_json_depth: 128,
      max_choices: 128,
      max_upload_bytes: 26 * 1024 * 1024,
    });
    expect(config.responses).toEqual({ maxRememberedIds: 100_000, lookupTimeoutMs: 2000, maxLookupsPerTenant: 4, negativeCacheTtlMs: 1000, idSecret: undefined });
    expect(config.passthrough).toEqual([]);
    expect(config.timeouts).toEqual({ connectMs: 5000, firstOutputMs: 120_000, idleMs: 30_000, totalMs: 600_000 });
    expect(config.streaming).toEqual({
      maxEventBytes: 1048576,
      maxResponseBytes: 67108864,
      maxErrorBodyBytes: 65536,
      maxHeldEvents: 64,
      injectUsage: true,
      drainGraceMs: 1000,
      turnBudgetMs: 2,
    });
    expect(config.pools[0]?.upstreams[0]).toMatchObject({ name: '127.0.0.1:9', weight: 1 });
    expect(config.metrics.promptLenClasses).toEqual(['0-1k', '1k-4k', '4k-16k', '16k-64k', '64k+', 'unknown']);
    expect(Object.isFrozen(config.pools[0])).toBe(true);
  });

  it('reports schema and cross-field problems in one run (what the schema refused takes its default)', () => {
    const input = { ...minimal, timeouts: { idle: 'soon' }, bogus: 1, slo: { ttft_by_prompt_len: { huge: 1 }, models: { 'gpt-9': { ttft: 1 } } } };
    let problems: readonly string[] = [];
    try {
      parseConfig(input, 'test');
    } catch (error) {
      problems = (error as ConfigError).problems;
    }
    expect(problems).toEqual([
      expect.stringMatching(/^timeouts\.idle: invalid duration "soon"/),
      '(root): unknown key "bogus"',
      expect.stringMatching(/^slo\.ttft_by_prompt_len: unknown prompt_len class "huge"/),
      'slo.models.gpt-9: no pool serves model "gpt-9"',
    ]);
  });

  it('leaves out cross-field problems caused by removing a refused field, and never throws on odd input', () => {
    expect(problemsOf({ ...minimal, limits: { redis_url: 'http://nope', redis_password_env: 'FOO' } })).toEqual([expect.stringMatching(/^limits\.redis_url: /)]);
    expect(() => parseConfig({ ...minimal, timeouts: { idle: 'soon' }, hook: () => 1 })).toThrow(ConfigError);
  });

  it('accepts durations as seconds or with a unit', () => {
    const config = parseConfig({ ...minimal, timeouts: { connect: 0.5, idle: '250ms', total: '2m', first_output: '1h' } });
    expect(config.timeouts).toEqual({ connectMs: 500, idleMs: 250, totalMs: 120_000, firstOutputMs: 3_600_000 });
  });

  it('adds SLO thresholds to the histogram buckets', () => {
    const config = parseConfig({
      ...minimal,
      slo: { ttft: '1.5s', tpot: '33ms', e2e: 7, ttft_by_prompt_len: { '16k-64k': '9s' }, models: { m: { ttft: '750ms' } } },
    });
    expect(config.metrics.buckets.ttft).toEqual(expect.arrayContaining([0.75, 1.5, 9]));
    expect(config.metrics.buckets.tpot).toContain(0.033);
    expect(config.metrics.buckets.duration).toContain(7);
    expect(config.slo.models['m']).toEqual({ ttftMs: 750, tpotMs: 33, e2eMs: 7000, ttftByPromptLenMs: { '16k-64k': 9000 } });
    const sorted = [...config.metrics.buckets.ttft].sort((a, b) => a - b);
    expect(config.metrics.buckets.ttft).toEqual(sorted);
  });

  it('reports every problem at once, each naming its field', () => {
    const problems = problemsOf({
      server: { port: 70000, colour: 'blue' },
      pools: [
        { name: 'a', models: ['m'], upstreams: [{ url: 'ftp://x' }, { url: 'http://h:1', weight: -1 }] },
        { name: 'a', models: ['m'], upstreams: [] },
      ],
      timeouts: { idle: 'soon' },
      metrics: { buckets: { ttft: [1, 0.5] } },
      logging: { level: 'loud' },
    });
    expect(problems).toEqual(
      expect.arrayContaining([
        expect.stringMatching(/^server\.port: /),
        'server: unknown key "colour"',
        expect.stringMatching(/^pools\[0\]\.upstreams\[0\]\.url: must be an http\(s\) URL/),
        expect.stringMatching(/^pools\[0\]\.upstreams\[1\]\.weight: /),
        expect.stringMatching(/^pools\[1\]\.upstreams: /),
        expect.stringMatching(/^timeouts\.idle: invalid duration "soon"/),
        'metrics.buckets.ttft: must be strictly increasing',
        expect.stringMatching(/^logging\.level: /),
      ]),
    );
    expect(problems).toHaveLength(8);
  });

  it('resolves upstream API keys from the environment and names a missing variable', () => {
    const pools = (upstream: Record<string, unknown>) => ({ pools: [{ name: 'p', models: ['m'], upstreams: [{ url: 'http://h:1', ...upstream }] }] });
    expect(parseConfig(pools({ api_key_env: 'KEY_A' }), 'test', { KEY_A: 'secret' }).pools[0]?.upstreams[0]?.apiKey).toBe('secret');
    expect(() => parseConfig(pools({ api_key_env: 'KEY_B' }), 'test', {})).toThrow(/pools\[0\]\.upstreams\[0\]\.api_key_env: environment variable KEY_B is not set/);
    expect(() => parseConfig(pools({ api_key: 'a', api_key_env: 'KEY_A' }), 'test', { KEY_A: 'b' })).toThrow(/set api_key or api_key_env, not both/);
  });

  it('reports cross-field problems together', () => {
    const problems = problemsOf({
      pools: [
        { name: 'a', models: ['m'], upstreams: [{ url: 'http://h:1' }] },
        { name: 'a', models: ['m'], upstreams: [{ url: 'http://h:1' }] },
      ],
      slo: { ttft_by_prompt_len: { huge: 1 }, models: { nope: { ttft: 1 } } },
      health: { ejection_base: '10m', ejection_max: '1m' },
      retries: { backoff_base: 2, backoff_max: 1 },
    });
    expect(problems).toEqual([
      'pools[1].name: duplicate pool name "a"',
      'pools[1].models[0]: model "m" is already served by pool "a"',
      'pools[1].upstreams[0].name: duplicate upstream name "h:1" (also pools[0].upstreams[0]); set distinct names',
      'slo.ttft_by_prompt_len: unknown prompt_len class "huge" (one of 0-1k, 1k-4k, 4k-16k, 16k-64k, 64k+)',
      'health.ejection_base: must not exceed health.ejection_max',
      'retries.backoff_base: must not exceed retries.backoff_max',
      'slo.models.nope: no pool serves model "nope"',
    ]);
  });

  it('reads YAML files and reports YAML errors with the file name', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'waybill-config-'));
    const good = join(dir, 'good.yaml');
    writeFileSync(good, 'pools:\n  - name: p\n    upstreams:\n      - url: http://127.0.0.1:9\n');
    const config = await loadConfigFile(good);
    expect(config.pools[0]?.models).toBeUndefined();
    const bad = join(dir, 'bad.yaml');
    writeFileSync(bad, 'pools: [\n');
    await expect(loadConfigFile(bad)).rejects.toThrow(/invalid configuration in .*bad\.yaml/);
    await expect(loadConfigFile(join(dir, 'missing.yaml'))).rejects.toThrow(/cannot read file/);
  });

  it('accepts config.example.yaml', async () => {
    const config = await loadConfigFile(new URL('../config.example.yaml', import.meta.url).pathname, undefined, {});
    expect(config.pools[0]?.upstreams[1]?.apiKey).toBeUndefined();
    expect(config.pools[0]?.admission).toEqual({ maxInflight: 512, maxQueue: 64, queueTimeoutMs: 30_000 });
    expect(config.pools.map((p) => p.name)).toEqual(['llama', 'qwen']);
    expect(config.slo.models['llama-3.1-8b-instruct']?.tpotMs).toBe(50);
  });

  it('docs/configuration.md lists every key of the schema, and no other', () => {
    const doc = readFileSync(new URL('../docs/configuration.md', import.meta.url), 'utf8');
    const documented = [...doc.matchAll(/^\| `([^`]+)` \|/gm)].map((m) => m[1] ?? '');
    const parsed = configSchema.parse({
      server: { admin_port: 9090, admin_host: '127.0.0.1' },
      pools: [
        {
          name: 'p',
          models: ['m'],
          upstreams: [{ url: 'http://h:1', name: 'u', max_inflight: 1, api_key: 'k', api_key_env: 'K', revision: 'stable' }],
          admission: { max_inflight: 1 },
          routing: { session_header: 'x-session-id' },
        },
      ],
      tracing: { endpoint: 'http://collector:4318/v1/traces' },
      evaluation: { evaluator_header: 'x-waybill-evaluator' },
      limits: { redis_url: 'redis://r:6379', redis_password_env: 'P' },
      responses: { id_secret_env: 'S' },
      route_sharing: { redis_url: 'redis://r2:6379', redis_password_env: 'RP' },
    });
    const { all, leaves } = keyPaths(parsed);
    for (const leaf of leaves) expect(documented, `undocumented key ${leaf}`).toContain(leaf);
    for (const key of documented) expect(all, `documented key ${key} is not in the schema`).toContain(key);
  });
});
