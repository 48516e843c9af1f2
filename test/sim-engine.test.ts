/**
 * The engine model through the simulator's HTTP surface (docs/simulator.md, "The engine model"): cached_tokens is the
 * prefix cache's real hit, seats and KV run out as vLLM's scheduler says, /metrics carries vLLM's series by value, a
 * restart empties the cache and the counters, other clients' load shows only in /metrics, and `waybill sim --engines`
 * runs a fleet. The core's rules are unit-tested in sim-engine-core.test.ts; here, that the simulator serves them.
 *
 * No timing margins: every assertion is on counts, reached by awaiting responses, request-end events or the engine's
 * own state, never by sleeping.
 */
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { request } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';
import type { Simulator } from '../src/sim/server.js';
import { useSimulators } from './helpers/simulators.js';

const start = useSimulators({ engineModel: true, promptTokensDetails: true, outputTokens: 4, jitter: 0 });
const BIN = new URL('../bin/waybill.js', import.meta.url).pathname;

/** 1 160 characters: 290 tokens, 18 full blocks of 16 tokens (64 characters each), and 8 tokens over. */
const SYSTEM = 'You are a helpful assistant. '.repeat(40);

interface Answer {
  readonly status: number;
  readonly text: string;
  readonly usage: { prompt_tokens: number; completion_tokens: number; prompt_tokens_details?: { cached_tokens: number } } | undefined;
}

async function chat(url: string, messages: unknown[], extra: Record<string, unknown> = {}): Promise<Answer> {
  const response = await request(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'sim-model', stream: true, stream_options: { include_usage: true }, messages, ...extra }),
  });
  const text = await response.body.text();
  const usageLine = text.split('\n').find((line) => line.includes('"usage"'));
  const usage = usageLine === undefined ? undefined : (JSON.parse(usageLine.slice('data: '.length)) as { usage: Answer['usage'] }).usage;
  return { status: response.statusCode, text, usage };
}

const ask = (question: string): unknown[] => [
  { role: 'system', content: SYSTEM },
  { role: 'user', content: question },
];

async function metrics(url: string): Promise<string> {
  const response = await request(`${url}/metrics`);
  return response.body.text();
}

/** The value of one vLLM series (labels as a substring match of the label block), or undefined. */
function series(text: string, name: string, labels = ''): number | undefined {
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    const block = line.startsWith(`${name}{`) ? line.slice(name.length, line.lastIndexOf('}') + 1) : '';
    if (!block.includes(labels)) continue;
    return Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return undefined;
}

/** Resolves when `check` holds, re-checked after each turn of the event loop (the engine steps on timers). */
async function until(sim: Simulator, check: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}: ${JSON.stringify(sim.engineSnapshot())}`);
    await new Promise((resolve) => setImmediate(resolve));
  }
}

describe('the prefix cache, through the API', () => {
  it('reports the real hit as cached_tokens: the shared system prompt’s full blocks, once they are cached', async () => {
    const { url } = await start();
    const first = await chat(url, ask('What is a KV cache?'));
    // 1 160 + 19 characters: ceil(1 179 / 4) = 295 tokens; nothing cached yet, so no details (vLLM omits a 0).
    expect(first.usage).toEqual({ prompt_tokens: 295, total_tokens: 299, completion_tokens: 4 });
    const second = await chat(url, ask('Why is TTFT long?'));
    // The system prompt's 18 full blocks (288 tokens) are cached; the question's block differs.
    expect(second.usage?.prompt_tokens_details).toEqual({ cached_tokens: 288 });
    const text = await metrics(url);
    expect(second.usage?.prompt_tokens).toBe(295);
    expect(series(text, 'vllm:prefix_cache_queries_total')).toBe(295 + 295);
    expect(series(text, 'vllm:prefix_cache_hits_total')).toBe(288);
    expect(series(text, 'vllm:prompt_tokens_total')).toBe(295 + 295);
    expect(series(text, 'vllm:request_prefill_kv_computed_tokens_sum')).toBe(295 + 295 - 288);
    expect(series(text, 'vllm:generation_tokens_total')).toBe(8);
    expect(series(text, 'vllm:request_success_total', 'finished_reason="stop"')).toBe(2);
    expect(series(text, 'vllm:kv_cache_usage_perc')).toBe(0);
  });

  it('keeps salted prefixes apart, and reports nothing without --prompt-tokens-details', async () => {
    const { url } = await start();
    await chat(url, ask('one'), { cache_salt: 'tenant-a' });
    const otherSalt = await chat(url, ask('two'), { cache_salt: 'tenant-b' });
    expect(otherSalt.usage?.prompt_tokens_details).toBeUndefined();
    const sameSalt = await chat(url, ask('six'), { cache_salt: 'tenant-a' });
    expect(sameSalt.usage?.prompt_tokens_details).toEqual({ cached_tokens: 288 });

    const plain = await start({ promptTokensDetails: false });
    await chat(plain.url, ask('one'));
    const again = await chat(plain.url, ask('two'));
    expect(again.usage?.prompt_tokens_details).toBeUndefined();
    expect(series(await metrics(plain.url), 'vllm:prefix_cache_hits_total')).toBe(288);
  });
});

describe('non-streaming requests and several choices, on the engine', () => {
  async function plain(url: string, body: Record<string, unknown>): Promise<{ status: number; json: { usage?: { prompt_tokens_details?: { cached_tokens: number } }; choices?: unknown[] } }> {
    const response = await request(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'sim-model', ...body }) });
    return { status: response.statusCode, json: (await response.body.json()) as { usage?: { prompt_tokens_details?: { cached_tokens: number } } } };
  }

  it('a non-stream answer waits for the engine and reports its real hit', async () => {
    const { sim, url } = await start();
    await plain(url, { messages: ask('first') });
    const second = await plain(url, { messages: ask('second') });
    expect(second.status).toBe(200);
    expect(second.json.usage?.prompt_tokens_details).toEqual({ cached_tokens: 288 });
    expect(sim.engineSnapshot()?.prefixHits).toBe(288);
  });

  it('a non-stream client that leaves frees its sequence in the engine at once', async () => {
    const { sim, url } = await start({ outputTokens: 100_000 });
    const controller = new AbortController();
    const pending = request(`${url}/v1/chat/completions`, { method: 'POST', signal: controller.signal, headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'sim-model', messages: ask('long') }) });
    await until(sim, () => sim.engineSnapshot()?.running === 1, 'the sequence running');
    const ended = new Promise((resolve) => sim.events.once('request-end', resolve));
    controller.abort();
    await pending.catch(() => undefined);
    expect(await ended).toMatchObject({ end: 'client_disconnect' });
    expect(sim.engineSnapshot()).toMatchObject({ running: 0, waiting: 0 });
    expect(series(await metrics(url), 'vllm:request_success_total', 'finished_reason="abort"')).toBe(1);
  });

  it('n choices of one prompt report that prompt’s hit once, as vLLM’s num_cached_tokens does', async () => {
    const { url } = await start();
    await chat(url, ask('warm'));
    const answer = await chat(url, ask('twice'), { n: 3 });
    expect(answer.usage?.prompt_tokens_details).toEqual({ cached_tokens: 288 });
  });

  it('refuses with a 400 a prompt whose answer would not fit the KV cache, and leaves nothing in the engine', async () => {
    // 64 blocks of 16: a 1 000-token prompt fits (63 blocks) but not with 32 tokens of answer (65).
    const { sim, url } = await start({ kvBlocks: 64, outputTokens: 32 });
    const prompt = (chars: number) => ({ model: 'sim-model', stream: false, max_tokens: 32, prompt: ['short', 'z'.repeat(chars)] });
    const response = await request(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(prompt(4000)) });
    expect(response.statusCode).toBe(400);
    expect(await response.body.json()).toMatchObject({ error: { param: 'input_tokens' } });
    expect(sim.engineSnapshot()).toMatchObject({ running: 0, waiting: 0 });
  });
});

describe('the scheduler, through the API', () => {
  it('queues what does not get a seat: num_requests_waiting counts them, and every stream still completes', async () => {
    const { sim, url } = await start({ maxNumSeqs: 2, outputTokens: 200 });
    const answers = Array.from({ length: 4 }, (_, i) => chat(url, [{ role: 'user', content: `question ${i}` }]));
    await until(sim, () => sim.engineSnapshot()?.running === 2 && sim.engineSnapshot()?.waiting === 2, 'two running and two waiting');
    const text = await metrics(url);
    expect(series(text, 'vllm:num_requests_running')).toBe(2);
    expect(series(text, 'vllm:num_requests_waiting')).toBe(2);
    for (const answer of await Promise.all(answers)) {
      expect(answer.status).toBe(200);
      expect(answer.text.endsWith('data: [DONE]\n\n')).toBe(true);
      expect(answer.usage?.completion_tokens).toBe(200);
    }
    expect(sim.engineSnapshot()).toMatchObject({ running: 0, waiting: 0 });
  });

  it('preempts under KV pressure and still delivers every answer whole', async () => {
    // 64 blocks of 16 tokens: each request needs 13 blocks of prompt (200 tokens) and grows by 19 more while it
    // decodes 300 tokens — four of them cannot all fit, so the newest running ones are preempted and recomputed.
    const { sim, url } = await start({ kvBlocks: 64, outputTokens: 300 });
    const prompt = (i: number): unknown[] => [{ role: 'user', content: `${String(i).padStart(4, '0')}${'x'.repeat(796)}` }];
    const answers = await Promise.all(Array.from({ length: 4 }, (_, i) => chat(url, prompt(i))));
    for (const answer of answers) {
      expect(answer.text.endsWith('data: [DONE]\n\n')).toBe(true);
      expect(answer.usage?.completion_tokens).toBe(300);
    }
    expect(sim.engineSnapshot()?.preemptions).toBeGreaterThan(0);
    expect(series(await metrics(url), 'vllm:num_preemptions_total')).toBe(sim.engineSnapshot()?.preemptions);
  });

  it('refuses a prompt that can never fit in the engine’s KV cache with a 400 naming input_tokens', async () => {
    const { url } = await start({ kvBlocks: 8 });
    const answer = await chat(url, [{ role: 'user', content: 'y'.repeat(4 * 16 * 8) }]);
    expect(answer.status).toBe(400);
    expect(JSON.parse(answer.text)).toMatchObject({ error: { param: 'input_tokens', code: 400 } });
  });
});

describe('restarts, other clients, revisions and compatibility', () => {
  it('a restart cuts what the engine runs, empties the cache and starts the counters again', async () => {
    const { sim, url } = await start({ outputTokens: 4 });
    await chat(url, ask('before'));
    const startedBefore = series(await metrics(url), 'process_start_time_seconds') ?? Number.NaN;
    // One long stream in flight when the restart comes.
    const cut = request(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sim-fault': 'tokens=100000' },
      body: JSON.stringify({ model: 'sim-model', stream: true, messages: [{ role: 'user', content: 'long' }] }),
    });
    await until(sim, () => sim.engineSnapshot()?.running === 1, 'the long stream running');
    const ended = new Promise((resolve) => sim.events.once('request-end', resolve));
    const restarted = await request(`${url}/sim/restart`, { method: 'POST' });
    expect(await restarted.body.json()).toEqual({ restarted: true });
    expect(await ended).toMatchObject({ end: 'fault' });
    await expect(cut.then((r) => r.body.text())).rejects.toThrow();

    const text = await metrics(url);
    expect(series(text, 'vllm:prefix_cache_queries_total')).toBe(0);
    expect(series(text, 'vllm:request_success_total', 'finished_reason="stop"')).toBe(0);
    expect(series(text, 'process_start_time_seconds')).toBeGreaterThanOrEqual(startedBefore);
    const after = await chat(url, ask('after'));
    expect(after.usage?.prompt_tokens_details).toBeUndefined();
  });

  it('other clients’ load shows in /metrics and not in /sim/stats', async () => {
    const { sim, url } = await start({ externalLoad: 200, externalPromptTokens: 64, externalOutputTokens: 2 });
    await until(sim, () => (sim.engineSnapshot()?.prefixQueries ?? 0) >= 64 * 3, 'three external requests');
    const text = await metrics(url);
    expect(series(text, 'vllm:prompt_tokens_total')).toBeGreaterThan(0);
    expect(sim.stats().requests).toBe(0);
  });

  it('/version reports the revision; metrics-compat old serves the pre-rename KV gauge instead', async () => {
    const { url } = await start({ revision: 'v0.11.1-canary', metricsCompat: 'old' });
    const version = await request(`${url}/version`);
    expect(await version.body.json()).toEqual({ version: 'v0.11.1-canary' });
    const text = await metrics(url);
    expect(series(text, 'vllm:gpu_cache_usage_perc')).toBe(0);
    expect(series(text, 'vllm:kv_cache_usage_perc')).toBeUndefined();
  });
});

describe('waybill sim --engines', () => {
  const children: Array<ReturnType<typeof spawn>> = [];
  afterEach(() => {
    for (const child of children.splice(0)) if (child.exitCode === null) child.kill('SIGKILL');
  });

  it('runs a fleet: one URL per engine, each its own engine with its own overrides', async () => {
    const child = spawn(process.execPath, [BIN, 'sim', '--port', '0', '--engines', '3', '--engine', '2:revision=canary,kv-blocks=64'], { stdio: ['ignore', 'pipe', 'pipe'] });
    children.push(child);
    const urls: string[] = [];
    const lines = createInterface({ input: child.stdout });
    for await (const line of lines) {
      const match = /^waybill sim engine (\d): simulated vLLM serving sim-model at (http:\/\/\S+)$/.exec(line);
      expect(match, line).not.toBeNull();
      urls.push(match?.[2] ?? '');
      if (urls.length === 3) break;
    }
    expect(new Set(urls).size).toBe(3);
    const versions = await Promise.all(urls.map(async (url) => ((await (await request(`${url}/version`)).body.json()) as { version: string }).version));
    expect(versions).toEqual(['waybill-sim', 'waybill-sim', 'canary']);
    // Engine 2's KV capacity is its own: cache_config_info says so.
    expect(await metrics(urls[2] ?? '')).toContain('num_gpu_blocks="64"');
    expect(await metrics(urls[0] ?? '')).toContain('num_gpu_blocks="8192"');
    // Each has its own cache: a prefix sent to engine 0 is not cached on engine 1.
    const [a = '', b = ''] = urls;
    await chat(a, ask('one'));
    expect((await chat(a, ask('two'))).usage?.prompt_tokens_details).toBeUndefined(); // the fleet's CLI default: no details
    const sims = await Promise.all([a, b].map(async (url) => series(await metrics(url), 'vllm:prefix_cache_hits_total')));
    await chat(b, ask('two'));
    expect(sims).toEqual([288, 0]);
  });

  it('refuses a bad override naming the engine and the key', async () => {
    const child = spawn(process.execPath, [BIN, 'sim', '--port', '0', '--engines', '2', '--engine', '1:kv-blocks=0'], { stdio: ['ignore', 'pipe', 'pipe'] });
    children.push(child);
    let stderr = '';
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    const code = await new Promise((resolve) => child.once('exit', resolve));
    expect(code).toBe(2);
    expect(stderr).toContain('--kv-blocks (engine 1)');
  });
});
