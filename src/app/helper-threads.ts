/**
 * `server.helper_threads` (docs/operations.md, "Helper threads"): the serving thread's helpers at the lowest
 * priority, so they run in its idle time instead of taking its core from it.
 *
 * Besides the thread that serves, a Node.js process has V8's platform workers (concurrent marking and sweeping,
 * parallel scavenges, optimizing compilation), libuv's threadpool (DNS lookups, file reads) and a few more. Where the
 * process has one core (`taskset`, a container limited to one CPU) or every core serves, they can run only by taking
 * a core from a serving thread, and the kernel gives them a fair share: measured, the serving thread then stopped for
 * 18–36 ms before each mark-compact, and every one of the slowest 2% of first tokens at 256 streams waited through
 * such a stop (docs/performance.md, "Helper threads"). At nice 19 they still run whenever the core is idle, and the
 * serving thread does the work itself when it must wait for it (V8 joins the job on the main thread).
 *
 * Linux applies `setpriority(PRIO_PROCESS, tid)` to one thread, so each thread in `/proc/self/task` other than the
 * main one is lowered; threads started later take the main thread's priority. Elsewhere nothing is done.
 */
import { readdirSync } from 'node:fs';
import { setPriority } from 'node:os';

/** The nice value helper threads get: the lowest priority. */
export const HELPER_NICE = 19;

export interface HelperThreadsResult {
  /** Threads lowered to nice 19. */
  readonly lowered: number;
  /** Threads that could not be lowered (gone meanwhile, or refused), with the first reason. */
  readonly failed: number;
  readonly reason?: string;
}

/**
 * Lowers every thread of this process but the main one to nice 19; undefined where threads cannot be named
 * (not Linux, or no /proc).
 * @example
 * const result = yieldHelperThreads();
 * if (result !== undefined) log.info({ helper_threads: result.lowered }, 'helper threads yield to the serving thread');
 */
export function yieldHelperThreads(platform: NodeJS.Platform = process.platform): HelperThreadsResult | undefined {
  if (platform !== 'linux') return undefined;
  let tids: string[];
  try {
    tids = readdirSync('/proc/self/task');
  } catch {
    return undefined;
  }
  let lowered = 0;
  let failed = 0;
  let reason: string | undefined;
  for (const name of tids) {
    const tid = Number(name);
    if (!Number.isInteger(tid) || tid <= 0 || tid === process.pid) continue;
    try {
      setPriority(tid, HELPER_NICE);
      lowered++;
    } catch (err) {
      failed++;
      reason ??= err instanceof Error ? err.message : String(err);
    }
  }
  return reason === undefined ? { lowered, failed } : { lowered, failed, reason };
}
