/**
 * V8 settings for a process that serves the gateway (`serve`, `demo`, and each worker), set before it takes traffic.
 *
 * **Allocation-site pretenuring off.** V8 watches, per allocation site, how many of its objects survive a scavenge; a
 * site whose objects survived at a high rate is switched to allocate them in the old generation at once. Under load a
 * request's objects can happen to survive (a scavenge in a burst), and then a per-request site is tenured for the life
 * of the process. Its objects die old, and the scavenger treats every pointer from an old object as a root, live or
 * not: everything young they point at — the rest of the request — is copied and promoted, request after request, as
 * through the Set of util/live-list.ts. Measured on non-streaming load at 64 concurrency (docs/performance.md,
 * "Pretenured requests"): in 6 of 34 runs of 20 s, from a moment under load on, 2.8 MB was promoted per scavenge
 * instead of 0.27 (GC 45–60 ms/s instead of 10–15), and in the one such run traced, V8 had tenured a site at that
 * moment; with pretenuring off, 0 of 16. What pretenuring would have saved — copying genuinely long-lived objects
 * once more — is mostly start-up data, allocated before traffic.
 *
 * Set at run time (`v8.setFlagsFromString`), so `waybill serve` needs no node flag; `node
 * --allocation-site-pretenuring bin/waybill.js serve` does not bring it back (this runs later), but
 * WAYBILL_V8_PRETENURING=1 leaves V8's default alone, to compare.
 */
import { setFlagsFromString } from 'node:v8';

export function tuneV8ForGateway(env: NodeJS.ProcessEnv = process.env): void {
  if (env['WAYBILL_V8_PRETENURING'] === '1') return;
  setFlagsFromString('--no-allocation-site-pretenuring');
}
