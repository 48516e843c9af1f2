/**
 * config.example.yaml is "every key with its default", checked against the schema itself (src/config/schema.ts) so
 * that a key added there and not here fails this test:
 *
 * - every key the schema has (inside arrays: of some element; inside records: of some entry) is named in the
 *   example, set or commented out (`# key: value`: a key with no default, or an alternative to the one above it);
 * - every key set in the example and having a default holds its default (read through the schema: `30s` is
 *   30000 ms), unless its line (or a line of its value) is marked `# example`;
 * - the example itself is valid without any environment variable (the `check-config` of its header, checked through
 *   the CLI in test/cli.test.ts).
 */
import { readFileSync } from 'node:fs';
import { isDeepStrictEqual } from 'node:util';
import { isNode, isPair, isScalar, isMap, isSeq, parseDocument, visit, type Node } from 'yaml';
import { describe, expect, it } from 'vitest';
import type { z } from 'zod';
import { parseConfig } from '../src/config/load.js';
import { configSchema } from '../src/config/schema.js';

const TEXT = readFileSync(new URL('../config.example.yaml', import.meta.url), 'utf8');

/** The example with its commented-out keys (`# key: …`, `# - key: …`) put back, for the names only. */
export function uncommented(text: string): string {
  return text.replace(/^(\s*)# (\s*(?:- )?[A-Za-z0-9_][A-Za-z0-9_.+-]*:(?:\s|$))/gm, '$1$2');
}

type Schema = z.ZodType;
interface Def {
  type: string;
  innerType?: Schema;
  in?: Schema;
  shape?: Record<string, Schema>;
  element?: Schema;
  valueType?: Schema;
  options?: Schema[];
}
const defOf = (schema: Schema): Def => (schema as unknown as { _zod: { def: Def } })._zod.def;

/** Through optional, default, prefault, nullable and pipes (transforms) to the schema that has a shape. */
function unwrap(schema: Schema): Schema {
  const def = defOf(schema);
  if (def.innerType !== undefined) return unwrap(def.innerType);
  if (def.type === 'pipe' && def.in !== undefined) return unwrap(def.in);
  return schema;
}

function hasDefault(schema: Schema): boolean {
  const def = defOf(schema);
  if (def.type === 'default' || def.type === 'prefault') return true;
  return def.innerType !== undefined && def.type !== 'pipe' ? hasDefault(def.innerType) : false;
}

interface Key {
  /** `server.port`, `pools[].upstreams[].weight`, `tenants{}.limits.max_concurrent`. */
  readonly path: string;
  readonly segments: readonly string[];
  readonly schema: Schema;
}

/** Every key of the schema, depth first. */
export function schemaKeys(schema: Schema, prefix: readonly string[] = []): Key[] {
  const inner = unwrap(schema);
  const def = defOf(inner);
  const keys: Key[] = [];
  if (def.type === 'object' && def.shape !== undefined) {
    for (const [name, child] of Object.entries(def.shape)) {
      const segments = [...prefix, name];
      keys.push({ path: segments.join('.').replaceAll('.[]', '[]').replaceAll('.{}', '{}'), segments, schema: child });
      keys.push(...schemaKeys(child, segments));
    }
  } else if (def.type === 'array' && def.element !== undefined) {
    keys.push(...schemaKeys(def.element, [...prefix, '[]']));
  } else if (def.type === 'record' && def.valueType !== undefined) {
    keys.push(...schemaKeys(def.valueType, [...prefix, '{}']));
  } else if (def.type === 'union' && def.options !== undefined) {
    for (const option of def.options) keys.push(...schemaKeys(option, prefix));
  }
  return keys;
}

/** The values at `segments` in a plain object: `[]` descends into every element, `{}` into every entry. */
function valuesAt(value: unknown, segments: readonly string[]): unknown[] {
  if (segments.length === 0) return [value];
  const [head, ...rest] = segments;
  if (value === null || typeof value !== 'object') return [];
  if (head === '[]') return Array.isArray(value) ? value.flatMap((v) => valuesAt(v, rest)) : [];
  if (head === '{}') return Array.isArray(value) ? [] : Object.values(value).flatMap((v) => valuesAt(v, rest));
  if (Array.isArray(value) || !Object.hasOwn(value, head ?? '')) return [];
  return valuesAt((value as Record<string, unknown>)[head ?? ''], rest);
}

/** The YAML pairs at `segments` in the document, with their nodes (for comments). */
function pairsAt(node: unknown, segments: readonly string[]): Array<{ key: Node; value: unknown }> {
  if (segments.length === 0) return [];
  const [head, ...rest] = segments;
  const descend = (child: unknown) => (rest.length === 0 ? [] : pairsAt(child, rest));
  if (head === '[]') return isSeq(node) ? node.items.flatMap(descend) : [];
  if (!isMap(node)) return [];
  if (head === '{}') return node.items.flatMap((pair) => descend(pair.value));
  const pair = node.items.find((p) => isScalar(p.key) && p.key.value === head);
  if (pair === undefined || !isNode(pair.key)) return [];
  return rest.length === 0 ? [{ key: pair.key, value: pair.value }] : descend(pair.value);
}

/** Whether a pair (its key, its value, or anything inside the value) carries a comment starting "example". */
function markedExample(pair: { key: Node; value: unknown }): boolean {
  const comments: string[] = [];
  const collect = (node: unknown) => {
    if (!isNode(node)) return;
    comments.push(node.comment ?? '', node.commentBefore ?? '');
  };
  collect(pair.key);
  collect(pair.value);
  if (isNode(pair.value)) visit(pair.value, { Node: (_, node) => collect(node), Pair: (_, p) => (isPair(p) ? collect(p.key) : undefined) });
  return comments.some((comment) => /^\s*example\b/m.test(comment));
}

describe('config.example.yaml', () => {
  const keys = schemaKeys(configSchema);

  it('the walk finds the schema keys (sanity: a few of every kind)', () => {
    const paths = keys.map((k) => k.path);
    expect(paths).toEqual(expect.arrayContaining(['server.port', 'pools[].upstreams[].api_key', 'auth.keys[].key_env', 'tenants{}.limits.max_concurrent', 'metrics.buckets.ttft']));
    expect(paths.length).toBeGreaterThan(100);
  });

  it('names every key of the schema (set, or commented out)', () => {
    const named = parseDocument(uncommented(TEXT), { uniqueKeys: false }).toJS() as unknown;
    const missing = keys.filter((key) => valuesAt(named, key.segments).length === 0).map((key) => key.path);
    expect(missing, `keys of src/config/schema.ts that config.example.yaml does not name:\n${missing.join('\n')}`).toEqual([]);
  });

  it('shows each key that has a default with its default, unless marked "example"', () => {
    const doc = parseDocument(TEXT);
    expect(doc.errors).toEqual([]);
    const wrong: string[] = [];
    for (const key of keys) {
      // A section's keys are checked one by one; the section itself is not compared whole.
      if (!hasDefault(key.schema) || defOf(unwrap(key.schema)).type === 'object') continue;
      const fallback = key.schema.parse(undefined);
      for (const pair of pairsAt(doc.contents, key.segments)) {
        const value: unknown = isNode(pair.value) ? (pair.value.toJSON() as unknown) : pair.value;
        const parsed = key.schema.safeParse(value);
        const shown: unknown = parsed.success ? parsed.data : value;
        if (!isDeepStrictEqual(shown, fallback) && !markedExample(pair)) {
          wrong.push(`${key.path}: shows ${JSON.stringify(value)}, the default is ${JSON.stringify(fallback)}`);
        }
      }
    }
    expect(wrong, `config.example.yaml values that are not the default (mark an example "# example"):\n${wrong.join('\n')}`).toEqual([]);
  });

  it('is valid with no environment variable set', () => {
    const input = parseDocument(TEXT).toJS() as Parameters<typeof parseConfig>[0];
    expect(() => parseConfig(input, 'config.example.yaml', {})).not.toThrow();
  });
});
