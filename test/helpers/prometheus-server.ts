/**
 * A real Prometheus of a test's own (the end-to-end rule tests): started on a free port with the configuration given
 * (scrape configs, rule files), its storage in the test's directory, queried over its HTTP API, stopped after. Skips
 * are the caller's (describeWithTool(PROMETHEUS, …)).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { request } from 'undici';
import { stringify } from 'yaml';
import { freePort } from './ports.js';
import { PROMETHEUS } from './promql.js';

export interface Sample {
  metric: Record<string, string>;
  value: [number, string];
}

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls until `check` returns a value, or fails saying what it waited for (with `context()`, e.g. a server log). */
export async function waitFor<T>(what: string, ms: number, check: () => Promise<T | undefined>, context: () => string = () => ''): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await check().catch(() => undefined);
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}\n${context().slice(-2000)}`);
    await sleep(200);
  }
}

export class PrometheusServer {
  private output = '';

  private constructor(readonly base: string, private readonly child: ChildProcess) {
    child.stdout?.on('data', (chunk: Buffer) => (this.output += chunk.toString()));
    child.stderr?.on('data', (chunk: Buffer) => (this.output += chunk.toString()));
    child.on('exit', (code) => (this.output += `\nprometheus exited with ${String(code)}`));
  }

  /** Writes `config` (prometheus.yml's object) into `dir`, starts Prometheus and resolves once it is ready. */
  static async start(dir: string, config: unknown): Promise<PrometheusServer> {
    const configFile = join(dir, 'prometheus.yml');
    writeFileSync(configFile, stringify(config));
    const port = await freePort();
    const child = spawn(
      PROMETHEUS.command,
      [`--config.file=${configFile}`, `--storage.tsdb.path=${join(dir, 'data')}`, `--web.listen-address=127.0.0.1:${port}`, '--log.level=warn'],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    const server = new PrometheusServer(`http://127.0.0.1:${port}`, child);
    await server.waitFor('Prometheus to be ready', 20_000, async () => {
      const response = await request(`${server.base}/-/ready`);
      await response.body.dump();
      return response.statusCode === 200 ? true : undefined;
    });
    return server;
  }

  /** What Prometheus printed (warnings and errors). */
  get log(): string {
    return this.output;
  }

  waitFor<T>(what: string, ms: number, check: () => Promise<T | undefined>): Promise<T> {
    return waitFor(what, ms, check, () => this.output);
  }

  async query(expr: string): Promise<Sample[]> {
    const response = await request(`${this.base}/api/v1/query?query=${encodeURIComponent(expr)}`);
    const body = (await response.body.json()) as { status: string; data: { result: Sample[] } };
    if (body.status !== 'success') throw new Error(`query failed: ${expr}`);
    return body.data.result;
  }

  /** One series' value, undefined when there is none; more than one series is an error. */
  async scalar(expr: string): Promise<number | undefined> {
    const result = await this.query(expr);
    if (result.length > 1) throw new Error(`${expr}: ${result.length} series`);
    const value = result[0]?.value[1];
    return value === undefined ? undefined : Number(value);
  }

  /** The raw samples of a range selector (one series): [unix seconds, value]. */
  async range(selector: string): Promise<Array<[number, number]>> {
    const response = await request(`${this.base}/api/v1/query?query=${encodeURIComponent(selector)}`);
    const body = (await response.body.json()) as { status: string; data: { result: Array<{ values: Array<[number, string]> }> } };
    if (body.status !== 'success' || body.data.result.length !== 1) throw new Error(`range query failed: ${selector}`);
    return (body.data.result[0]?.values ?? []).map(([at, value]) => [at, Number(value)]);
  }

  /** SIGTERM, then SIGKILL after 5 s. */
  async stop(): Promise<void> {
    const child = this.child;
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = once(child, 'exit');
    child.kill('SIGTERM');
    await Promise.race([exited, sleep(5_000).then(() => child.kill('SIGKILL'))]);
  }
}
