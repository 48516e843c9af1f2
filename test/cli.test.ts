/**
 * The `waybill` command as operators run it: real processes from the built bin (npm test builds before vitest).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer, type AddressInfo, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { request } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';
import { FLAG_OF } from '../src/sim/main.js';
import { createSimulator } from '../src/sim/server.js';
import { ADMIN_HEADERS, ADMIN_KEY, adminKey, startStack } from './helpers/stack.js';

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
function start(args: string[], ready: RegExp, env: NodeJS.ProcessEnv = {}): { child: ChildProcess; line: Promise<string> } {
  const child = spawn(process.execPath, [BIN, ...args], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
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

/**
 * stderr without Node's process warnings (`(node:PID) [CODE] …` and its `(Use \`node --trace-warnings …\`)` line):
 * what Waybill itself wrote.
 */
function ownStderr(stderr: string): string[] {
  return stderr.split('\n').filter((line) => line !== '' && !/^\(node:\d+\) /.test(line) && !line.startsWith('(Use `node --trace-warnings'));
}

/** A port something else already listens on. */
async function busyPort(): Promise<{ port: number; server: Server }> {
  const server = createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return { port: (server.address() as AddressInfo).port, server };
}

function tempFile(name: string, text: string): string {
  const path = join(mkdtempSync(join(tmpdir(), 'waybill-cli-')), name);
  writeFileSync(path, text);
  return path;
}

const EXAMPLE = new URL('../config.example.yaml', import.meta.url).pathname;

describe('waybill --help and --version', () => {
  const OPTIONS: Record<string, readonly string[]> = {
    serve: ['--config', '--upstream', '--upstream-api-key-env', '--model', '--host', '--port'],
    sim: ['--port', '--host', ...Object.values(FLAG_OF)],
    demo: ['--port'],
    load: ['--url', '--concurrency', '--rate', '--requests', '--duration', '--reconcile'],
    'check-config': ['--skip-env'],
  };

  for (const [command, options] of Object.entries(OPTIONS)) {
    it(`waybill ${command} --help (and -h) names its options and shows an example, exit 0`, async () => {
      for (const flag of ['--help', '-h']) {
        const result = await run([command, flag]);
        expect(result.code).toBe(0);
        expect(result.stderr).toBe('');
        expect(result.stdout).toMatch(new RegExp(`^usage: waybill ${command} `));
        for (const option of options) expect(result.stdout).toContain(option);
        expect(result.stdout).toMatch(new RegExp(`\nexamples\n\\s+waybill ${command}\\b`));
      }
    });
  }

  it('waybill load compare --help (and -h) names its options and shows an example, exit 0', async () => {
    for (const flag of ['--help', '-h']) {
      const result = await run(['load', 'compare', flag]);
      expect(result.code).toBe(0);
      expect(result.stderr).toBe('');
      expect(result.stdout).toMatch(/^usage: waybill load compare /);
      for (const option of ['--threshold', '--points', '--json']) expect(result.stdout).toContain(option);
      expect(result.stdout).toMatch(/\nexamples\n\s+waybill load compare\b/);
    }
  });

  it('asking for help wins over other flags, and `waybill help CMD` is `waybill CMD --help`', async () => {
    const serve = await run(['serve', '--help']);
    expect(await run(['serve', '--colour', 'blue', '--help'])).toEqual(serve);
    expect(await run(['help', 'serve'])).toEqual(serve);
    // Not a file named --help.
    const check = await run(['check-config', '--help']);
    expect(check.code).toBe(0);
    expect(check.stdout).not.toContain('cannot read file');
  });

  it('waybill --help lists every command and how to get their help; no command is a usage error', async () => {
    for (const args of [['--help'], ['-h'], ['help']]) {
      const result = await run(args);
      expect(result.code).toBe(0);
      for (const command of Object.keys(OPTIONS)) expect(result.stdout).toMatch(new RegExp(`^  ${command} `, 'm'));
      expect(result.stdout).toContain('waybill <command> --help');
      expect(result.stdout).toContain('waybill --version');
      expect(result.stdout).toMatch(/\nexamples\n\s+waybill /);
    }
    const none = await run([]);
    expect(none.code).toBe(2);
    expect(none.stderr).toContain('usage: waybill <command>');
  });

  it('waybill --version (and -v) prints the package version', async () => {
    const { version } = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string };
    for (const flag of ['--version', '-v']) {
      const result = await run([flag], { WAYBILL_REVISION: undefined });
      expect(result.code).toBe(0);
      expect(result.stdout).toBe(`waybill ${version}\n`);
    }
    // The container build's revision, as waybill_build_info has it.
    expect((await run(['--version'], { WAYBILL_REVISION: 'abc1234' })).stdout).toBe(`waybill ${version} (revision abc1234)\n`);
  });
});

describe('a port that cannot be listened on', () => {
  const servers: Server[] = [];
  afterEach(async () => {
    await Promise.all(servers.splice(0).map((server) => new Promise((resolve) => server.close(resolve))));
  });

  /** Exit 2 with one line on stderr naming the address and the cause, no stack trace. */
  async function expectOneLine(args: string[], port: number, command: string, hint: string): Promise<void> {
    const result = await run(args);
    expect(result.code).toBe(2);
    const lines = ownStderr(result.stderr);
    expect(lines).toEqual([`waybill ${command}: cannot listen on 127.0.0.1:${port}: the port is already in use (EADDRINUSE); ${hint}`]);
    expect(result.stderr).not.toMatch(/^\s+at /m);
  }

  it('serve, demo and sim say so in one line and exit 2', async () => {
    const { port, server } = await busyPort();
    servers.push(server);
    await expectOneLine(['serve', '--upstream', 'http://127.0.0.1:1', '--host', '127.0.0.1', '--port', String(port)], port, 'serve', 'choose another with --port or server.port');
    await expectOneLine(['demo', '--port', String(port)], port, 'demo', 'choose another with --port');
    await expectOneLine(['sim', '--port', String(port)], port, 'sim', 'choose another with --port');
  });

  it("serve names the admin listener when server.admin_port is the busy one", async () => {
    const { port, server } = await busyPort();
    servers.push(server);
    const file = tempFile('admin.yaml', `server: { host: 127.0.0.1, port: 0, admin_port: ${port} }\npools: [{ name: p, upstreams: [{ url: "http://127.0.0.1:1" }] }]\n`);
    await expectOneLine(['serve', '--config', file], port, 'serve', 'choose another server.admin_port (the admin listener)');
  });
});

describe('waybill load against a target it cannot use', () => {
  /** Exit 2, one line on stderr, no stack trace. */
  function expectOneLine(result: { code: number | null; stderr: string }, line: RegExp): void {
    expect(result.code).toBe(2);
    const lines = ownStderr(result.stderr);
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(line);
    expect(result.stderr).not.toMatch(/^\s+at /m);
  }

  it('an unreachable --url: one line and exit 2, with or without --model', async () => {
    // Port 9 (discard): privileged, nothing listens there.
    expectOneLine(await run(['load', '--url', 'http://127.0.0.1:9', '--concurrency', '1', '--requests', '1']), /^waybill load: cannot reach http:\/\/127\.0\.0\.1:9: connect ECONNREFUSED 127\.0\.0\.1:9$/);
    expectOneLine(
      await run(['load', '--url', 'http://127.0.0.1:9', '--model', 'm', '--concurrency', '1', '--requests', '1', '--reconcile']),
      /^waybill load: cannot reach http:\/\/127\.0\.0\.1:9: connect ECONNREFUSED/,
    );
  });

  it('--reconcile against a gateway with client keys: a client key is refused in one line, an admin key reconciles', async () => {
    const sha256 = (key: string) => createHash('sha256').update(key).digest('hex');
    // startStack adds ADMIN_KEY (admin: true) for the first tenant.
    const stack = await startStack({ sims: 1, config: { auth: { keys: [{ tenant: 'team-a', key_sha256: sha256('sk-client') }] } } });
    try {
      const sim = stack.gateway.upstreams.upstreams[0]?.url.origin ?? '';
      expectOneLine(
        await run(['load', '--url', stack.base, '--api-key', 'sk-client', '--concurrency', '1', '--requests', '1', '--reconcile', '--sim', sim]),
        /^waybill load: --reconcile: .*\/metrics answered 403: the gateway has client keys; give --api-key a key with admin: true/,
      );
      const admin = await run(['load', '--url', stack.base, '--api-key', ADMIN_KEY, '--concurrency', '1', '--requests', '2', '--reconcile', '--sim', sim, '--quiet']);
      expect(admin.stdout).toMatch(/reconcil/i);
      expect(admin.code).toBe(0);
    } finally {
      await stack.close();
    }
  });

  it('an unreachable --sim: one line naming that URL, not --url, and exit 2', async () => {
    const stack = await startStack({ sims: 1 });
    try {
      expectOneLine(
        await run(['load', '--url', stack.base, '--concurrency', '1', '--requests', '1', '--reconcile', '--sim', 'http://127.0.0.1:9']),
        /^waybill load: --sim: cannot reach http:\/\/127\.0\.0\.1:9: /,
      );
    } finally {
      await stack.close();
    }
  });

  it('--reconcile against something that is not Waybill (the simulator itself): says so in one line, exit 2, before any load', async () => {
    const sim = createSimulator({ models: ['sim-model'] });
    const { url } = await sim.listen(0, '127.0.0.1');
    try {
      expectOneLine(
        await run(['load', '--url', url, '--concurrency', '1', '--requests', '1', '--reconcile', '--sim', url]),
        new RegExp(`^waybill load: --reconcile: ${url.replaceAll('.', '\\.')} is not a Waybill gateway \\(its /metrics has no waybill_\\* metrics\\)`),
      );
      expect(sim.stats().requests).toBe(0);
    } finally {
      await sim.close();
    }
  });
});

describe('waybill check-config', () => {
  it('accepts the shipped example as its header says, with no environment variable set', async () => {
    // The newcomer's command, word for word from the example's header.
    expect(readFileSync(EXAMPLE, 'utf8')).toContain('# Validate with: waybill check-config config.example.yaml\n');
    const result = await run(['check-config', EXAMPLE], { VLLM_API_KEY: undefined });
    expect(result.code).toBe(0);
    expect(result.stdout).toMatch(/^\S+config\.example\.yaml: OK — 2 pool\(s\), models: llama-3\.1-8b-instruct, \(discovered for pool qwen\)\n$/);
  });

  it('names a variable the file needs that is not set, and exits 2', async () => {
    const file = tempFile('key.yaml', 'pools: [{ name: p, models: [m], upstreams: [{ url: "http://127.0.0.1:1" }, { url: "http://127.0.0.1:9", api_key_env: VLLM_API_KEY }] }]\n');
    expect((await run(['check-config', file], { VLLM_API_KEY: 'k' })).code).toBe(0);
    const missing = await run(['check-config', file], { VLLM_API_KEY: '' });
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain('pools[0].upstreams[1].api_key_env: environment variable VLLM_API_KEY is not set');
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

  it('with --skip-env, passes the shipped example without its environment variables, and still checks the rest', async () => {
    expect((await run(['check-config', '--skip-env', EXAMPLE], { VLLM_API_KEY: undefined })).code).toBe(0);
    const needsKey = tempFile('key.yaml', 'pools: [{ name: p, models: [m], upstreams: [{ url: "http://127.0.0.1:9", api_key_env: VLLM_API_KEY }] }]\n');
    const result = await run(['check-config', '--skip-env', needsKey], { VLLM_API_KEY: undefined });
    expect(result.code).toBe(0);
    expect(result.stdout).toMatch(/OK — 1 pool\(s\), models: m; not read \(--skip-env\): VLLM_API_KEY\n$/);
    // The example's header says how.
    expect(readFileSync(EXAMPLE, 'utf8')).toContain('waybill check-config --skip-env FILE');

    const file = tempFile('env.yaml', 'server: { port: 80, admin_port: 80 }\npools: [{ name: p, upstreams: [{ url: "http://127.0.0.1:1", api_key_env: NOT_SET_ANYWHERE }] }]\nauth: { keys: [{ tenant: a, key_env: A_KEY }, { tenant: b, key_env: B_KEY }] }\n');
    const bad = await run(['check-config', '--skip-env', file]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('server.admin_port: must differ from server.port');
    // No environment problem, and distinct variables are not taken for the same key.
    expect(bad.stderr).not.toContain('environment variable');
    expect(bad.stderr).not.toContain('configured twice');
  });

  it('a file that cannot be read is a one-message error, exit 2, for check-config and serve', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'waybill-cli-'));
    for (const args of [
      ['check-config', join(dir, 'missing.yaml')],
      ['check-config', '--skip-env', join(dir, 'missing.yaml')],
      ['check-config', dir],
      ['serve', '--config', join(dir, 'missing.yaml')],
    ]) {
      const result = await run(args);
      expect(result.code).toBe(2);
      expect(result.stderr).toContain('cannot read file');
      expect(result.stderr).not.toMatch(/^\s+at /m);
    }
  });

  it('asks for exactly one FILE', async () => {
    for (const args of [['check-config'], ['check-config', 'a.yaml', 'b.yaml']]) {
      const result = await run(args);
      expect(result.code).toBe(2);
      expect(result.stderr).toContain('waybill check-config --help');
    }
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
      // One line says where everything is; without server.admin_port, on the API's port.
      expect(listening).toMatchObject({ metrics: `${listening.url}/metrics`, healthz: `${listening.url}/healthz`, readyz: `${listening.url}/readyz` });
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

  it('--upstream-api-key-env NAME: a vLLM behind --api-key, with no configuration file', async () => {
    const sim = createSimulator({ models: ['tiny'], ttftMs: 1, itlMs: 1, outputTokens: 3, apiKey: 'sk-vllm' });
    const { url } = await sim.listen(0, '127.0.0.1');
    try {
      const base = ['serve', '--upstream', url, '--upstream-api-key-env', 'WAYBILL_TEST_VLLM_KEY', '--host', '127.0.0.1', '--port', '0', '--workers', '1'];
      // Not set: one line naming the variable, exit 2.
      const unset = await run(base, { WAYBILL_TEST_VLLM_KEY: undefined });
      expect(unset.code).toBe(2);
      expect(unset.stderr).toContain('pools[0].upstreams[0].api_key_env: environment variable WAYBILL_TEST_VLLM_KEY is not set');
      const needsUpstream = await run(['serve', '--config', EXAMPLE, '--upstream-api-key-env', 'K']);
      expect(needsUpstream.code).toBe(2);
      expect(needsUpstream.stderr).toContain('--upstream-api-key-env: needs at least one --upstream');

      const { child, line } = start(base, /waybill listening/, { WAYBILL_TEST_VLLM_KEY: 'sk-vllm' });
      // Discovery (GET /v1/models, behind the key) found the model: the key went with it.
      const listening = JSON.parse(await line) as { url: string; models: string[] };
      expect(listening.models).toEqual(['tiny']);
      const completion = await request(`${listening.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }] }),
      });
      expect(completion.statusCode).toBe(200);
      await completion.body.dump();
      expect(sim.stats().recent.at(-1)?.headers.authorization).toBe('present');
      child.kill('SIGTERM');
      await once(child, 'exit');
    } finally {
      await sim.close();
    }
  });
});

describe('waybill serve: SIGHUP', () => {
  it('re-reads --config FILE on SIGHUP: a rotated key applies, an invalid file is rejected with its problems logged', async () => {
    const sim = createSimulator({ models: ['tiny'], ttftMs: 1, itlMs: 1, outputTokens: 3 });
    const { url } = await sim.listen(0, '127.0.0.1');
    const sha = (key: string) => createHash('sha256').update(key).digest('hex');
    const yaml = (key: string) =>
      `pools: [{ name: p, models: [tiny], upstreams: [{ url: "${url}" }] }]\nauth: { keys: [{ tenant: t, key_sha256: "${sha(key)}" }, { tenant: t, key_sha256: "${adminKey('t').key_sha256}", admin: true }] }\nshutdown: { grace: 0, drain_timeout: 1s }\n`;
    try {
      const file = tempFile('reload.yaml', yaml('old-key'));
      // One process, so the reload counter counts one reload (test/workers.test.ts reloads several workers).
      const { child, line } = start(['serve', '--config', file, '--host', '127.0.0.1', '--port', '0', '--workers', '1'], /waybill listening/);
      let stdout = '';
      child.stdout?.on('data', (d: Buffer) => (stdout += d.toString()));
      const { url: base } = JSON.parse(await line) as { url: string };
      const chat = async (key: string) => {
        const response = await request(`${base}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
          body: JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }] }),
        });
        await response.body.dump();
        return response.statusCode;
      };
      const metric = async (name: string) => {
        const text = await (await request(`${base}/metrics`, { headers: ADMIN_HEADERS })).body.text();
        return text.split('\n').find((l) => l.startsWith(name)) ?? '';
      };
      const eventually = async (check: () => Promise<boolean>) => {
        for (let i = 0; i < 200 && !(await check()); i++) await new Promise((resolve) => setTimeout(resolve, 25));
        expect(await check()).toBe(true);
      };
      expect(await chat('old-key')).toBe(200);
      expect(await chat('new-key')).toBe(401);

      writeFileSync(file, yaml('new-key'));
      child.kill('SIGHUP');
      await eventually(async () => (await chat('new-key')) === 200);
      expect(await chat('old-key')).toBe(401);
      expect(await metric('waybill_config_reloads_total{result="ok"}')).toMatch(/ 1$/);

      writeFileSync(file, 'pools: []\nretries: { backoff_base: 10s, backoff_max: 1s }\n');
      child.kill('SIGHUP');
      await eventually(async () => (await metric('waybill_config_reloads_total{result="invalid"}')).endsWith(' 1'));
      expect(stdout).toContain('configuration reload rejected');
      expect(stdout).toContain('pools');
      expect(await chat('new-key')).toBe(200);
      expect(child.exitCode).toBeNull();

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
  it('three faulty requests, as its text says, leave its one upstream serving and /readyz 200 (issue 22, item 16)', async () => {
    const { child, line } = start(['demo', '--port', '0'], /readyz stays 200/);
    const text = await line;
    const base = /http:\/\/127\.0\.0\.1:\d+/.exec(text)?.[0];
    expect(base).toBeDefined();
    for (let i = 0; i < 3; i++) {
      const faulty = await request(`${base}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-sim-fault': 'error_after=3' },
        body: JSON.stringify({ model: 'sim-model', stream: true, messages: [{ role: 'user', content: 'Hello' }] }),
      });
      await faulty.body.text();
    }
    const metrics = await (await request(`${base}/metrics`)).body.text();
    expect(metrics).toMatch(/^waybill_upstream_up\{upstream="sim-0"\} 1$/m);
    const ready = await request(`${base}/readyz`);
    expect(ready.statusCode).toBe(200);
    expect(await ready.body.json()).toMatchObject({ status: 'ready', pools: [{ upstreams: [{ name: 'sim-0', circuit: 'closed' }] }] });
    child.kill('SIGINT');
    const [code] = (await once(child, 'exit')) as [number | null];
    expect(code).toBe(0);
  });
});
