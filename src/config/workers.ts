/**
 * How many worker processes `waybill serve` runs, and what each one's share of the configuration is
 * (docs/operations.md, "Workers"). Pure: the machine's facts are passed in.
 *
 * - **How many.** `server.workers: auto` is the cores this process may use: the smaller of its CPU affinity
 *   (`os.availableParallelism()`) and its cgroup v2 quota (`cpu.max`, rounded up): a container limited to 2 CPUs on a
 *   64-core node runs 2 workers, not 64.
 * - **Shares of per-process limits.** A limit that each gateway process enforces on its own — a pool's
 *   `admission.max_inflight` and `max_queue`, an upstream's `max_inflight` — is split between the workers so that
 *   together they never exceed it: worker i of n gets ⌊total / n⌋, plus one for the first `total mod n` workers, and
 *   never less than 1 (a limit smaller than the number of workers is then exceeded by at most n − limit; the
 *   start-up log says so). The tenants' limits are not split: the workers share one count (in the primary, or in
 *   Redis).
 */
import type { Config } from './load.js';

/** The cgroup v2 CPU quota from the text of `cpu.max` (`max 100000`, `150000 100000`): CPUs, rounded up. */
export function cgroupCpus(cpuMax: string | undefined): number | undefined {
  if (cpuMax === undefined) return undefined;
  const [quota, period] = cpuMax.trim().split(/\s+/);
  if (quota === undefined || quota === 'max') return undefined;
  const q = Number(quota);
  const p = Number(period ?? 100_000);
  if (!Number.isFinite(q) || !Number.isFinite(p) || q <= 0 || p <= 0) return undefined;
  return Math.max(1, Math.ceil(q / p));
}

/** `server.workers` as a number of processes. */
export function workerCount(setting: 'auto' | number, machine: { readonly availableParallelism: number; readonly cgroupCpuMax?: string | undefined }): number {
  if (setting !== 'auto') return setting;
  const quota = cgroupCpus(machine.cgroupCpuMax);
  return Math.max(1, Math.min(machine.availableParallelism, quota ?? Number.POSITIVE_INFINITY));
}

/**
 * Whether the serving processes lower their helper threads' priority (`server.helper_threads`): `yield` and `share`
 * say so; `auto` yields when the `workers` serving processes have every core this process may run on (its CPU
 * affinity), so that a helper thread can only run by taking a serving thread's core. A cgroup CPU quota alone does
 * not count: it confines no thread to a core, and priority only orders threads waiting for the same core
 * (docs/operations.md, "Helper threads").
 */
export function helpersYield(setting: Config['server']['helper_threads'], workers: number, availableParallelism: number): boolean {
  if (setting !== 'auto') return setting === 'yield';
  return availableParallelism <= workers;
}

/** Worker `index`'s share (0-based) of `total` split between `count` workers: they add up to `total`, at least 1 each. */
export function shareOf(total: number, index: number, count: number): number {
  const base = Math.floor(total / count);
  return Math.max(1, base + (index < total % count ? 1 : 0));
}

/** The limits that a split of `count` workers exceeds (each worker keeps at least 1), for the start-up log. */
export function oversplitLimits(config: Config, count: number): string[] {
  const over: string[] = [];
  for (const pool of config.pools) {
    if (pool.admission !== undefined && pool.admission.maxInflight < count) over.push(`pools.${pool.name}.admission.max_inflight (${pool.admission.maxInflight})`);
    for (const upstream of pool.upstreams) {
      if (upstream.maxInflight !== undefined && upstream.maxInflight < count) over.push(`pools.${pool.name}.upstreams.${upstream.name}.max_inflight (${upstream.maxInflight})`);
    }
  }
  return over;
}

/** Worker `index` of `count`'s configuration: the per-process limits replaced by its share of them. */
export function forWorker(config: Config, index: number, count: number): Config {
  if (count === 1) return config;
  const pools = config.pools.map((pool) =>
    Object.freeze({
      ...pool,
      upstreams: Object.freeze(
        pool.upstreams.map((upstream) => (upstream.maxInflight === undefined ? upstream : Object.freeze({ ...upstream, maxInflight: shareOf(upstream.maxInflight, index, count) }))),
      ),
      admission:
        pool.admission === undefined
          ? undefined
          : {
              ...pool.admission,
              maxInflight: shareOf(pool.admission.maxInflight, index, count),
              // A queue of 0 stays 0 (no queueing); otherwise a share of it, at least 1.
              maxQueue: pool.admission.maxQueue === 0 ? 0 : shareOf(pool.admission.maxQueue, index, count),
            },
    }),
  );
  return { ...config, pools: Object.freeze(pools) };
}
