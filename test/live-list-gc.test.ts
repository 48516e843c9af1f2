/**
 * Why the exchanges in flight (http/lifecycle.ts) and the admission queue are a LiveList (src/util/live-list.ts), not a
 * Set, checked against V8's own account: the same workload — 64 requests in flight, each keeping ~20 KB of small
 * objects, replaced one at a time — in two child processes under `--trace-gc-nvp`, listed in a process-long Set in one
 * and in a LiveList in the other, with the bytes each scavenge promoted summed from V8's trace.
 *
 * No timers: the children only allocate, so where their scavenges fall depends on the bytes allocated, not on this
 * machine's speed, and the counts repeat from run to run. Measured on Node 20.20 (3 runs, 4,000 requests each): the
 * Set's child promoted 242–252 MB, ~61 KB per request (nearly every request, through the dead tables its rehashes left
 * in the old generation); the LiveList's 11.6–11.8 MB, ~2.9 KB per request (most of it the first requests, promoted
 * while the list itself became old). The test asks for a 5× difference where 20× is seen, and separately that the Set
 * still promotes at least 20 KB per request (a third of what it does now): if a Node release stops that, the reason for
 * the module is gone, and the failure says so rather than passing on a workload that no longer shows anything.
 *
 * It runs the built module (dist/), as the CLI tests run the built gateway: `npm test` builds first.
 */
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { describe, expect, it } from 'vitest';

const MODULE = new URL('../dist/src/util/live-list.js', import.meta.url);
const REQUESTS = 4000;

/** One child's workload; `kind` is where the requests in flight are listed. */
function childSource(kind: 'set' | 'live-list'): string {
  return `
import { LiveList } from ${JSON.stringify(MODULE.href)};
const set = new Set();
const list = new LiveList();
const make = (i) => ({ a: i, b: 'x' + i, c: [i, i + 1] });
const slots = new Array(64).fill(undefined);
for (let n = 0; n < ${REQUESTS}; n++) {
  const at = n % 64;
  const old = slots[at];
  if (old !== undefined) {
    if (${JSON.stringify(kind)} === 'set') set.delete(old.head);
    else list.delete(old.entry);
  }
  // What a request keeps and what it drops come from one allocation site, so V8 does not pretenure the kept half.
  const keep = [];
  for (let i = 0; i < 1000; i++) {
    const made = make(i);
    if (i % 2 === 0) keep.push(made);
  }
  const head = { keep };
  const entry = ${JSON.stringify(kind)} === 'set' ? (set.add(head), undefined) : list.add(head);
  slots[at] = { head, entry };
}
`;
}

interface Promotion {
  readonly scavenges: number;
  readonly promotedBytes: number;
}

function run(kind: 'set' | 'live-list'): Promotion {
  const child = spawnSync(process.execPath, ['--trace-gc-nvp', '--input-type=module', '-e', childSource(kind)], {
    encoding: 'utf8',
    maxBuffer: 64 * 1024 * 1024,
  });
  expect(child.error, `the ${kind} child could not run`).toBeUndefined();
  expect(child.status, `the ${kind} child failed: ${child.stderr}`).toBe(0);
  let scavenges = 0;
  let promotedBytes = 0;
  for (const line of child.stdout.split('\n')) {
    if (!/\bgc=s\b/.test(line)) continue;
    const promoted = / promoted=(\d+)/.exec(line);
    expect(promoted, `a scavenge line without promoted=: ${line.slice(0, 200)}`).not.toBeNull();
    scavenges++;
    promotedBytes += Number(promoted?.[1]);
  }
  return { scavenges, promotedBytes };
}

/** The least the Set's child must promote per request for the workload to show the effect (~61 KB seen, above). */
const SET_PROMOTED_PER_REQUEST_AT_LEAST = 20_000;

describe('LiveList against a Set, as V8 collects them', () => {
  it('promotes nearly every request listed in a Set and almost none listed in a LiveList', () => {
    expect(existsSync(MODULE), `${MODULE.pathname} is missing: run npm run build`).toBe(true);
    const set = run('set');
    const live = run('live-list');
    // Both children allocate the same, so they scavenge about as often; a child that did not scavenge measured nothing.
    expect(set.scavenges).toBeGreaterThan(20);
    expect(live.scavenges).toBeGreaterThan(20);
    const perRequest = (p: Promotion): number => p.promotedBytes / REQUESTS;
    expect(
      perRequest(set),
      'V8 no longer promotes what a process-long Set held: the reason for src/util/live-list.ts may be gone (docs/performance.md, "Requests promoted")',
    ).toBeGreaterThan(SET_PROMOTED_PER_REQUEST_AT_LEAST);
    expect(perRequest(live)).toBeLessThan(perRequest(set) / 5);
  });
});
