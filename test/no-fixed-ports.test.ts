/**
 * Tests bind and dial ephemeral ports only (port 0, then the port the listener got): a fixed port such as 8000 (the
 * default of `waybill sim`) or 8080 (of `waybill serve`) would make `npm test` probe — or fail against — whatever the
 * user runs there. This scans the test sources (test/, and fuzz/, which the fuzz test runs) for:
 *
 * - a loopback address with a literal port (`127.0.0.1:8000`, `localhost:8080`, `[::1]:9000`, `0.0.0.0:80`);
 * - `.listen(<port>` with a literal port, and `'--port', '<port>'` on a command line.
 *
 * Allowed without comment: port 0, and ports 1 and 9 — privileged ports (tcpmux, discard) that no unprivileged
 * process, no `waybill sim`, can listen on: the tests' address that refuses. Anything else needs the marker
 * `fixed-port-ok: <why>` on its line (for a string that is never dialled nor bound; prefer a non-loopback host
 * such as `http://gw-1:8080`, or port 9).
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';

const ROOT = new URL('..', import.meta.url).pathname;
const SCANNED = ['test', 'fuzz'];
/** Ports a test may name: ephemeral, or privileged and never served. */
const ALLOWED_PORTS: ReadonlySet<number> = new Set([0, 1, 9]);
const MARKER = 'fixed-port-ok:';

const PATTERNS: readonly RegExp[] = [
  /(?:\b127\.\d{1,3}\.\d{1,3}\.\d{1,3}|\blocalhost|\[::1?\]|\b0\.0\.0\.0):(\d{1,5})\b/g,
  /\.listen\(\s*(\d{1,5})\b/g,
  /['"]--port['"],\s*['"](\d{1,5})['"]/g,
  /--port[ =](\d{1,5})\b/g,
];

/** The fixed ports `line` names, unless it carries the marker. */
export function fixedPorts(line: string): number[] {
  if (line.includes(MARKER)) return [];
  const ports: number[] = [];
  for (const pattern of PATTERNS) {
    for (const match of line.matchAll(pattern)) {
      const port = Number(match[1]);
      if (port <= 65535 && !ALLOWED_PORTS.has(port)) ports.push(port);
    }
  }
  return ports;
}

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return name === 'node_modules' ? [] : sourceFiles(path);
    return /\.(ts|js|mjs|cjs)$/.test(name) ? [path] : [];
  });
}

describe('tests use ephemeral ports only', () => {
  it('recognises fixed ports, and lets port 0, the refusing ports and marked lines pass', () => {
    expect(fixedPorts("upstreams: [{ url: 'http://127.0.0.1:8000' }]")).toEqual([8000]);
    expect(fixedPorts('fetch(`http://localhost:8080/metrics`)')).toEqual([8080]);
    expect(fixedPorts("const u = 'http://[::1]:9000/x';")).toEqual([9000]);
    expect(fixedPorts('server.listen(8000, "127.0.0.1")')).toEqual([8000]);
    expect(fixedPorts("spawn(bin, ['sim', '--port', '8000'])")).toEqual([8000]);
    expect(fixedPorts("sim.listen(0, '127.0.0.1'); url: 'http://127.0.0.1:1', 'http://127.0.0.1:9'")).toEqual([]);
    // Not ports: out of range, or a version.
    expect(fixedPorts("[['--port', '70000'], '--port'] 'node 20.18.1'")).toEqual([]);
    expect(fixedPorts("target: 'http://127.0.0.1:8080', // fixed-port-ok: a report header's text, never dialled")).toEqual([]);
  });

  it('finds none in test/ and fuzz/', () => {
    const found: string[] = [];
    for (const file of SCANNED.flatMap((dir) => sourceFiles(join(ROOT, dir)))) {
      if (file === new URL(import.meta.url).pathname) continue;
      readFileSync(file, 'utf8')
        .split('\n')
        .forEach((line, i) => {
          for (const port of fixedPorts(line)) found.push(`${relative(ROOT, file)}:${i + 1}: port ${port}: ${line.trim().slice(0, 120)}`);
        });
    }
    expect(found, `fixed ports in tests (bind port 0, dial the port you got; or see this file's header):\n${found.join('\n')}`).toEqual([]);
  });
});
