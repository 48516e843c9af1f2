/**
 * The README's reconciliation out of the box: a plain `waybill serve --upstream SIM --workers 2` (the built CLI, no
 * configuration file: default health checks every 5 s, model discovery) in front of a simulator, and
 * `waybill load --reconcile --sim SIM` against it. The gateway's own reads of the simulator — health checks,
 * discovery — happen during the run and must not count as attempts: the simulator counts them apart
 * (SimStats.operational), so the reconciliation finds zero mismatches.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { parseLoadArgs, runLoadWith } from '../load/main.js';
import { createSimulator, type Simulator } from '../src/sim/server.js';

const BIN = new URL('../bin/waybill.js', import.meta.url).pathname;

let sim: Simulator;
let simUrl: string;
let child: ChildProcess;
let base: string;

beforeAll(async () => {
  sim = createSimulator({ ttftMs: 10, itlMs: 2, outputTokens: 32, jitter: 0.2, seed: 3 });
  simUrl = (await sim.listen(0, '127.0.0.1')).url;
  child = spawn(process.execPath, [BIN, 'serve', '--upstream', simUrl, '--workers', '2', '--host', '127.0.0.1', '--port', '0'], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream });
  base = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('waybill serve did not say it was listening within 20 s')), 20_000);
    lines.on('line', (line) => {
      if (!line.includes('"waybill listening"')) return;
      clearTimeout(timer);
      resolve((JSON.parse(line) as { url: string }).url);
    });
    child.once('exit', (code) => reject(new Error(`waybill serve exited with ${code} before listening`)));
  });
}, 30_000);

afterAll(async () => {
  if (child.exitCode === null && child.signalCode === null) {
    child.kill('SIGTERM');
    await once(child, 'exit');
  }
  await sim.close();
});

it('reconciles with zero mismatches across health checks and discovery, default settings, two workers', async () => {
  const before = sim.stats().operational;
  const args = [
    '--url', base,
    '--concurrency', '4',
    // Longer than the default health interval (5 s): each worker checks the simulator during the run.
    '--duration', '7s',
    '--seed', '5',
    '--prompt-tokens', '16-200',
    '--output-tokens', '8-24',
    '--reconcile',
    '--sim', simUrl,
    '--quiet',
  ];
  const config = await parseLoadArgs(args);
  if ('problems' in config) throw new Error(config.problems.join('\n'));
  const lines: string[] = [];
  const outcome = await runLoadWith(config, (text) => lines.push(text));
  const report = lines.join('\n');
  expect(outcome.mismatches, report).toBe(0);
  expect(report).toContain('reconciliation: 0 mismatches');
  expect(outcome.exitCode).toBe(0);
  // Not vacuous: the gateway did read the simulator for itself while the load ran.
  const after = sim.stats().operational;
  expect(after['/health'] - before['/health'], 'health checks during the run').toBeGreaterThanOrEqual(1);
}, 60_000);
