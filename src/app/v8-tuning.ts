/**
 * V8 settings for a process that serves the gateway (`serve`, `demo`, and each worker), set before it takes traffic.
 *
 * **Allocation-site pretenuring off.** V8 watches, per allocation site, how many of its objects survive a scavenge; a
 * site whose objects survived at a high rate is switched to allocate them in the old generation at once. Under load a
 * request's objects can happen to survive (a scavenge in a burst), and then a per-request site is tenured, until a
 * mark-compact finds most of the old generation dead (which under load did not happen). Its objects die old, and the
 * scavenger treats every pointer from an old object as a root, live or not: everything young they point at — the rest
 * of the request — is copied and promoted, request after request, as through the Set of util/live-list.ts.
 *
 * Measured on non-streaming load at 64 concurrency (docs/performance.md, "Pretenured requests"): in 12 of 41 runs of
 * 20 s, from a moment under load on, 2.8 MB was promoted per scavenge instead of 0.27 (GC 38–60 ms/s instead of
 * 9–15), and in the one such run traced, V8 had tenured a site at that moment; with pretenuring off, 0 of 23 (Node
 * 20.20). What pretenuring would have saved — copying genuinely long-lived objects once more — is mostly start-up
 * data, allocated before traffic.
 *
 * Set at run time (`v8.setFlagsFromString`), before the gateway's modules load, so `waybill serve` needs no node flag
 * (V8 reads this one at each scavenge, decision and optimisation). `node --allocation-site-pretenuring bin/waybill.js
 * serve` does not bring it back (this runs later); WAYBILL_V8_PRETENURING=1 (exactly) leaves pretenuring as node's
 * flags have it, to compare.
 */
import { setFlagsFromString } from 'node:v8';

/** The flags set, unless the environment opts out; `set` is V8's setter (a test passes its own). */
export function tuneV8ForGateway(env: NodeJS.ProcessEnv = process.env, set: (flags: string) => void = setFlagsFromString): void {
  if (env['WAYBILL_V8_PRETENURING'] === '1') return;
  set('--no-allocation-site-pretenuring');
}
