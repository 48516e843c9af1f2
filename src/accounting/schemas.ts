/**
 * JSON Schemas from requests (`response_format.json_schema`, `guided_json`, tool `parameters`), compiled once per
 * distinct schema by Ajv and kept in a bounded cache. A schema is refused — and its check is `unevaluated`, never a
 * failure — when it is larger than the limit, does not compile, or holds a regular expression that could backtrack
 * catastrophically: the schema comes from the client and the text from the model, so a pattern such as `(a+)+$`
 * would let either stall the gateway's event loop.
 */
import { Ajv, type ValidateFunction } from 'ajv';
import addFormatsPlugin from 'ajv-formats';
import type { SchemaCompiler, Validator } from './output-contract.js';

// ajv-formats is CommonJS: under NodeNext its default export arrives as the module object.
const addFormats = addFormatsPlugin as unknown as typeof addFormatsPlugin.default;

export interface SchemaCacheOptions {
  /** Distinct schemas kept compiled; the least recently used is dropped first. */
  readonly size: number;
  /** Largest schema compiled, in characters of its JSON text. */
  readonly maxSchemaChars: number;
}

/** Longest `pattern` compiled. */
const MAX_PATTERN_CHARS = 1024;

/**
 * A conservative test for patterns whose matching time can explode: a backreference, or a group repeated more than
 * once that itself holds an unbounded quantifier or an alternation (`(a+)+`, `(a|aa)*`, `(\w*\s?)*`, `(.*a){12}`).
 * Refusing a safe pattern costs an `unevaluated`; running an unsafe one could cost the gateway.
 */
export function riskyPattern(pattern: string): boolean {
  if (pattern.length > MAX_PATTERN_CHARS) return true;
  /** Per open group: does it contain an unbounded quantifier or an alternation? */
  const stack: boolean[] = [];
  let inClass = false;
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i];
    if (c === '\\') {
      const next = pattern[i + 1] ?? '';
      if (/[1-9]/.test(next) || (next === 'k' && pattern[i + 2] === '<')) return true;
      i++;
      continue;
    }
    if (inClass) {
      if (c === ']') inClass = false;
      continue;
    }
    if (c === '[') {
      inClass = true;
    } else if (c === '(') {
      stack.push(false);
    } else if (c === '|') {
      if (stack.length > 0) stack[stack.length - 1] = true;
    } else if (c === ')') {
      const inner = stack.pop() ?? false;
      const repeated = repetitionAt(pattern, i + 1);
      if (inner && repeated !== 'once') return true;
      // A group repeated without bound is itself an unbounded part of the group around it.
      if (stack.length > 0 && (inner || repeated === 'unbounded')) stack[stack.length - 1] = true;
    } else if (repetitionAt(pattern, i) === 'unbounded' && stack.length > 0) {
      stack[stack.length - 1] = true;
    }
  }
  return false;
}

/** The quantifier at position i: `unbounded` (`*`, `+`, `{n,}`), `bounded` (`{n}` or `{n,m}` allowing more than one), or `once` (none, `?`, `{0,1}`, `{1}`). */
function repetitionAt(pattern: string, i: number): 'unbounded' | 'bounded' | 'once' {
  const c = pattern[i];
  if (c === '*' || c === '+') return 'unbounded';
  if (c !== '{') return 'once';
  const match = /^\{(\d+)(,(\d*))?\}/.exec(pattern.slice(i, i + 24));
  if (match === null) return 'once';
  if (match[2] !== undefined && match[3] === '') return 'unbounded';
  const max = Number(match[3] ?? match[1]);
  return max > 1 ? 'bounded' : 'once';
}

function safeRegExp(pattern: string, flags: string): RegExp {
  if (riskyPattern(pattern)) throw new Error('pattern refused: it could backtrack catastrophically');
  return new RegExp(pattern, flags);
}
safeRegExp.code = 'new RegExp';

/** The bounded, least-recently-used cache of compiled schemas; `compile` is the requests' SchemaCompiler. */
export class SchemaCache {
  private readonly ajv: Ajv;
  /** Keyed by the schema's JSON text; a Map iterates in insertion order, so the first key is the least recent. */
  private readonly entries = new Map<string, { schema: object; validate: ValidateFunction | undefined }>();
  /** Compilations attempted (a test counts them to prove the cache works). */
  compilations = 0;

  constructor(private readonly options: SchemaCacheOptions) {
    this.ajv = new Ajv({
      strict: false,
      allErrors: false,
      // Schemas are cached here, by content: Ajv must not keep them by `$id` (two clients may reuse one).
      addUsedSchema: false,
      code: { regExp: safeRegExp },
    });
    addFormats(this.ajv);
  }

  readonly compile: SchemaCompiler = (schema) => {
    if (typeof schema === 'boolean') return () => schema;
    if (typeof schema !== 'object' || schema === null || Array.isArray(schema)) return undefined;
    let key: string;
    try {
      key = JSON.stringify(schema);
    } catch {
      return undefined;
    }
    if (key.length > this.options.maxSchemaChars) return undefined;
    const cached = this.entries.get(key);
    if (cached !== undefined) {
      this.entries.delete(key);
      this.entries.set(key, cached);
      return wrap(cached.validate);
    }
    this.compilations++;
    let validate: ValidateFunction | undefined;
    try {
      validate = this.ajv.compile(schema);
    } catch {
      validate = undefined;
    }
    this.entries.set(key, { schema, validate });
    if (this.entries.size > this.options.size) {
      const oldest = this.entries.keys().next();
      if (oldest.done !== true) {
        const entry = this.entries.get(oldest.value);
        this.entries.delete(oldest.value);
        // Ajv keeps its own map from schema object to compiled code: drop it there too, or it grows without bound.
        if (entry !== undefined) this.ajv.removeSchema(entry.schema);
      }
    }
    return wrap(validate);
  };

  get size(): number {
    return this.entries.size;
  }
}

function wrap(validate: ValidateFunction | undefined): Validator | undefined {
  if (validate === undefined) return undefined;
  return (value) => validate(value) === true;
}
