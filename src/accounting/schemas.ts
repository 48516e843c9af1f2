/**
 * JSON Schemas from requests (`response_format.json_schema`, `guided_json`, tool `parameters`), compiled by Ajv once
 * per distinct schema and kept in a bounded cache (docs/output-contract.md). The schema comes from the client and
 * the text it is checked against from the model, so validation must stay linear and must not throw or stall:
 *
 * - `pattern`s run on RE2 (re2js: linear time, no backtracking). A pattern RE2 cannot run (lookaround,
 *   backreferences) makes the schema uncompilable: `unevaluated`, never a guess.
 * - Formats are ajv-formats' fast set, with `url` and `regex` replaced by linear checks.
 * - `uniqueItems` is checked in linear time (canonical JSON of each item in a set), not Ajv's pairwise loop.
 * - `$async` schemas are refused (their validator returns a Promise); refs are not inlined (a definition referenced
 *   a thousand times would be compiled a thousand times).
 * - Anything that throws while validating (a stack overflow on deeply nested data) is `unevaluated`.
 * - Memory: Ajv keeps every compiled schema's code and values in its instance for ever, so the cache compiles on a
 *   generation of Ajv instances and starts a new generation — dropping the old one whole — after `size × 2`
 *   compilations. What the cache holds is bounded by that, whatever clients send.
 */
import { Ajv, type Options, type ValidateFunction } from 'ajv';
import { Ajv2020 } from 'ajv/dist/2020.js';
import addFormatsPlugin, { type FormatName } from 'ajv-formats';
import { RE2JS } from 're2js';
import { isRecord } from '../util/json.js';
import type { SchemaCompiler, Validator } from './output-contract.js';

// ajv-formats is CommonJS: under NodeNext its default export arrives as the module object.
const addFormats = addFormatsPlugin as unknown as typeof addFormatsPlugin.default;

export interface SchemaCacheOptions {
  /** Distinct schemas kept compiled; the least recently used is dropped first. */
  readonly size: number;
  /** Largest schema compiled, in characters of its JSON text. */
  readonly maxSchemaChars: number;
}

/** ajv-formats' formats whose regular expressions are linear; `url` and `regex` get checks of their own. */
const FAST_FORMATS: FormatName[] = [
  'date',
  'time',
  'date-time',
  'iso-time',
  'iso-date-time',
  'duration',
  'uri',
  'uri-reference',
  'uri-template',
  'email',
  'hostname',
  'ipv4',
  'ipv6',
  'uuid',
  'json-pointer',
  'json-pointer-uri-fragment',
  'relative-json-pointer',
  'byte',
  'int32',
  'int64',
  'float',
  'double',
  'password',
  'binary',
];

/** A `pattern` as RE2 runs it: linear in the text, whatever the pattern. Throws (uncompilable) for what RE2 lacks. */
function re2(pattern: string): { test: (text: string) => boolean } {
  const compiled = RE2JS.compile(pattern);
  return { test: (text) => compiled.matcher(text).find() };
}

/** Items serialised with sorted keys, so equal JSON values give equal strings. */
function canonical(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonical).join(',')}]`;
  if (isRecord(value)) {
    return `{${Object.keys(value)
      .sort()
      .map((key) => `${JSON.stringify(key)}:${canonical(value[key])}`)
      .join(',')}}`;
  }
  return JSON.stringify(value) ?? 'null';
}

function newAjv(draft2020: boolean): Ajv {
  const options: Options = {
    strict: false,
    allErrors: false,
    // Cached here, by content: Ajv must not also keep schemas by `$id` (two clients may reuse one).
    addUsedSchema: false,
    inlineRefs: false,
    // Ajv would print warnings and failed generated code (with the schema's values) to the console.
    logger: false,
    code: { regExp: re2 as unknown as NonNullable<NonNullable<Options['code']>['regExp']> },
  };
  const ajv = draft2020 ? new Ajv2020(options) : new Ajv(options);
  addFormats(ajv, { mode: 'fast', formats: FAST_FORMATS });
  ajv.addFormat('url', (text: string) => {
    try {
      return /^(https?|ftp):$/.test(new URL(text).protocol);
    } catch {
      return false;
    }
  });
  ajv.addFormat('regex', (text: string) => {
    try {
      new RegExp(text, 'u');
      return true;
    } catch {
      return false;
    }
  });
  ajv.removeKeyword('uniqueItems');
  ajv.addKeyword({
    keyword: 'uniqueItems',
    type: 'array',
    schemaType: 'boolean',
    validate: (unique: boolean, items: unknown[]) => {
      if (!unique) return true;
      const seen = new Set<string>();
      for (const item of items) {
        const key = canonical(item);
        if (seen.has(key)) return false;
        seen.add(key);
      }
      return true;
    },
  });
  return ajv;
}

/** Draft 2020-12 (prefixItems, $defs, …) when the schema says so or uses its keywords; draft-07 otherwise. */
function wants2020(schema: Record<string, unknown>, text: string): boolean {
  const declared = schema['$schema'];
  if (typeof declared === 'string') return declared.includes('2020-12') || declared.includes('2019-09');
  return text.includes('"prefixItems"') || text.includes('"$defs"') || text.includes('"unevaluatedProperties"') || text.includes('"unevaluatedItems"');
}

interface Generation {
  readonly draft07: Ajv;
  readonly draft2020: Ajv;
  compilations: number;
}

/** The bounded cache of compiled schemas; `compile` is the requests' SchemaCompiler. */
export class SchemaCache {
  /** Keyed by the schema's JSON text; a Map iterates in insertion order, so the first key is the least recent. */
  private readonly entries = new Map<string, Validator | undefined>();
  /** Each schema object's JSON text, computed once (a request's schema is checked once per choice and call). */
  private readonly keys = new WeakMap<object, string | undefined>();
  private generation: Generation = this.newGeneration();
  /** Compilations attempted (tests count them to prove the cache works). */
  compilations = 0;
  /** Generations of Ajv instances started after the first (tests prove memory is let go). */
  rotations = 0;

  constructor(private readonly options: SchemaCacheOptions) {}

  readonly compile: SchemaCompiler = (schema) => {
    if (typeof schema === 'boolean') return () => schema;
    if (!isRecord(schema)) return undefined;
    const key = this.keyOf(schema);
    if (key === undefined) return undefined;
    if (this.entries.has(key)) {
      const cached = this.entries.get(key);
      this.entries.delete(key);
      this.entries.set(key, cached);
      return cached;
    }
    const validator = this.build(schema, key);
    this.entries.set(key, validator);
    if (this.entries.size > this.options.size) {
      const oldest = this.entries.keys().next();
      if (oldest.done !== true) this.entries.delete(oldest.value);
    }
    return validator;
  };

  get size(): number {
    return this.entries.size;
  }

  private keyOf(schema: Record<string, unknown>): string | undefined {
    if (this.keys.has(schema)) return this.keys.get(schema);
    let key: string | undefined;
    try {
      key = JSON.stringify(schema);
    } catch {
      key = undefined;
    }
    if (key !== undefined && key.length > this.options.maxSchemaChars) key = undefined;
    this.keys.set(schema, key);
    return key;
  }

  private build(schema: Record<string, unknown>, key: string): Validator | undefined {
    if (schema['$async'] === true) return undefined;
    if (this.generation.compilations >= this.options.size * 2) {
      // The old instances hold every schema they compiled: drop them whole, and what was compiled on them.
      this.generation = this.newGeneration();
      this.entries.clear();
      this.rotations++;
    }
    this.generation.compilations++;
    this.compilations++;
    let validate: ValidateFunction;
    try {
      validate = (wants2020(schema, key) ? this.generation.draft2020 : this.generation.draft07).compile(schema);
    } catch {
      return undefined;
    }
    if ((validate as { $async?: unknown }).$async === true) return undefined;
    return (value) => {
      try {
        const result: unknown = validate(value);
        if (typeof result === 'boolean') return result;
        // Never expected after the $async checks; a Promise left unhandled would end the process.
        if (result instanceof Promise) result.catch(() => undefined);
        return undefined;
      } catch {
        // A stack overflow on deeply nested data, or anything else: not a verdict.
        return undefined;
      }
    };
  }

  private newGeneration(): Generation {
    return { draft07: newAjv(false), draft2020: newAjv(true), compilations: 0 };
  }
}
