/**
 * The answer an event carries, piece by piece: content (chat `content`, legacy `text`) and tool calls, per choice.
 * Read only for requests whose output contract needs the text (accounting/output-contract.ts); every other request
 * takes the classifier's fast path and never builds these.
 */
import { isRecord } from '../util/json.js';

/** A piece of one choice's answer, as one event (or a whole body) carried it. */
export interface OutputPart {
  readonly index: number;
  readonly content: string | undefined;
  readonly toolCalls: readonly ToolCallPart[] | undefined;
}

export interface ToolCallPart {
  /** The tool call's index within its choice (streamed deltas name it; a whole message lists them in order). */
  readonly index: number;
  readonly name: string | undefined;
  readonly arguments: string | undefined;
}

/** Reads the answer pieces of a chat chunk, a chat message, or a legacy completions choice list. */
export function readOutputParts(rawChoices: unknown): OutputPart[] {
  const parts: OutputPart[] = [];
  if (!Array.isArray(rawChoices)) return parts;
  for (const choice of rawChoices) {
    if (!isRecord(choice)) continue;
    const index = typeof choice['index'] === 'number' ? choice['index'] : 0;
    const text = choice['text'];
    if (typeof text === 'string') {
      parts.push({ index, content: text, toolCalls: undefined });
      continue;
    }
    const delta = choice['delta'] ?? choice['message'];
    if (!isRecord(delta)) continue;
    const content = delta['content'];
    const rawCalls = delta['tool_calls'];
    let toolCalls: ToolCallPart[] | undefined;
    if (Array.isArray(rawCalls)) {
      toolCalls = [];
      rawCalls.forEach((call, position) => {
        if (!isRecord(call)) return;
        const fn = isRecord(call['function']) ? call['function'] : {};
        const name = fn['name'];
        const args = fn['arguments'];
        toolCalls?.push({
          index: typeof call['index'] === 'number' ? call['index'] : position,
          name: typeof name === 'string' && name.length > 0 ? name : undefined,
          arguments: typeof args === 'string' ? args : undefined,
        });
      });
    }
    parts.push({ index, content: typeof content === 'string' ? content : undefined, toolCalls });
  }
  return parts;
}
