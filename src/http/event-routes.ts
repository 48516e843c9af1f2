/**
 * The gateway's own checks on `/v1/responses` (OpenAI Responses) and `/v1/messages` (Anthropic Messages) requests,
 * and the output contract each asks for (docs/routes.md, docs/output-contract.md). Only what the gateway needs to
 * route and account is checked; the upstream validates the rest.
 */
import type { ContentFormat, OutputContract, SchemaCompiler, ToolChoice } from '../accounting/output-contract.js';
import { errorBody, type ErrorCode } from '../delivery/errors.js';
import { isRecord } from '../util/json.js';
import type { Checked } from './completions.js';

function invalid(message: string, param: string | null, stream = false, code: ErrorCode = 'invalid_request'): Checked {
  return { ok: false, status: 400, body: errorBody(code, message, param), stream };
}

/** Characters of every string under `value` (text parts of messages, instructions, system prompts), bounded in depth. */
function textChars(value: unknown, depth = 0): { chars: number; found: boolean } {
  if (typeof value === 'string') return { chars: value.length, found: true };
  let chars = 0;
  let found = false;
  const add = (inner: unknown) => {
    const counted = textChars(inner, depth + 1);
    chars += counted.chars;
    found ||= counted.found;
  };
  if (depth >= 4) return { chars, found };
  if (Array.isArray(value)) for (const item of value) add(item);
  else if (isRecord(value)) {
    // The text of a content part or message: `text`, `content`, or a Responses input item's `content`.
    if ('text' in value) add(value['text']);
    if ('content' in value) add(value['content']);
  }
  return { chars, found };
}

function estimate(charsPerToken: number, ...values: unknown[]): number | undefined {
  let chars = 0;
  let found = false;
  for (const value of values) {
    const counted = textChars(value);
    chars += counted.chars;
    found ||= counted.found;
  }
  return found ? Math.ceil(chars / charsPerToken) : undefined;
}

function common(json: unknown): { ok: true; json: Record<string, unknown>; model: string; stream: boolean } | { ok: false; checked: Checked } {
  if (!isRecord(json)) return { ok: false, checked: invalid('the request body must be a JSON object', null) };
  const stream = json['stream'];
  if (stream !== undefined && stream !== null && typeof stream !== 'boolean') return { ok: false, checked: invalid('`stream` must be a boolean', 'stream') };
  const model = json['model'];
  if (typeof model !== 'string' || model.length === 0) return { ok: false, checked: invalid('you must provide a model parameter', 'model', stream === true) };
  return { ok: true, json, model, stream: stream === true };
}

export function checkResponses(body: unknown, charsPerToken = 4): Checked {
  const base = common(body);
  if (!base.ok) return base.checked;
  const { json, model, stream } = base;
  if (json['input'] === undefined && json['previous_response_id'] === undefined) return invalid('`input` is required', 'input', stream);
  // vLLM reads `background` and `store` as pydantic does (1, "1", "true", "yes", "on" are true): a value Waybill read
  // differently would let a background generation run on as an ordinary request, past its tenant's limits.
  for (const flag of ['background', 'store']) {
    const value = json[flag];
    if (value !== undefined && value !== null && typeof value !== 'boolean') return invalid(`\`${flag}\` must be a boolean`, flag, stream);
  }
  // A background request without a stream is answered at once with the queued response: an acknowledgement with no
  // choice to finish (and nothing to check); its answer is fetched later from GET /v1/responses/{id}.
  const acknowledgement = json['background'] === true && !stream;
  return {
    ok: true,
    fields: { model, stream, expectedChoices: acknowledgement ? 0 : 1, clientAskedUsage: true, promptTokensEstimate: estimate(charsPerToken, json['instructions'], json['input']) },
  };
}

export function checkMessages(body: unknown, charsPerToken = 4): Checked {
  const base = common(body);
  if (!base.ok) return base.checked;
  const { json, model, stream } = base;
  if (!Array.isArray(json['messages'])) return invalid('`messages` must be a list of messages', 'messages', stream);
  return {
    ok: true,
    fields: { model, stream, expectedChoices: 1, clientAskedUsage: true, promptTokensEstimate: estimate(charsPerToken, json['system'], json['messages']) },
  };
}

/** Responses: `text.format` (json_object, json_schema with its schema at the top level), flat function tools, tool_choice. */
export function readResponsesContract(json: Record<string, unknown>, compile: SchemaCompiler): OutputContract | undefined {
  const text = json['text'];
  const format = isRecord(text) && isRecord(text['format']) ? text['format'] : undefined;
  let content: ContentFormat | undefined;
  if (format?.['type'] === 'json_object') content = { kind: 'json_object' };
  else if (format?.['type'] === 'json_schema') content = format['schema'] === undefined ? { kind: 'json_object' } : { kind: 'json_schema', schema: format['schema'] };
  const tools = new Map<string, unknown>();
  if (Array.isArray(json['tools'])) {
    for (const tool of json['tools']) {
      if (isRecord(tool) && tool['type'] === 'function' && typeof tool['name'] === 'string' && tool['name'].length > 0) tools.set(tool['name'], tool['parameters']);
    }
  }
  if (content === undefined && tools.size === 0) return undefined;
  const choice = json['tool_choice'];
  let toolChoice: ToolChoice = 'auto';
  if (tools.size > 0) {
    if (choice === 'required' || choice === 'none') toolChoice = choice;
    else if (isRecord(choice) && choice['type'] === 'function' && typeof choice['name'] === 'string') toolChoice = { name: choice['name'] };
  }
  return { content, tools: tools.size > 0 ? tools : undefined, toolChoice, compile };
}

/** Messages: tools with `input_schema`, and tool_choice `any` (required), `tool` (named) or `none`. */
export function readMessagesContract(json: Record<string, unknown>, compile: SchemaCompiler): OutputContract | undefined {
  const tools = new Map<string, unknown>();
  if (Array.isArray(json['tools'])) {
    for (const tool of json['tools']) {
      if (isRecord(tool) && typeof tool['name'] === 'string' && tool['name'].length > 0) tools.set(tool['name'], tool['input_schema']);
    }
  }
  if (tools.size === 0) return undefined;
  const choice = json['tool_choice'];
  let toolChoice: ToolChoice = 'auto';
  if (isRecord(choice)) {
    if (choice['type'] === 'any') toolChoice = 'required';
    else if (choice['type'] === 'none') toolChoice = 'none';
    else if (choice['type'] === 'tool' && typeof choice['name'] === 'string') toolChoice = { name: choice['name'] };
  }
  return { content: undefined, tools, toolChoice, compile };
}
