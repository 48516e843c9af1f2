/**
 * Callgrind's per-function table with V8's JIT code named: callgrind lists the code V8 generated as bare addresses
 * (`???:0x…`), and `node --perf-basic-prof` writes, for each piece of code V8 makes, its address, size and name to
 * /tmp/perf-PID.map (`npm run bench:instructions -- --perf-map` runs its targets so). This joins the two.
 *
 *   node dist/bench/callgrind-names.js FILE.callgrind /tmp/perf-PID.map [--inclusive] [--per N] [--top N] [--event NAME]
 *
 * `--event NAME`: another of the events callgrind recorded than instructions (`Ir`), e.g. `ILmr` (instruction fetches
 * that missed the last-level cache) from a run with `bench/instructions.js --cache-sim`.
 * `--per N` divides every count (by the requests or events counted, say); `--inclusive` counts what each function
 * called too. V8 reuses code space as it drops and recompiles functions, so an address can be in several entries: the
 * latest is taken (the count is of the warm end of the run). Names starting `*` are optimized code, `^` baseline and
 * `~` interpreted. Functions are summed by name (one function's several compiled versions together).
 */
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';

interface CodeEntry {
  readonly start: number;
  readonly end: number;
  readonly name: string;
  /** Its line in the map: later is newer. */
  readonly order: number;
}

function readMap(file: string): CodeEntry[] {
  const entries: CodeEntry[] = [];
  for (const line of readFileSync(file, 'utf8').split('\n')) {
    const match = /^([0-9a-f]+) ([0-9a-f]+) (.*)$/.exec(line);
    if (match === null) continue;
    const start = parseInt(match[1] as string, 16);
    entries.push({ start, end: start + parseInt(match[2] as string, 16), name: match[3] as string, order: entries.length });
  }
  return entries.sort((x, y) => x.start - y.start);
}

/** The newest entry whose code covers `address`, looking back over the entries that start before it. */
function nameAt(entries: readonly CodeEntry[], address: number): string | undefined {
  let low = 0;
  let high = entries.length;
  while (low < high) {
    const mid = (low + high) >> 1;
    if ((entries[mid] as CodeEntry).start <= address) low = mid + 1;
    else high = mid;
  }
  let best: CodeEntry | undefined;
  // Code objects are small and rarely overlap by more than a few hundred entries' worth of reuse.
  for (let i = low - 1; i >= 0 && i >= low - 400; i--) {
    const entry = entries[i] as CodeEntry;
    if (address < entry.end && (best === undefined || entry.order > best.order)) best = entry;
  }
  return best?.name;
}

function main(): void {
  const args = process.argv.slice(2);
  const flag = (name: string, fallback: number) => {
    const at = args.indexOf(name);
    return at < 0 ? fallback : Number(args[at + 1]);
  };
  const [file, map] = args.filter((arg, i) => !arg.startsWith('--') && !['--per', '--top', '--event'].includes(args[i - 1] ?? ''));
  if (file === undefined || map === undefined) throw new Error('usage: callgrind-names.js FILE.callgrind /tmp/perf-PID.map [--inclusive] [--per N] [--top N] [--event NAME]');
  const event = args.includes('--event') ? args[args.indexOf('--event') + 1] : 'Ir';
  if (event === undefined || !/^[A-Za-z0-9]+$/.test(event)) throw new Error(`--event: an event's name, e.g. Ir or ILmr (got ${String(event)})`);
  const per = flag('--per', 1);
  const top = flag('--top', 60);
  const entries = readMap(map);
  const table = execFileSync('callgrind_annotate', ['--threshold=100', '--auto=no', `--show=${event}`, `--sort=${event}`, `--inclusive=${args.includes('--inclusive') ? 'yes' : 'no'}`, file], { encoding: 'utf8', maxBuffer: 256 * 1024 * 1024 });
  const sums = new Map<string, number>();
  for (const line of table.split('\n')) {
    const match = /^\s*([\d,]+)\s+\([^)]*\)\s+(.*)$/.exec(line);
    if (match === null || line.includes('PROGRAM TOTALS')) continue;
    const count = Number((match[1] as string).replaceAll(',', ''));
    const fn = match[2] as string;
    const address = /^\?\?\?:0x([0-9a-f]+)/.exec(fn);
    const name = address === null ? fn.replace(/ \[[^\]]*\]$/, '') : (nameAt(entries, parseInt(address[1] as string, 16)) ?? `(unnamed) ${fn}`);
    sums.set(name, (sums.get(name) ?? 0) + count);
  }
  for (const [name, count] of [...sums].sort((x, y) => y[1] - x[1]).slice(0, top)) console.log(`${Math.round(count / per).toString().padStart(12)}  ${name.slice(0, 160)}`);
}

main();
