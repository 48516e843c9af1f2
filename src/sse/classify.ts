/**
 * What one upstream event means for delivery: the facts the ledger needs and nothing more. Shapes follow
 * vllm-wire.md: chat and legacy completions chunks, the usage-only chunk, the error event (any JSON with a
 * top-level `error` key, whatever else it holds), and `[DONE]`.
 */

export interface Usage {
  promptTokens: number | undefined;
  completionTokens: number | undefined;
  /** Absent is not zero: vLLM only reports it with --enable-prompt-tokens-details and a non-zero hit. */
  cachedTokens: number | undefined;
}

export interface ChoiceFinish {
  index: number;
  reason: string;
}

export type EventFacts =
  | { kind: 'done' }
  | { kind: 'malformed' }
  | ({ kind: 'error' } & UpstreamError)
  | {
      kind: 'chunk';
      /** Choice indices for which this event carries generated output (content, reasoning, tool calls, text). */
      output: number[];
      /** Choice indices this event names at all (role chunks included). */
      choices: number[];
      finishes: ChoiceFinish[];
      usage: Usage | undefined;
      /** `choices: []` with usage: the chunk a gateway that injected include_usage drops. */
      usageOnly: boolean;
      /** The response's `id` and `model`, for traces. */
      id: string | undefined;
      model: string | undefined;
    };

const DONE = '[DONE]';

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function nonEmptyString(value: unknown): boolean {
  return typeof value === 'string' && value.length > 0;
}

function count(value: unknown): number | undefined {
  return typeof value === 'number' && Number.isFinite(value) && value >= 0 ? value : undefined;
}

/** Reads an OpenAI/vLLM `usage` object; undefined when absent or not an object. */
export function readUsage(value: unknown): Usage | undefined {
  if (!isRecord(value)) return undefined;
  const details = value['prompt_tokens_details'];
  return {
    promptTokens: count(value['prompt_tokens']),
    completionTokens: count(value['completion_tokens']),
    cachedTokens: isRecord(details) ? count(details['cached_tokens']) : undefined,
  };
}

export interface UpstreamError {
  code: number | undefined;
  type: string | undefined;
  message: string | undefined;
  param: string | undefined;
}

/** Reads an error object (or vLLM's string-shaped `{"error":"Unauthorized"}`). */
export function readError(value: unknown): UpstreamError {
  if (typeof value === 'string') return { code: undefined, type: undefined, message: value, param: undefined };
  if (!isRecord(value)) return { code: undefined, type: undefined, message: undefined, param: undefined };
  const rawCode = value['code'];
  const code = typeof rawCode === 'number' ? rawCode : typeof rawCode === 'string' && /^\d{3}$/.test(rawCode) ? Number(rawCode) : undefined;
  const type = value['type'];
  const message = value['message'];
  const param = value['param'];
  return {
    param: typeof param === 'string' ? param : undefined,
    code: code !== undefined && Number.isInteger(code) ? code : undefined,
    type: typeof type === 'string' ? type : undefined,
    message: typeof message === 'string' ? message : undefined,
  };
}

/** Does this chat delta or completions choice carry generated output? Empty strings and nulls do not. */
function hasOutput(choice: Record<string, unknown>): boolean {
  if (nonEmptyString(choice['text'])) return true;
  const delta = choice['delta'] ?? choice['message'];
  if (!isRecord(delta)) return false;
  if (nonEmptyString(delta['content']) || nonEmptyString(delta['reasoning']) || nonEmptyString(delta['reasoning_content'])) {
    return true;
  }
  const toolCalls = delta['tool_calls'];
  return Array.isArray(toolCalls) && toolCalls.length > 0;
}

/** Classifies a parsed JSON body (an SSE event's data, or a whole non-stream response). */
export function classifyJson(json: unknown): EventFacts {
  if (!isRecord(json)) return { kind: 'malformed' };
  if ('error' in json && json['error'] !== undefined && json['error'] !== null) {
    return { kind: 'error', ...readError(json['error']) };
  }
  const rawChoices = json['choices'];
  const output: number[] = [];
  const choices: number[] = [];
  const finishes: ChoiceFinish[] = [];
  if (Array.isArray(rawChoices)) {
    for (const choice of rawChoices) {
      if (!isRecord(choice)) continue;
      const index = typeof choice['index'] === 'number' ? choice['index'] : 0;
      choices.push(index);
      if (hasOutput(choice)) output.push(index);
      const reason = choice['finish_reason'];
      if (typeof reason === 'string' && reason.length > 0) finishes.push({ index, reason });
    }
  } else if (!('usage' in json)) {
    return { kind: 'malformed' };
  }
  const usage = readUsage(json['usage']);
  const id = json['id'];
  const model = json['model'];
  return {
    kind: 'chunk',
    output,
    choices,
    finishes,
    usage,
    usageOnly: choices.length === 0 && usage !== undefined,
    id: typeof id === 'string' ? id : undefined,
    model: typeof model === 'string' ? model : undefined,
  };
}

/** Classifies one SSE event's data buffer. */
export function classifyEventData(data: string): EventFacts {
  if (data === DONE) return { kind: 'done' };
  let json: unknown;
  try {
    json = JSON.parse(data);
  } catch {
    return { kind: 'malformed' };
  }
  return classifyJson(json);
}
