/**
 * The `waybill` command as operators run it: real processes from the built bin (npm test builds before vitest).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { request } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';
import { createSimulator } from '../src/sim/server.js';

const BIN = new URL('../bin/waybill.js', import.meta.url).pathname;
const children: ChildProcess[] = [];

afterEach(() => {
  for (const child of children.splice(0)) if (child.exitCode === null) child.kill('SIGKILL');
});

function run(args: string[], env: NodeJS.ProcessEnv = {}): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, [BIN, ...args], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
  children.push(child);
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return once(child, 'exit').then(([code]) => ({ code: code as number | null, stdout, stderr }));
}

/** Starts a long-running command and resolves with the first stdout line matching `ready`. */
function start(args: string[], ready: RegExp): { child: ChildProcess; line: Promise<string> } {
  const child = spawn(process.execPath, [BIN, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream });
  const line = new Promise<string>((resolve, reject) => {
    lines.on('line', (l) => {
      if (ready.test(l)) resolve(l);
    });
    child.once('exit', (code) => reject(new Error(`exited with ${code} before ready`)));
  });
  return { child, line };
}

function tempFile(name: string, text: string): string {
  const path = join(mkdtempSync(join(tmpdir(), 'waybill-cli-')), name);
  writeFileSync(path, text);
  return path;
}

describe('waybill check-config', () => {
  it('accepts a valid file', async () => {
    const example = new URL('../config.example.yaml', import.meta.url).pathname;
    const result = await run(['check-config', example], { VLLM_API_KEY: 'k' });
    expect(result.code).toBe(0);
    // The example names an API key variable; without it the check fails and says which.
    const missing = await run(['check-config', example], { VLLM_API_KEY: '' });
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain('pools[0].upstreams[1].api_key_env: environment variable VLLM_API_KEY is not set');
    expect(result.stdout).toMatch(/OK — 2 pool\(s\), models: llama-3\.1-8b-instruct, \(discovered for pool qwen\)/);
  });

  it('reports every problem at once, naming each field, and exits 2', async () => {
    const file = tempFile('bad.yaml', 'server: { port: -1 }\npools:\n  - name: p\n    upstreams: [{ url: "nope" }]\ntimeouts: { idle: soon }\n');
    const result = await run(['check-config', file]);
    expect(result.code).toBe(2);
    expect(result.stderr).toContain(`invalid configuration in ${file}:`);
    expect(result.stderr).toContain('  - server.port: ');
    expect(result.stderr).toContain('  - pools[0].upstreams[0].url: must be an http(s) URL');
    expect(result.stderr).toContain('  - timeouts.idle: invalid duration "soon"');
  });
});

describe('waybill serve', () => {
  it('refuses bad flags with a message naming them', async () => {
    const noUpstream = await run(['serve']);
    expect(noUpstream.code).toBe(2);
    expect(noUpstream.stderr).toContain('give --config FILE or at least one --upstream URL');
    const badPort = await run(['serve', '--upstream', 'http://127.0.0.1:1', '--port', 'eighty']);
    expect(badPort.code).toBe(2);
    expect(badPort.stderr).toContain('--port: "eighty" is not a port number');
    const unknown = await run(['serve', '--colour', 'blue']);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toMatch(/Unknown option '--colour'/);
  });

  it('serves a discovered model from --upstream, exports process metrics, and exits 0 on SIGTERM', async () => {
    const sim = createSimulator({ models: ['tiny'], ttftMs: 1, itlMs: 1, outputTokens: 3 });
    const { url } = await sim.listen(0, '127.0.0.1');
    try {
      // The file sets a short shutdown; --upstream replaces its pools.
      const file = tempFile('serve.yaml', 'pools: [{ name: p, upstreams: [{ url: "http://127.0.0.1:1" }] }]\nshutdown: { grace: 0, drain_timeout: 1s }\n');
      const { child, line } = start(['serve', '--config', file, '--upstream', url, '--host', '127.0.0.1', '--port', '0'], /waybill listening/);
      const listening = JSON.parse(await line) as { url: string; models: string[] };
      expect(listening.models).toEqual(['tiny']);
      const ready = await request(`${listening.url}/readyz`);
      expect(ready.statusCode).toBe(200);
      await ready.body.dump();
      const completion = await request(`${listening.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'tiny', stream: true, messages: [{ role: 'user', content: 'hi' }] }),
      });
      expect((await completion.body.text()).endsWith('data: [DONE]\n\n')).toBe(true);
      const metrics = await (await request(`${listening.url}/metrics`)).body.text();
      expect(metrics).toContain('waybill_requests_total{model="tiny",tenant="_anonymous",route="chat_completions",stream="true",code="200",outcome="delivered"} 1');
      expect(metrics).toMatch(/^nodejs_eventloop_lag_seconds \d/m);
      expect(metrics).toMatch(/^process_cpu_seconds_total \d/m);
      child.kill('SIGTERM');
      const [code] = (await once(child, 'exit')) as [number | null];
      expect(code).toBe(0);
    } finally {
      await sim.close();
    }
  });
});

describe('waybill demo', () => {
  it('starts the simulator and a gateway, and prints a curl that works', async () => {
    const { child, line } = start(['demo', '--port', '0'], /^\s+curl -N http/);
    const curl = await line;
    const base = /http:\/\/127\.0\.0\.1:\d+/.exec(curl)?.[0];
    expect(base).toBeDefined();
    const response = await request(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'sim-model', stream: true, messages: [{ role: 'user', content: 'Hello' }] }),
    });
    expect((await response.body.text()).endsWith('data: [DONE]\n\n')).toBe(true);
    child.kill('SIGINT');
    const [code] = (await once(child, 'exit')) as [number | null];
    expect(code).toBe(0);
  });
});
