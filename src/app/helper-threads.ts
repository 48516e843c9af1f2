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
 * `libuv-worker`; before that (Node 20) every thread is named `node`, and the pool is lowered too. Threads started
 * later take the priority of the thread that starts them. Elsewhere than Linux nothing is done.
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

/**
 * Lowers every thread of this process but the main one and libuv's named threadpool to nice 19; undefined where
 * threads cannot be named (not Linux, or no /proc).
 * @example
 * const result = yieldHelperThreads();
 * if (result !== undefined) log.info({ lowered: result.lowered }, 'helper threads lowered to nice 19');
 */
export function yieldHelperThreads(platform: NodeJS.Platform = process.platform): HelperThreadsResult | undefined {
  if (platform !== 'linux') return undefined;
  let tids: string[];
  let main: number;
  try {
    tids = readdirSync('/proc/self/task');
    // This thread's id as /proc numbers it ("PID/task/TID"), which is not process.pid when /proc belongs to another
    // PID namespace.
    main = Number(readlinkSync('/proc/thread-self').split('/').pop());
  } catch {
    return undefined;
  }
  let lowered = 0;
  let threadpool = 0;
  let refused = 0;
  let reason: string | undefined;
  for (const name of tids) {
    const tid = Number(name);
    if (!Number.isInteger(tid) || tid <= 0 || tid === main) continue;
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
      setPriority(tid, HELPER_NICE);
      lowered++;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ESRCH') continue; // ended meanwhile
      refused++;
      reason ??= err instanceof Error ? err.message : String(err);
    }
  }
  return { lowered, threadpool, refused, ...(reason !== undefined && { reason }) };
}
