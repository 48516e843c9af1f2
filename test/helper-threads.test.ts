/**
 * `server.helper_threads` (src/app/helper-threads.ts, docs/operations.md "Helper threads"): when `waybill serve`
 * lowers V8's and libuv's threads to nice 19, read back from the kernel (/proc/PID/task/TID/stat), never from what the
 * gateway says it did; and the pure decision of `auto`.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { getPriority, tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { stringify } from 'yaml';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { yieldHelperThreads } from '../src/app/helper-threads.js';
import type { ConfigInput } from '../src/config/schema.js';
import { helpersYield } from '../src/config/workers.js';
import { createSimulator, type Simulator } from '../src/sim/server.js';
import { describeWithTool } from './helpers/system-tool.js';

const BIN = new URL('../bin/waybill.js', import.meta.url).pathname;

describe("auto: yield when the serving processes have every core", () => {
  it.each([
    // setting, workers, affinity, cgroup cpu.max, yields
    ['auto', 1, 1, undefined, true],
    ['auto', 1, 2, undefined, false],
    ['auto', 2, 2, undefined, true],
    ['auto', 2, 4, undefined, false],
    ['auto', 1, 64, '100000 100000', true],
    ['auto', 1, 64, '150000 100000', false],
    ['auto', 2, 64, '150000 100000', true],
    ['auto', 4, 2, 'max 100000', true],
    ['yield', 1, 64, undefined, true],
    ['share', 1, 1, undefined, false],
    ['share', 8, 1, '100000 100000', false],
  ] as const)('%s with %i worker(s), affinity %i, cpu.max %s: yields %s', (setting, workers, affinity, cpuMax, yields) => {
    expect(helpersYield(setting, workers, { availableParallelism: affinity, cgroupCpuMax: cpuMax })).toBe(yields);
  });

  it('names no thread where there is no /proc to name them by', () => {
    expect(yieldHelperThreads('darwin')).toBeUndefined();
    expect(yieldHelperThreads('win32')).toBeUndefined();
  });
});

interface Line {
  readonly msg?: string;
  readonly pid?: number;
  readonly lowered?: number;
  readonly worker?: number;
  readonly [key: string]: unknown;
}

/** The nice value of each thread of `pid`, by TID, from the kernel. */
function niceOfThreads(pid: number): Map<number, number> {
  const nice = new Map<number, number>();
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    let stat: string;
    try {
      stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8');
    } catch {
      continue; // the thread ended meanwhile
    }
    // Fields after "(comm)" start at field 3 (state); nice is field 19 (proc(5)).
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    nice.set(Number(tid), Number(fields[19 - 3]));
  }
  return nice;
}

/** `waybill serve` with `helper_threads`, until `count` lines match `until`; its lines kept. */
async function serve(
  sim: string,
  helperThreads: 'auto' | 'yield' | 'share',
  options: { workers?: number; prefix?: readonly string[]; until: (line: Line) => boolean; count?: number },
): Promise<{ child: ChildProcess; lines: Line[]; stop: () => Promise<void> }> {
  const dir = mkdtempSync(join(tmpdir(), 'waybill-helpers-'));
  const file = join(dir, 'waybill.yaml');
  const config: ConfigInput = {
    server: { host: '127.0.0.1', port: 0, helper_threads: helperThreads },
    pools: [{ name: 'sim', models: ['sim-model'], upstreams: [{ name: 'sim-0', url: sim }] }],
    health: { interval: '1h' },
    shutdown: { grace: '0s', drain_timeout: '1s' },
  };
  writeFileSync(file, stringify(config));
  const [command, ...args] = [...(options.prefix ?? []), process.execPath, BIN, 'serve', '--config', file, '--workers', String(options.workers ?? 1)];
  const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'inherit'] });
  const exited = once(child, 'exit');
  const lines: Line[] = [];
  const wanted = options.count ?? 1;
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`gave up after 20 s; lines:\n${lines.map((l) => JSON.stringify(l)).join('\n')}`)), 20_000);
    child.once('exit', (code) => reject(new Error(`serve exited (${code}) before listening; lines:\n${lines.map((l) => JSON.stringify(l)).join('\n')}`)));
    createInterface({ input: child.stdout as NodeJS.ReadableStream }).on('line', (text) => {
      let line: Line;
      try {
        line = JSON.parse(text) as Line;
      } catch {
        line = { msg: text };
      }
      lines.push(line);
      if (lines.filter(options.until).length >= wanted) {
        clearTimeout(timer);
        resolve();
      }
    });
  });
  return {
    child,
    lines,
    stop: async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      await exited;
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

const listening = (line: Line) => line.msg === 'waybill listening';
const lowered = (line: Line) => typeof line.msg === 'string' && line.msg.startsWith('helper threads lowered');

// The threads' priority is read from the kernel; the child starts at this thread's nice value (fork copies it).
const own = getPriority();

describe.skipIf(process.platform !== 'linux')('waybill serve on Linux: the threads as the kernel sees them', () => {
  let sim: Simulator;
  let simUrl: string;
  beforeAll(async () => {
    sim = createSimulator({ ttftMs: 1, itlMs: 1, outputTokens: 2, jitter: 0 });
    simUrl = (await sim.listen(0, '127.0.0.1')).url;
    // At nice 19 already, lowering changes nothing the test could see.
    expect(own, 'the tests run below nice 19').toBeLessThan(19);
  });
  afterAll(async () => {
    await sim.close();
  });

  it('yield: every thread but the main one at nice 19, as many as the log line says, the main one unchanged', async () => {
    const served = await serve(simUrl, 'yield', { until: listening });
    try {
      const pid = served.child.pid as number;
      const nice = niceOfThreads(pid);
      const line = served.lines.find(lowered);
      expect(line, 'one line says what was done').toMatchObject({ helper_threads: 'yield', pid, nice: 19 });
      expect(nice.get(pid)).toBe(own);
      const helpers = [...nice].filter(([tid]) => tid !== pid);
      // V8's four platform workers, its delayed-task thread and libuv's four threadpool threads at least.
      expect(helpers.length).toBeGreaterThanOrEqual(4);
      expect(helpers.filter(([, n]) => n === 19).length).toBe(line?.lowered);
      expect(helpers.every(([, n]) => n === 19)).toBe(true);
    } finally {
      await served.stop();
    }
  });

  it('share: no thread changed, and no line about them', async () => {
    const served = await serve(simUrl, 'share', { until: listening });
    try {
      const nice = niceOfThreads(served.child.pid as number);
      expect(nice.size).toBeGreaterThanOrEqual(5);
      expect([...nice.values()].every((n) => n === own)).toBe(true);
      expect(served.lines.some(lowered)).toBe(false);
    } finally {
      await served.stop();
    }
  });

  it('yield with two workers: each worker lowers its own helpers; the primary, which serves nothing, keeps its own', async () => {
    const served = await serve(simUrl, 'yield', { workers: 2, until: lowered, count: 2 });
    try {
      const lines = served.lines.filter(lowered);
      expect(lines.map((l) => l.worker).sort()).toEqual([0, 1]);
      for (const line of lines) {
        const pid = line.pid as number;
        expect(pid).not.toBe(served.child.pid);
        const nice = niceOfThreads(pid);
        expect(nice.get(pid)).toBe(own);
        expect([...nice].filter(([tid, n]) => tid !== pid && n === 19).length).toBe(line.lowered);
      }
      expect([...niceOfThreads(served.child.pid as number).values()].every((n) => n === own)).toBe(true);
    } finally {
      await served.stop();
    }
  });

  describeWithTool({ command: 'taskset', install: 'Debian: apt-get install util-linux' }, 'auto', () => {
    it('pinned to one core (taskset -c 0), one serving process has every core: its helpers yield', async () => {
      const served = await serve(simUrl, 'auto', { prefix: ['taskset', '-c', '0'], until: listening });
      try {
        const pid = served.child.pid as number;
        const nice = niceOfThreads(pid);
        expect(served.lines.find(lowered)).toMatchObject({ helper_threads: 'auto', pid });
        expect(nice.get(pid)).toBe(own);
        expect([...nice].filter(([tid]) => tid !== pid).every(([, n]) => n === 19)).toBe(true);
      } finally {
        await served.stop();
      }
    });
  });
});
