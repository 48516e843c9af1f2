/**
 * Why the gateway keeps what is in flight in a LiveList, not a Set (src/util/live-list.ts), shown without the gateway:
 * 64 "requests" in flight, each holding ~40 KB of small objects for 60 ms and listed in a process-long collection while
 * it lives. Each kind of collection runs in its own `node --trace-gc-nvp` child; the report, over what the collector did
 * after the first second: scavenges, full collections, the time paused per second, and the median bytes promoted per
 * scavenge.
 *
 *   npm run bench:promotion        (or, built: node dist/bench/promotion.js)
 *
 * With a Set, nearly every request is promoted: the dead, old hash tables the Set rehashed out of still point at the
 * requests that were in it, and the scavenger treats every old-to-new pointer as a root.
 */
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { LiveList, type LiveEntry } from '../src/util/live-list.js';

type Kind = 'none' | 'set' | 'live-list';
const KINDS: readonly Kind[] = ['none', 'set', 'live-list'];
const SECONDS = 6;

function child(kind: Kind): void {
  const set = new Set<object>();
  const list = new LiveList<object>();
  // What a request keeps and what it drops come from the same allocation sites, as in the gateway: most of what a
  // site allocates dies young, so V8 does not pretenure it (allocate it old at once) whatever is listed.
  const make = (i: number): object => ({ a: i, b: `x${i}`, c: [i, i + 1] });
  const request = (): void => {
    const keep: object[] = [];
    for (let i = 0; i < 1000; i++) {
      const made = make(i);
      if (i % 2 === 0) keep.push(made);
    }
    const head = { keep };
    let entry: LiveEntry<object> | undefined;
    if (kind === 'set') set.add(head);
    if (kind === 'live-list') entry = list.add(head);
    setTimeout(() => {
      set.delete(head);
      if (entry !== undefined) list.delete(entry);
      request();
    }, 60);
  };
  // The collections become old in the first second (it is left out of the report), as a gateway's are.
  setTimeout(() => {
    for (let i = 0; i < 64; i++) request();
  }, 50);
  setTimeout(() => process.exit(0), SECONDS * 1000);
}

function median(values: number[]): number | undefined {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
}

function parent(): void {
  const self = fileURLToPath(import.meta.url);
  console.log(`64 requests in flight × ~40 KB each for 60 ms, ${SECONDS} s per run (node ${process.version}); after the first second:`);
  for (const kind of KINDS) {
    const run = spawnSync(process.execPath, ['--trace-gc-nvp', self, '--child', kind], {
      encoding: 'utf8',
      maxBuffer: 64 * 1024 * 1024,
    });
    if (run.error !== undefined || run.status !== 0) {
      console.error(`  ${kind}: the child failed (${run.error?.message ?? `exit ${String(run.status)}`}) ${run.stderr}`);
      process.exitCode = 1;
      continue;
    }
    const promoted: number[] = [];
    let scavenges = 0;
    let fullGcs = 0;
    let pauseMs = 0;
    for (const line of run.stdout.split('\n')) {
      const gc = /(\d+) ms: pause=([\d.]+) mutator=[\d.]+ gc=(\w+)/.exec(line);
      if (gc === null || Number(gc[1]) < 1000) continue;
      pauseMs += Number(gc[2]);
      if (gc[3] !== 's') {
        fullGcs++;
        continue;
      }
      scavenges++;
      const bytes = / promoted=(\d+)/.exec(line);
      if (bytes !== null) promoted.push(Number(bytes[1]));
    }
    const perScavenge = median(promoted);
    console.log(
      `  ${kind.padEnd(10)} scavenges ${String(scavenges).padStart(3)}  full GCs ${String(fullGcs).padStart(3)}  ` +
        `GC pause ${(pauseMs / (SECONDS - 1)).toFixed(0).padStart(4)} ms/s  promoted per scavenge ` +
        (perScavenge === undefined ? '—' : `${(perScavenge / 1e6).toFixed(2)} MB`),
    );
  }
}

const at = process.argv.indexOf('--child');
if (at >= 0) child(process.argv[at + 1] as Kind);
else parent();
