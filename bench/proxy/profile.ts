/**
 * Summarises a V8 `.cpuprofile` (from `node --cpu-prof`): self time by module group (Waybill's src/, node internals,
 * undici, prom-client, fastify, pino, V8/GC) and by function, and inclusive time of Waybill's own functions.
 *
 *   node dist/bench/proxy/profile.js FILE.cpuprofile [--top N]
 */
import { readFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';

interface CallFrame {
  functionName: string;
  url: string;
  lineNumber: number;
}

interface ProfileNode {
  id: number;
  callFrame: CallFrame;
  children?: number[];
}

interface CpuProfile {
  nodes: ProfileNode[];
  startTime: number;
  endTime: number;
  samples: number[];
  timeDeltas: number[];
}

export interface ProfileEntry {
  name: string;
  group: string;
  /** µs, and share of the busy (non-idle) time. */
  us: number;
  share: number;
}

export interface ProfileSummary {
  file: string;
  /** µs covered by samples, and of it not idle. */
  totalUs: number;
  busyUs: number;
  samples: number;
  /** The process's own CPU share of one core over the same window (from /proc), when known: the samples should
   *  account for most of it (the rest is kernel work outside any JS call, and other threads). */
  processCpuShare?: number;
  groups: ProfileEntry[];
  selfTop: ProfileEntry[];
  /** Inclusive (self + callees) time of Waybill's own functions. */
  inclusiveSrc: ProfileEntry[];
}

/** The module group a call frame belongs to. */
export function groupOf(frame: CallFrame): string {
  const { url, functionName } = frame;
  // The only WebAssembly in the gateway is undici's HTTP parser (llhttp).
  if (url.startsWith('wasm://')) return 'npm: undici';
  if (url === '') {
    if (functionName === '(idle)') return '(idle)';
    if (functionName === '(garbage collector)') return 'V8: garbage collector';
    if (functionName === '(program)') return 'V8: (program) native, unattributed';
    if (functionName === '(root)') return '(root)';
    return 'V8/C++ builtins (native calls)';
  }
  const src = /\/dist\/src\/(.+)\.js$/.exec(url);
  if (src !== null) return `waybill src/${src[1]}.ts`;
  const bench = /\/dist\/(bench|load)\/(.+)\.js$/.exec(url);
  if (bench !== null) return `waybill ${bench[1]}/${bench[2]}.ts`;
  if (url.endsWith('/bin/waybill.js')) return 'waybill bin';
  const pkg = /\/node_modules\/((?:@[^/]+\/)?[^/]+)\//.exec(url);
  if (pkg !== null) return `npm: ${pkg[1]}`;
  if (url.startsWith('node:')) return 'node internals (lib/)';
  return 'other';
}

/** Coarser buckets for the headline: ours, node, undici, prom-client, fastify, pino, other npm, V8. */
export function familyOf(group: string): string {
  if (group.startsWith('waybill')) return 'Waybill (src/)';
  if (group === 'node internals (lib/)' || group === 'V8/C++ builtins (native calls)') return 'Node.js internals + native';
  if (group.startsWith('V8:')) return group;
  if (group.startsWith('npm: ')) {
    const name = group.slice(5);
    return ['undici', 'prom-client', 'fastify', 'pino'].includes(name) ? name : 'other npm';
  }
  return group;
}

function shortUrl(url: string): string {
  const src = /\/dist\/((?:src|bench|load)\/.+)\.js$/.exec(url);
  if (src !== null) return `${src[1]}.ts`;
  const pkg = /\/node_modules\/(.+)$/.exec(url);
  if (pkg !== null) return pkg[1] as string;
  return url;
}

/**
 * `window`: only samples taken between these CLOCK_MONOTONIC times (µs; V8 stamps samples with the same clock as
 * `process.hrtime`), to leave out start-up and shutdown.
 */
export function summariseProfile(file: string, top = 25, window?: { fromUs: number; toUs: number }): ProfileSummary {
  const profile = JSON.parse(readFileSync(file, 'utf8')) as CpuProfile;
  const byId = new Map<number, ProfileNode>();
  const parent = new Map<number, number>();
  for (const node of profile.nodes) {
    byId.set(node.id, node);
    for (const child of node.children ?? []) parent.set(child, node.id);
  }
  const fnKey = (frame: CallFrame) => `${frame.functionName || '(anonymous)'} ${shortUrl(frame.url)}${frame.url === '' ? '' : `:${frame.lineNumber + 1}`}`;

  const self = new Map<string, { us: number; group: string }>();
  const inclusive = new Map<string, number>();
  const groups = new Map<string, number>();
  const families = new Map<string, number>();
  let totalUs = 0;
  let idleUs = 0;
  const { samples, timeDeltas } = profile;
  let at = profile.startTime;
  let counted = 0;
  for (let i = 0; i < samples.length; i++) {
    at += timeDeltas[i] as number;
    if (window !== undefined && (at < window.fromUs || at >= window.toUs)) continue;
    // Sample i lasts until the next one.
    const us = i + 1 < timeDeltas.length ? (timeDeltas[i + 1] as number) : 0;
    if (us <= 0) continue;
    counted++;
    const node = byId.get(samples[i] as number);
    if (node === undefined) continue;
    totalUs += us;
    const group = groupOf(node.callFrame);
    if (group === '(idle)') {
      idleUs += us;
      continue;
    }
    const key = fnKey(node.callFrame);
    const entry = self.get(key);
    if (entry === undefined) self.set(key, { us, group });
    else entry.us += us;
    groups.set(group, (groups.get(group) ?? 0) + us);
    const family = familyOf(group);
    families.set(family, (families.get(family) ?? 0) + us);
    // Inclusive time of Waybill's functions: each distinct one on the stack once.
    const seen = new Set<string>();
    for (let id: number | undefined = node.id; id !== undefined; id = parent.get(id)) {
      const frame = (byId.get(id) as ProfileNode).callFrame;
      if (!/\/dist\/src\//.test(frame.url)) continue;
      const k = fnKey(frame);
      if (seen.has(k)) continue;
      seen.add(k);
      inclusive.set(k, (inclusive.get(k) ?? 0) + us);
    }
  }
  const busyUs = totalUs - idleUs;
  const share = (us: number) => (busyUs > 0 ? us / busyUs : 0);
  const sortDesc = (a: ProfileEntry, b: ProfileEntry) => b.us - a.us;
  return {
    file,
    totalUs,
    busyUs,
    samples: counted,
    groups: [
      ...[...families].map(([name, us]) => ({ name, group: 'family', us, share: share(us) })),
      ...[...groups].map(([name, us]) => ({ name, group: 'module', us, share: share(us) })),
    ].sort(sortDesc),
    selfTop: [...self]
      .map(([name, { us, group }]) => ({ name, group, us, share: share(us) }))
      .sort(sortDesc)
      .slice(0, top),
    inclusiveSrc: [...inclusive]
      .map(([name, us]) => ({ name, group: 'inclusive', us, share: share(us) }))
      .sort(sortDesc)
      .slice(0, top),
  };
}

const pct = (x: number) => `${(x * 100).toFixed(1).padStart(5)}%`;

export function formatProfile(summary: ProfileSummary, top = 25): string {
  const lines: string[] = [];
  lines.push(`profile ${summary.file}`);
  const cpu = summary.processCpuShare;
  lines.push(
    `  ${summary.samples} samples, ${(summary.totalUs / 1e6).toFixed(2)} s sampled, ${(summary.busyUs / 1e6).toFixed(2)} s busy ` +
      `(${((summary.busyUs / summary.totalUs) * 100).toFixed(0)}%${cpu !== undefined && Number.isFinite(cpu) ? `; /proc says ${(cpu * 100).toFixed(0)}% of a core` : ''}); shares below are of busy time`,
  );
  lines.push('  self time by family:');
  for (const g of summary.groups.filter((e) => e.group === 'family')) lines.push(`    ${pct(g.share)}  ${g.name}`);
  lines.push('  self time by module:');
  for (const g of summary.groups.filter((e) => e.group === 'module').slice(0, 20)) lines.push(`    ${pct(g.share)}  ${g.name}`);
  lines.push(`  top ${top} functions by self time:`);
  for (const f of summary.selfTop.slice(0, top)) lines.push(`    ${pct(f.share)}  ${f.name}  [${familyOf(f.group)}]`);
  lines.push(`  Waybill functions by inclusive time (self + everything they call):`);
  for (const f of summary.inclusiveSrc.slice(0, top)) lines.push(`    ${pct(f.share)}  ${f.name}`);
  return lines.join('\n');
}

const invokedPath = process.argv[1];
if (invokedPath !== undefined && import.meta.url === pathToFileURL(invokedPath).href) {
  const args = process.argv.slice(2);
  const topIndex = args.indexOf('--top');
  const top = topIndex === -1 ? 25 : Number(args[topIndex + 1]);
  const files = args.filter((a, i) => !a.startsWith('--') && (topIndex === -1 || i !== topIndex + 1));
  if (files.length === 0) {
    console.error('usage: node dist/bench/proxy/profile.js FILE.cpuprofile [--top N]');
    process.exit(2);
  }
  for (const file of files) console.log(formatProfile(summariseProfile(file, top), top));
}
