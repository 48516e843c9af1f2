/**
 * How a configuration's problems are reported: every one at once, each naming its field (`pools[0].upstreams[1].url`),
 * in one ConfigError.
 */
import type { z } from 'zod';

/** Every problem found in a configuration, each naming its field. */
export class ConfigError extends Error {
  constructor(
    readonly source: string,
    readonly problems: readonly string[],
  ) {
    super(`invalid configuration in ${source}:\n${problems.map((p) => `  - ${p}`).join('\n')}`);
    this.name = 'ConfigError';
  }
}

export function formatPath(path: readonly PropertyKey[]): string {
  let out = '';
  for (const key of path) {
    if (typeof key === 'number') out += `[${key}]`;
    else out += out === '' ? String(key) : `.${String(key)}`;
  }
  return out === '' ? '(root)' : out;
}

export function issueMessages(error: z.ZodError): string[] {
  return error.issues.map((issue) => {
    if (issue.code === 'unrecognized_keys') {
      return `${formatPath(issue.path)}: unknown key${issue.keys.length > 1 ? 's' : ''} ${issue.keys.map((k) => `"${k}"`).join(', ')}`;
    }
    return `${formatPath(issue.path)}: ${issue.message}`;
  });
}

/** Deletes the value at `path` (an object key, or an array element's key); false when there is nothing to delete. */
export function removeAt(root: unknown, path: readonly PropertyKey[]): boolean {
  let node: unknown = root;
  for (const key of path.slice(0, -1)) {
    if (node === null || typeof node !== 'object') return false;
    node = (node as Record<PropertyKey, unknown>)[key];
  }
  const last = path[path.length - 1] as PropertyKey;
  if (node === null || typeof node !== 'object' || Array.isArray(node) || !(last in node)) return false;
  delete (node as Record<PropertyKey, unknown>)[last];
  return true;
}
