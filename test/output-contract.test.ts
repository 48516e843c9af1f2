/**
 * The output contract's checks as pure functions: the assembly of streamed answers, each check's verdict, the
 * bounded schema cache, the pattern guard, and the deterministic evaluation sample. Socket-level behaviour (real
 * streamed payloads through the gateway) is in test/output-checks.test.ts.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { OutputAssembly, notTruncated, type OutputContract } from '../src/accounting/output-contract.js';
import { SchemaCache } from '../src/accounting/schemas.js';
import { readContract } from '../src/http/contract.js';
import { readOutputParts } from '../src/sse/output-parts.js';
import { inSample } from '../src/telemetry/evaluation.js';

const cache = () => new SchemaCache({ size: 8, maxSchemaChars: 10_000 });

function contractOf(body: Record<string, unknown>, schemas = cache()): OutputContract {
  const contract = readContract(body, schemas.compile);
  if (contract === undefined) throw new Error('no contract');
  return contract;
}

/** Streams `pieces` of content for choice 0 into an assembly and returns format_valid. */
function formatOf(body: Record<string, unknown>, pieces: string[], maxChars = 1000): string {
  const assembly = new OutputAssembly(1, maxChars);
  for (const piece of pieces) assembly.add(readOutputParts([{ index: 0, delta: { content: piece } }]));
  return assembly.formatValid(0, contractOf(body));
}

const PERSON = {
  type: 'object',
  properties: { name: { type: 'string' }, age: { type: 'integer', minimum: 0 } },
  required: ['name', 'age'],
  additionalProperties: false,
};
const jsonSchema = (schema: unknown) => ({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema } } });

describe('format_valid on content', () => {
  it('json_object: the assembled content must parse as a JSON object', () => {
    const body = { response_format: { type: 'json_object' } };
    expect(formatOf(body, ['{"a"', ': 1', '}'])).toBe('pass');
    expect(formatOf(body, ['  {"a": [1, 2]}\n'])).toBe('pass');
    expect(formatOf(body, ['{"a": 1'])).toBe('fail');
    expect(formatOf(body, ['[1, 2]'])).toBe('fail');
    expect(formatOf(body, [])).toBe('fail');
    // What a client's JSON.parse would do: a fenced block is not JSON.
    expect(formatOf(body, ['```json\n{"a": 1}\n```'])).toBe('fail');
  });

  it('json_schema: parses and validates against the schema', () => {
    expect(formatOf(jsonSchema(PERSON), ['{"name":"Ada",', '"age":36}'])).toBe('pass');
    expect(formatOf(jsonSchema(PERSON), ['{"name":"Ada","age":-1}'])).toBe('fail');
    expect(formatOf(jsonSchema(PERSON), ['{"name":"Ada"}'])).toBe('fail');
    expect(formatOf(jsonSchema(PERSON), ['{"name":"Ada","age":36,"x":1}'])).toBe('fail');
    expect(formatOf(jsonSchema(PERSON), ['not json'])).toBe('fail');
  });

  it("vLLM's guided_json and structured_outputs.json, as an object or as JSON text", () => {
    expect(formatOf({ guided_json: PERSON }, ['{"name":"A","age":1}'])).toBe('pass');
    expect(formatOf({ guided_json: JSON.stringify(PERSON) }, ['{"name":"A"}'])).toBe('fail');
    expect(formatOf({ structured_outputs: { json: PERSON } }, ['{"name":"A","age":1}'])).toBe('pass');
  });

  it('a schema that cannot be compiled, or a pattern RE2 cannot run, is unevaluated — never a failure', () => {
    expect(formatOf(jsonSchema({ type: 'object', properties: { a: { $ref: '#/nowhere' } } }), ['{"a":1}'])).toBe('unevaluated');
    expect(formatOf(jsonSchema({ type: 'string', pattern: '^(?=a)a+$' }), ['"aaaa"'])).toBe('unevaluated');
    // Invalid JSON is still a failure: that much is certain without the schema.
    expect(formatOf(jsonSchema({ type: 'string', pattern: '^(?=a)a+$' }), ['nope'])).toBe('fail');
  });

  it('patterns run on RE2: a catastrophic-backtracking pattern is judged, in linear time, on a long answer', () => {
    // On a backtracking engine each of these would take longer than the test run; RE2 is linear in the text.
    const evil = `"${'a'.repeat(50_000)}!"`;
    expect(formatOf(jsonSchema({ type: 'string', pattern: '^(a+)+$' }), [evil], 100_000)).toBe('fail');
    expect(formatOf(jsonSchema({ type: 'string', pattern: '^(a+)+$' }), ['"aaaa"'])).toBe('pass');
    expect(formatOf(jsonSchema({ type: 'string', pattern: '\\s+$' }), [`"${' '.repeat(50_000)}x"`], 100_000)).toBe('fail');
  });

  it('$async schemas are refused (their validator answers with a Promise): unevaluated, and nothing left unhandled', () => {
    expect(formatOf(jsonSchema({ $async: true, type: 'object', required: ['x'] }), ['{}'])).toBe('unevaluated');
    expect(formatOf(jsonSchema({ type: 'object', properties: { a: { $async: true, type: 'string' } } }), ['{"a":1}'])).not.toBe('pass');
  });

  it('data nested deeper than the validator can recurse is unevaluated, not a crash', () => {
    const schema = { $ref: '#/definitions/n', definitions: { n: { type: 'array', items: { $ref: '#/definitions/n' } } } };
    const deep = '['.repeat(20_000) + ']'.repeat(20_000);
    expect(formatOf(jsonSchema(schema), [deep], 100_000)).toBe('unevaluated');
    expect(formatOf(jsonSchema(schema), ['[[[]],[]]'])).toBe('pass');
  });

  it('uniqueItems is checked by value (key order aside), in one pass', () => {
    const schema = { type: 'array', uniqueItems: true };
    expect(formatOf(jsonSchema(schema), ['[1, 2, 3]'])).toBe('pass');
    expect(formatOf(jsonSchema(schema), ['[1, 2, 1]'])).toBe('fail');
    expect(formatOf(jsonSchema(schema), ['[{"a":1,"b":2}, {"b":2,"a":1}]'])).toBe('fail');
    const many = JSON.stringify(Array.from({ length: 100_000 }, (_, i) => i));
    expect(formatOf(jsonSchema(schema), [many], 1_000_000)).toBe('pass');
  });

  it('draft 2020-12 keywords are checked, not ignored', () => {
    const tuple = { $schema: 'https://json-schema.org/draft/2020-12/schema', type: 'array', prefixItems: [{ type: 'string' }, { type: 'integer' }], items: false };
    expect(formatOf(jsonSchema(tuple), ['["a", 1]'])).toBe('pass');
    expect(formatOf(jsonSchema(tuple), ['[1, "a"]'])).toBe('fail');
    expect(formatOf(jsonSchema({ type: 'object', $defs: { s: { type: 'string' } }, properties: { a: { $ref: '#/$defs/s' } } }), ['{"a":1}'])).toBe('fail');
  });

  it('url and regex formats have linear checks of their own', () => {
    const url = { type: 'string', format: 'url' };
    expect(formatOf(jsonSchema(url), ['"https://example.com/a?b=c"'])).toBe('pass');
    expect(formatOf(jsonSchema(url), ['"not a url"'])).toBe('fail');
    expect(formatOf(jsonSchema(url), [`"http://${':'.repeat(50_000)}"`], 100_000)).toBe('fail');
    expect(formatOf(jsonSchema({ type: 'string', format: 'regex' }), ['"[a-z"'])).toBe('fail');
  });

  it('formats are checked (ajv-formats), not ignored', () => {
    const schema = { type: 'object', properties: { at: { type: 'string', format: 'date-time' } }, required: ['at'] };
    expect(formatOf(jsonSchema(schema), ['{"at":"2026-11-30T12:00:00Z"}'])).toBe('pass');
    expect(formatOf(jsonSchema(schema), ['{"at":"yesterday"}'])).toBe('fail');
  });

  it('past the size cap the verdict is unevaluated and the text is let go; each piece counts its overhead', () => {
    const body = { response_format: { type: 'json_object' } };
    // Two pieces of 5 and 13 characters, each counted with 32 characters of overhead: 82.
    expect(formatOf(body, ['{"a":', '"0123456789"}'], 82)).toBe('pass');
    expect(formatOf(body, ['{"a":', '"0123456789"}'], 81)).toBe('unevaluated');
    const assembly = new OutputAssembly(1, 5);
    assembly.add(readOutputParts([{ index: 0, delta: { content: '0123456789' } }]));
    expect(assembly.overCap).toBe(true);
    expect(assembly.text(0)).toBeUndefined();
  });

  it('no contract: unevaluated', () => {
    expect(readContract({ messages: [] }, cache().compile)).toBeUndefined();
    expect(readContract({ response_format: { type: 'text' } }, cache().compile)).toBeUndefined();
  });
});

const WEATHER_TOOL = {
  type: 'function',
  function: {
    name: 'get_weather',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
};

/** Tool-call deltas as vLLM streams them: the name first, the arguments in pieces. */
function toolFormat(body: Record<string, unknown>, calls: Array<{ name?: string; args: string[] }>, content?: string): string {
  const assembly = new OutputAssembly(1, 10_000);
  calls.forEach((call, i) => {
    assembly.add(readOutputParts([{ index: 0, delta: { tool_calls: [{ index: i, id: `c${i}`, type: 'function', function: { name: call.name, arguments: '' } }] } }]));
    for (const piece of call.args) assembly.add(readOutputParts([{ index: 0, delta: { tool_calls: [{ index: i, function: { arguments: piece } }] } }]));
  });
  if (content !== undefined) assembly.add(readOutputParts([{ index: 0, delta: { content } }]));
  return assembly.formatValid(0, contractOf(body));
}

describe('format_valid on tool calls', () => {
  const tools = { tools: [WEATHER_TOOL] };

  it('each call names a declared tool and its arguments validate against its parameters', () => {
    expect(toolFormat(tools, [{ name: 'get_weather', args: ['{"ci', 'ty": "Oslo"}'] }])).toBe('pass');
    expect(toolFormat(tools, [{ name: 'get_weather', args: ['{"city": 3}'] }])).toBe('fail');
    expect(toolFormat(tools, [{ name: 'get_weather', args: ['{"city": "Oslo"'] }])).toBe('fail');
    expect(toolFormat(tools, [{ name: 'get_time', args: ['{}'] }])).toBe('fail');
    expect(toolFormat(tools, [{ name: 'get_weather', args: ['{"city":"A"}'] }, { name: 'get_weather', args: ['[]'] }])).toBe('fail');
  });

  it('a whole non-stream message is read the same way', () => {
    const assembly = new OutputAssembly(1, 10_000);
    assembly.add(
      readOutputParts([
        { index: 0, message: { content: null, tool_calls: [{ id: 'c', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } }] } },
      ]),
    );
    expect(assembly.formatValid(0, contractOf(tools))).toBe('pass');
  });

  it('tool_choice required or named must be satisfied; auto with a plain answer is unevaluated', () => {
    expect(toolFormat({ ...tools, tool_choice: 'required' }, [], 'It is sunny.')).toBe('fail');
    expect(toolFormat({ ...tools, tool_choice: 'required' }, [{ name: 'get_weather', args: ['{"city":"A"}'] }])).toBe('pass');
    const named = { ...tools, tool_choice: { type: 'function', function: { name: 'get_weather' } } };
    expect(toolFormat(named, [{ name: 'get_weather', args: ['{"city":"A"}'] }])).toBe('pass');
    expect(toolFormat(named, [], '{}')).toBe('fail');
    expect(toolFormat(tools, [], 'It is sunny.')).toBe('unevaluated');
  });

  it('a tool without parameters takes any JSON object', () => {
    const bare = { tools: [{ type: 'function', function: { name: 'now' } }] };
    expect(toolFormat(bare, [{ name: 'now', args: ['{}'] }])).toBe('pass');
    expect(toolFormat(bare, [{ name: 'now', args: ['nope'] }])).toBe('fail');
    // vLLM's streamed tool parsers may send no argument text for a call without parameters: that is {}.
    expect(toolFormat(bare, [{ name: 'now', args: [] }])).toBe('pass');
  });

  it("whitespace before a tool call is not checked against the response format", () => {
    const both = { ...tools, response_format: { type: 'json_object' } };
    expect(toolFormat(both, [{ name: 'get_weather', args: ['{"city":"A"}'] }], '\n\n')).toBe('pass');
  });

  it('tools are a chat contract: legacy completions ignore them, as vLLM does', () => {
    expect(readContract({ ...tools, tool_choice: 'required' }, cache().compile, false)).toBeUndefined();
  });
});

describe('not_truncated', () => {
  it('passes normal finishes only', () => {
    expect(notTruncated('stop')).toBe('pass');
    expect(notTruncated('tool_calls')).toBe('pass');
    expect(notTruncated('function_call')).toBe('pass');
    for (const reason of ['length', 'abort', 'content_filter', 'repetition', 'abort_or_repetition', 'other', 'none'] as const) expect(notTruncated(reason)).toBe('fail');
  });
});

describe('the schema cache', () => {
  it('compiles each distinct schema once, and stays within its bound', () => {
    const schemas = new SchemaCache({ size: 2, maxSchemaChars: 10_000 });
    const a = { type: 'string' };
    expect(schemas.compile(a)?.('x')).toBe(true);
    expect(schemas.compile({ type: 'string' })?.(1)).toBe(false);
    expect(schemas.compilations).toBe(1);
    for (let i = 0; i < 50; i++) schemas.compile({ type: 'integer', minimum: i });
    expect(schemas.size).toBe(2);
    expect(schemas.compilations).toBe(51);
  });

  it('starts a new generation of compilers after size × 2 compilations, so what Ajv keeps is bounded', () => {
    const schemas = new SchemaCache({ size: 4, maxSchemaChars: 10_000 });
    for (let i = 0; i < 9; i++) expect(schemas.compile({ type: 'integer', minimum: i })?.(i)).toBe(true);
    expect(schemas.rotations).toBe(1);
    expect(schemas.size).toBeLessThanOrEqual(4);
    // A schema reusing the draft-07 meta-schema's $id cannot break later compilations (nothing is ever removed by id).
    schemas.compile({ $id: 'http://json-schema.org/draft-07/schema#', type: 'string' });
    for (let i = 0; i < 20; i++) schemas.compile({ type: 'string', maxLength: i + 1 });
    expect(schemas.compile({ type: 'string', minLength: 2 })?.('ab')).toBe(true);
  });

  it('refuses schemas over the size limit, and tolerates $id reuse across clients', () => {
    const schemas = new SchemaCache({ size: 4, maxSchemaChars: 100 });
    expect(schemas.compile({ type: 'object', description: 'x'.repeat(200) })).toBeUndefined();
    const one = schemas.compile({ $id: 'https://x/s', type: 'string' });
    const two = schemas.compile({ $id: 'https://x/s', type: 'integer' });
    expect(one?.('a')).toBe(true);
    expect(two?.(1)).toBe(true);
    expect(two?.('a')).toBe(false);
  });
});


describe('format_valid that does not apply, and one that could not be judged', () => {
  it('tells no contract (not applicable) from a contract over the cap or a schema refused (unevaluated)', () => {
    const verdict = (body: Record<string, unknown>, pieces: string[], maxChars = 1000, calls: Array<{ name: string; args: string }> = []) => {
      const assembly = new OutputAssembly(1, maxChars);
      for (const piece of pieces) assembly.add(readOutputParts([{ index: 0, delta: { content: piece } }]));
      calls.forEach((call, i) => assembly.add(readOutputParts([{ index: 0, delta: { tool_calls: [{ index: i, id: `c${i}`, type: 'function', function: { name: call.name, arguments: call.args } }] } }])));
      return assembly.formatVerdict(0, contractOf(body));
    };
    // Tools declared with tool_choice auto and a plain answer: the contract asks nothing of this answer.
    expect(verdict({ tools: [WEATHER_TOOL] }, ['It is sunny.'])).toBe('not_applicable');
    // Reported as unevaluated by format_valid all the same (the metric's value set is unchanged).
    expect(toolFormat({ tools: [WEATHER_TOOL] }, [], 'It is sunny.')).toBe('unevaluated');
    expect(verdict({ response_format: { type: 'json_object' } }, ['{"a": 1, "b": 2}'], 10)).toBe('unevaluated');
    expect(verdict(jsonSchema({ $async: true, type: 'object' }), ['{"a": 1}'])).toBe('unevaluated');
    // A certain failure wins over an unevaluated part, as before.
    expect(verdict({ ...jsonSchema({ $async: true, type: 'object' }), tools: [WEATHER_TOOL] }, ['{"a": 1}'], 1000, [{ name: 'get_time', args: '{}' }])).toBe('fail');
  });
});

describe('the evaluation sample', () => {
  it('is decided by the request id alone', () => {
    fc.assert(
      fc.property(fc.string(), fc.double({ min: 0, max: 1, noNaN: true }), (id, p) => {
        expect(inSample(id, p)).toBe(inSample(id, p));
        expect(inSample(id, 0)).toBe(false);
        expect(inSample(id, 1)).toBe(true);
      }),
    );
  });

  it('includes about the configured share of random and of sequential request ids', () => {
    // 20,000 ids at p = 0.1: the binomial standard deviation is 42, so ±300 is over 7 sigma.
    let random = 0;
    let sequential = 0;
    let firstThousand = 0;
    for (let i = 0; i < 20_000; i++) {
      if (inSample(crypto.randomUUID(), 0.1)) random++;
      if (inSample(`req-${i}`, 0.1)) {
        sequential++;
        if (i < 1000) firstThousand++;
      }
    }
    for (const included of [random, sequential]) {
      expect(included).toBeGreaterThan(1700);
      expect(included).toBeLessThan(2300);
    }
    // Sequential ids do not cluster: any thousand of them holds about a hundred (sd 9.5; ±60 is over 6 sigma).
    expect(firstThousand).toBeGreaterThan(40);
    expect(firstThousand).toBeLessThan(160);
  });
});
