/**
 * `server.helper_threads` (src/app/helper-threads.ts, docs/operations.md "Helper threads"): when `waybill serve`
 * lowers V8's and libuv's threads to nice 19, read back from the kernel (/proc/PID/task/TID/stat), never from what the
 * gateway says it did; and the pure decision of `auto`.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { getPriority, setPriority } from 'node:os';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { yieldHelperThreads } from '../src/app/helper-threads.js';
import type { ConfigInput } from '../src/config/schema.js';
import { helpersYield } from '../src/config/workers.js';
import { createSimulator, type Simulator } from '../src/sim/server.js';
import { serveRaw, type Line, type Served } from './helpers/served.js';
import { describeWithTool } from './helpers/system-tool.js';

describe('auto: yield when the serving processes have every core this process may run on', () => {
  it.each([
    // setting, workers, CPU affinity, yields
    ['auto', 1, 1, true],
    ['auto', 1, 2, false],
    ['auto', 2, 2, true],
    ['auto', 2, 4, false],
    ['auto', 4, 2, true],
    ['auto', 1, 64, false],
    ['yield', 1, 64, true],
    ['share', 1, 1, false],
    ['share', 8, 1, false],
  ] as const)('%s with %i worker(s) and an affinity of %i core(s): yields %s', (setting, workers, affinity, yields) => {
    expect(helpersYield(setting, workers, affinity)).toBe(yields);
  });

  it('lowers nothing elsewhere than Linux', () => {
    const calls: number[] = [];
    for (const platform of ['darwin', 'win32'] as const) expect(yieldHelperThreads({ platform, setPriority: (tid) => calls.push(tid) })).toBeUndefined();
    expect(calls).toEqual([]);
  });

  it.skipIf(process.platform !== 'linux')('on Linux: a thread that ended meanwhile is skipped, a refusal counted with its reason, the main thread never asked', () => {
    const asked: number[] = [];
    let call = 0;
    const result = yieldHelperThreads({
      setPriority: (tid) => {
        asked.push(tid);
        call++;
        // The real error for a thread that is gone: os.setPriority on an id no thread has.
        if (call === 1) setPriority(2 ** 30, 19);
        // A refusal as Node reports it (a SystemError with the errno's name in info.code).
        if (call === 2) throw Object.assign(new Error('A system error occurred: uv_os_setpriority returned EACCES (permission denied)'), { code: 'ERR_SYSTEM_ERROR', info: { code: 'EACCES' } });
      },
    });
    // This test process's own threads: V8's workers and libuv's pool at least, the main thread not among them.
    expect(asked.length).toBeGreaterThanOrEqual(4);
    expect(asked).not.toContain(process.pid);
    expect(result).toMatchObject({ lowered: asked.length - 2, refused: 1 });
    expect(result?.reason).toContain('EACCES');
  });
});

const THREADPOOL = 'libuv-worker';

/** Each thread of `pid`, by TID: its nice value and its name, from the kernel. */
function threadsOf(pid: number): Map<number, { nice: number; comm: string }> {
  const threads = new Map<number, { nice: number; comm: string }>();
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    let stat: string;
    try {
      stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8');
    } catch {
      continue; // the thread ended meanwhile
    }
    // Fields after "(comm)" start at field 3 (state); nice is field 19 (proc(5)).
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    threads.set(Number(tid), { nice: Number(fields[19 - 3]), comm: stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')')) });
  }
  return threads;
}

/**
 * The main thread of `pid` is unchanged, libuv's named threadpool too, and every other thread is at nice 19, as many
 * as `line` says were lowered.
 */
function expectLowered(pid: number, line: Line | undefined): void {
  const threads = threadsOf(pid);
  expect(threads.get(pid)?.nice).toBe(own);
  const helpers = [...threads].filter(([tid]) => tid !== pid).map(([, t]) => t);
  const pool = helpers.filter((t) => t.comm === THREADPOOL);
  const others = helpers.filter((t) => t.comm !== THREADPOOL);
  // V8's four platform workers at least (and, before libuv names them, its threadpool's four).
  expect(others.length).toBeGreaterThanOrEqual(4);
  expect(others.map((t) => t.nice)).toEqual(others.map(() => 19));
  expect(pool.map((t) => t.nice)).toEqual(pool.map(() => own));
  expect(line).toMatchObject({ pid, nice: 19, lowered: others.length, threadpool_kept: pool.length });
}

/** No thread of `pid` changed. */
function expectUnchanged(pid: number): void {
  const threads = threadsOf(pid);
  expect(threads.size).toBeGreaterThanOrEqual(5);
  expect([...threads.values()].map((t) => t.nice)).toEqual([...threads.values()].map(() => own));
}

/** `waybill serve` with `helper_threads` in front of `sim`, once `count` lines match `until`. */
async function serve(
  sim: string,
  helperThreads: 'auto' | 'yield' | 'share',
  options: { workers?: number; prefix?: readonly string[]; until: (line: Line) => boolean; count?: number },
): Promise<Served> {
  const config: ConfigInput = {
    server: { host: '127.0.0.1', port: 0, helper_threads: helperThreads },
    pools: [{ name: 'sim', models: ['sim-model'], upstreams: [{ name: 'sim-0', url: sim }] }],
    health: { interval: '1h' },
    shutdown: { grace: '0s', drain_timeout: '1s' },
  };
  const served = serveRaw(config, options.workers ?? 1, options.prefix);
  try {
    await Promise.race([
      served.until('the lines awaited', options.until, options.count),
      served.exited.then((code) => Promise.reject(new Error(`serve exited (${code}) first; lines:\n${served.lines.map((l) => JSON.stringify(l)).join('\n')}`))),
    ]);
  } catch (err) {
    await served.stop();
    throw err;
  }
  return served;
}

const listening = (line: Line) => line.msg === 'waybill listening';
const lowered = (line: Line) => typeof line.msg === 'string' && line.msg.startsWith('helper threads lowered');

// The threads' priority is read from the kernel; the child starts at this thread's nice value (fork copies it). At
// nice 19 already, lowering would change nothing a test could see.
const own = getPriority();
const linux = process.platform === 'linux';
if (linux && own >= 19) console.warn(`skipped: test/helper-threads.test.ts's serve tests need to run below nice 19 (they run at ${own})`);
const taskset = { command: 'taskset', install: 'Debian: apt-get install util-linux' };

/** The CPUs this process may run on, from /proc/self/status (`Cpus_allowed_list: 0-3,8`); [] elsewhere. */
function allowedCpus(): number[] {
  let list: string | undefined;
  try {
    list = /^Cpus_allowed_list:\s*(\S+)/m.exec(readFileSync('/proc/self/status', 'utf8'))?.[1];
  } catch {
    return [];
  }
  return (list ?? '').split(',').flatMap((range) => {
    const [from, to] = range.split('-').map(Number);
    if (from === undefined || !Number.isInteger(from)) return [];
    return Array.from({ length: (to ?? from) - from + 1 }, (_, i) => from + i);
  });
}
const [firstCpu, secondCpu] = allowedCpus();
const oneCpu = String(firstCpu);
const twoCpus = `${firstCpu},${secondCpu}`;

describe.skipIf(!linux || own >= 19)('waybill serve on Linux: the threads as the kernel sees them', () => {
  let sim: Simulator;
  let simUrl: string;
  beforeAll(async () => {
    sim = createSimulator({ ttftMs: 1, itlMs: 1, outputTokens: 2, jitter: 0 });
    simUrl = (await sim.listen(0, '127.0.0.1')).url;
  });
  afterAll(async () => {
    await sim.close();
  });

  it('yield: every thread but the main one (and a named threadpool) at nice 19, as many as the log line says', async () => {
    const served = await serve(simUrl, 'yield', { until: listening });
    try {
      const line = served.lines.find(lowered);
      expect(line, 'one line says what was done').toMatchObject({ helper_threads: 'yield' });
      expectLowered(served.child.pid as number, line);
    } finally {
      await served.stop();
    }
  });

  it('share: no thread changed, and no line about them', async () => {
    const served = await serve(simUrl, 'share', { until: listening });
    try {
      expectUnchanged(served.child.pid as number);
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
        expect(line.pid).not.toBe(served.child.pid);
        expectLowered(line.pid as number, line);
      }
      expectUnchanged(served.child.pid as number);
    } finally {
      await served.stop();
    }
  });

  describeWithTool(taskset, 'auto', () => {
    it.skipIf(firstCpu === undefined)('pinned to one core (taskset -c N), one serving process has every core: its helpers yield', async () => {
      const served = await serve(simUrl, 'auto', { prefix: ['taskset', '-c', oneCpu], until: listening });
      try {
        const line = served.lines.find(lowered);
        expect(line).toMatchObject({ helper_threads: 'auto' });
        expectLowered(served.child.pid as number, line);
      } finally {
        await served.stop();
      }
    });

    it.skipIf(secondCpu === undefined)('on two cores (taskset -c N,M), one worker leaves a core to its helpers: none lowered', async () => {
      const served = await serve(simUrl, 'auto', { prefix: ['taskset', '-c', twoCpus], until: listening });
      try {
        expectUnchanged(served.child.pid as number);
        expect(served.lines.some(lowered)).toBe(false);
      } finally {
        await served.stop();
      }
    });

    it.skipIf(secondCpu === undefined)('on two cores (taskset -c N,M), two workers have every core: both lower theirs', async () => {
      const served = await serve(simUrl, 'auto', { prefix: ['taskset', '-c', twoCpus], workers: 2, until: lowered, count: 2 });
      try {
        const lines = served.lines.filter(lowered);
        expect(lines.map((l) => l.worker).sort()).toEqual([0, 1]);
        for (const line of lines) expectLowered(line.pid as number, line);
        expectUnchanged(served.child.pid as number);
      } finally {
        await served.stop();
      }
    });
  });
});
