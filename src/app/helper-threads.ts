/**
 * `server.helper_threads` (docs/operations.md, "Helper threads"): the serving thread's helpers at the lowest
 * priority, so they run in its idle time instead of taking its core from it.
 *
 * Besides the thread that serves, a Node.js process has V8's platform workers (concurrent marking and sweeping,
 * parallel scavenges, optimizing compilation) and libuv's threadpool (file writes such as the request log's, DNS
 * lookups). Where the process has one core (`taskset`, a cpuset) or every core serves, V8's workers can run only by
 * taking a core from a serving thread, and the kernel gives them a fair share of it: measured, the serving thread
 * then stopped for 18–36 ms before each mark-compact, and every one of the slowest 2% of first tokens at 256 streams
 * waited through such a stop (docs/performance.md, "Helper threads"). At nice 19 they still run whenever the core is
 * idle.
 *
 * Linux applies `setpriority(PRIO_PROCESS, tid)` to one thread, so each thread in `/proc/self/task` but the main one
 * is lowered. libuv's threadpool is left alone where it can be told apart: libuv 1.50 and later name its threads
 * `libuv-worker`; before that (Node 20, early Node 22) every thread is named `node`, and the pool is lowered too.
 * Threads started later take the priority of the thread that starts them. Elsewhere than Linux nothing is done.
 */
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { setPriority } from 'node:os';

/** The nice value helper threads get: the lowest priority. */
export const HELPER_NICE = 19;

/** libuv's name for its threadpool's threads (libuv 1.50 and later). */
const THREADPOOL_NAME = 'libuv-worker';

export interface HelperThreadsResult {
  /** Threads lowered to nice 19. */
  readonly lowered: number;
  /** libuv threadpool threads, named so and left at their priority. */
  readonly threadpool: number;
  /** Threads the kernel refused to lower, with the first reason (a thread that ended meanwhile is not counted). */
  readonly refused: number;
  readonly reason?: string;
}

/** Where the threads are and how one is lowered; the process's own, except in tests. */
export interface HelperThreadsHost {
  readonly platform?: NodeJS.Platform;
  readonly setPriority?: (tid: number, priority: number) => void;
}

/**
 * Lowers every thread of this process but the main one and libuv's named threadpool to nice 19; undefined where
 * threads cannot be named: not Linux, no /proc, or a /proc of another PID namespace (its thread ids are not the ones
 * `setpriority` takes here).
 * @example
 * const result = yieldHelperThreads();
 * if (result !== undefined) log.info({ lowered: result.lowered }, 'helper threads lowered to nice 19');
 */
export function yieldHelperThreads(host: HelperThreadsHost = {}): HelperThreadsResult | undefined {
  if ((host.platform ?? process.platform) !== 'linux') return undefined;
  const set = host.setPriority ?? setPriority;
  let tids: string[];
  try {
    if (readlinkSync('/proc/self') !== String(process.pid)) return undefined;
    tids = readdirSync('/proc/self/task');
  } catch {
    return undefined;
  }
  let lowered = 0;
  let threadpool = 0;
  let refused = 0;
  let reason: string | undefined;
  for (const name of tids) {
    const tid = Number(name);
    // The main thread's id is the process's.
    if (!Number.isInteger(tid) || tid <= 0 || tid === process.pid) continue;
    let comm: string;
    try {
      comm = readFileSync(`/proc/self/task/${name}/comm`, 'utf8').trim();
    } catch {
      continue; // ended meanwhile
    }
    if (comm === THREADPOOL_NAME) {
      threadpool++;
      continue;
    }
    try {
      set(tid, HELPER_NICE);
      lowered++;
    } catch (err) {
      // os.setPriority throws a SystemError: code ERR_SYSTEM_ERROR, the errno's name in info.code.
      if ((err as { info?: { code?: unknown } }).info?.code === 'ESRCH') continue; // ended meanwhile
      refused++;
      reason ??= err instanceof Error ? err.message : String(err);
    }
  }
  return { lowered, threadpool, refused, ...(reason !== undefined && { reason }) };
}
