/**
 * The output contract a completion request asks for, read from its body (docs/output-contract.md): OpenAI's
 * `response_format` (`json_object`, `json_schema`), vLLM's `guided_json` and `structured_outputs.json`, `tools`
 * and `tool_choice`. Whatever the gateway cannot read is no contract (the upstream validates the request itself);
 * schemas are only kept here, and compiled at settlement, when a check needs them.
 */
import type { ContentFormat, OutputContract, SchemaCompiler, ToolChoice } from '../accounting/output-contract.js';
import { isRecord } from '../util/json.js';

/** A schema given as an object, or as JSON text (vLLM's guided_json accepts both). */
function schemaValue(value: unknown): unknown {
  if (typeof value !== 'string') return value;
  try {
    return JSON.parse(value) as unknown;
  } catch {
    return undefined;
  }
}

function contentFormat(json: Record<string, unknown>): ContentFormat | undefined {
  const format = json['response_format'];
  if (isRecord(format)) {
    if (format['type'] === 'json_object') return { kind: 'json_object' };
    if (format['type'] === 'json_schema') {
      const spec = format['json_schema'];
      // A json_schema format without a readable schema is still a promise of JSON: check that much.
      const schema = isRecord(spec) ? spec['schema'] : undefined;
      return schema === undefined ? { kind: 'json_object' } : { kind: 'json_schema', schema };
    }
  }
  const guided = schemaValue(json['guided_json']);
  if (guided !== undefined && guided !== null) return { kind: 'json_schema', schema: guided };
  const structured = json['structured_outputs'];
  if (isRecord(structured)) {
    const schema = schemaValue(structured['json']);
    if (schema !== undefined && schema !== null) return { kind: 'json_schema', schema };
  }
  return undefined;
}

function declaredTools(json: Record<string, unknown>): Map<string, unknown> | undefined {
  const tools = json['tools'];
  if (!Array.isArray(tools) || tools.length === 0) return undefined;
  const declared = new Map<string, unknown>();
  for (const tool of tools) {
    if (!isRecord(tool) || !isRecord(tool['function'])) continue;
    const name = tool['function']['name'];
    if (typeof name === 'string' && name.length > 0) declared.set(name, tool['function']['parameters']);
  }
  return declared.size > 0 ? declared : undefined;
}

function toolChoice(json: Record<string, unknown>, tools: Map<string, unknown> | undefined): ToolChoice {
  const choice = json['tool_choice'];
  if (tools === undefined) return 'auto';
  if (choice === 'required' || choice === 'none') return choice;
  if (isRecord(choice) && isRecord(choice['function']) && typeof choice['function']['name'] === 'string') {
    return { name: choice['function']['name'] };
  }
  return 'auto';
}

/**
 * The request's output contract, or undefined when it asks for none (format_valid is then `unevaluated`). Tools
 * count on chat only: vLLM ignores them on legacy completions.
 */
export function readContract(json: Record<string, unknown>, compile: SchemaCompiler, chat = true): OutputContract | undefined {
  const content = contentFormat(json);
  const tools = chat ? declaredTools(json) : undefined;
  if (content === undefined && tools === undefined) return undefined;
  return { content, tools, toolChoice: toolChoice(json, tools), compile };
}
