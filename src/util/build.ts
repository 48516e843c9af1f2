/**
 * What is running: the package version and the source revision, for `waybill_build_info` and `--version`.
 * The revision comes from WAYBILL_REVISION (the container build sets it from its REVISION build argument);
 * both fall back to `unknown` rather than guessing.
 */
import { readFileSync } from 'node:fs';

function readVersion(): string {
  // src/util/build.ts in development and tests, dist/src/util/build.js once built: package.json is two or three up.
  for (const path of ['../../package.json', '../../../package.json']) {
    try {
      const parsed = JSON.parse(readFileSync(new URL(path, import.meta.url), 'utf8')) as { name?: unknown; version?: unknown };
      if (parsed.name === 'waybill' && typeof parsed.version === 'string') return parsed.version;
    } catch {
      // Not at this depth.
    }
  }
  return 'unknown';
}

const REVISION = /^[0-9A-Za-z._-]{1,64}$/;

export function buildInfo(env: NodeJS.ProcessEnv = process.env): { version: string; revision: string } {
  const revision = env['WAYBILL_REVISION'];
  return { version: readVersion(), revision: revision !== undefined && REVISION.test(revision) ? revision : 'unknown' };
}
