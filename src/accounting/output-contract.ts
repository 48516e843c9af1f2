/**
 * The output contract: what a delivered answer must be for the client to use it, and the checks that say whether
 * it was (docs/output-contract.md). Three checks per choice of a delivered response:
 *
 * - `answer_present`: the choice produced content (chat `content`, legacy `text`) or a tool call naming a function.
 *   Reasoning alone, or nothing, is not an answer.
 * - `not_truncated`: the choice finished normally (`stop`, `tool_calls`, `function_call`).
 * - `format_valid`: the answer meets what the request asked for — `response_format` `json_object` (the content
 *   parses as a JSON object), `json_schema` or vLLM's `guided_json` (it parses and validates), tool calls (each
 *   names a declared tool, its arguments parse as an object and validate against that tool's `parameters`), and
 *   `tool_choice` `required` or a named function (satisfied). No contract requested: `unevaluated`.
 *
 * `unevaluated` is never a failure and never a guess: no contract, an answer over the size cap, or a schema that
 * cannot be compiled (or uses a pattern Waybill will not run). Text is assembled only for requests whose contract
 * needs it, and at most `maxChars` per response; beyond that it is dropped and `format_valid` is `unevaluated`.
 *
 * Pure: schemas are compiled by the compiler the request carries (see schemas.ts), at settlement, only when a check
 * needs them.
 */
import { isRecord } from '../util/json.js';
import type { OutputPart } from '../sse/output-parts.js';
import type { CheckResult, FinishReason, OutputCheck } from './outcomes.js';

/** A compiled JSON Schema: true when the value validates, undefined when validation could not finish. */
export type Validator = (value: unknown) => boolean | undefined;

/** Compiles a JSON Schema (cached by the caller), or undefined when it cannot be compiled or is refused. */
export type SchemaCompiler = (schema: unknown) => Validator | undefined;

/** What the content of each choice must be. */
export type ContentFormat = { readonly kind: 'json_object' } | { readonly kind: 'json_schema'; readonly schema: unknown };

export type ToolChoice = 'auto' | 'none' | 'required' | { readonly name: string };

export interface OutputContract {
  readonly content: ContentFormat | undefined;
  /** Declared tools: function name → its `parameters` schema (undefined: any JSON object). */
  readonly tools: ReadonlyMap<string, unknown> | undefined;
  readonly toolChoice: ToolChoice;
  readonly compile: SchemaCompiler;
}

/** Does this contract need the answer's text assembled (format_valid can be evaluated)? */
export function contractNeedsText(contract: OutputContract | undefined): boolean {
  if (contract === undefined) return false;
  return contract.content !== undefined || contract.tools !== undefined || contract.toolChoice !== 'auto';
}

/** Tool calls kept per choice; more is over the cap (format_valid unevaluated). */
const MAX_TOOL_CALLS = 64;

/**
 * What one kept piece costs beyond its characters, counted against the cap: a stream of one-character deltas holds
 * one string per delta, so the cap bounds memory, not just text.
 */
const PIECE_OVERHEAD_CHARS = 32;

interface ToolCallText {
  name: string | undefined;
  args: string[];
}

interface ChoiceText {
  content: string[];
  calls: Map<number, ToolCallText>;
}

export type ChoiceChecks = Readonly<Record<OutputCheck, CheckResult>>;

/**
 * One response's answers, assembled for the contract's checks. Bounded: at most `maxChars` characters of content
 * and tool-call arguments over all choices, at most MAX_TOOL_CALLS calls per choice, only expected choice indices.
 */
export class OutputAssembly {
  private choices = new Map<number, ChoiceText>();
  private chars = 0;
  private overflow = false;

  constructor(
    private readonly expectedChoices: number,
    private readonly maxChars: number,
  ) {}

  /** A retry starts a new answer. */
  reset(): void {
    this.choices = new Map();
    this.chars = 0;
    this.overflow = false;
  }

  add(parts: readonly OutputPart[]): void {
    if (this.overflow) return;
    for (const part of parts) {
      if (!Number.isInteger(part.index) || part.index < 0 || part.index >= this.expectedChoices) continue;
      const choice = this.choice(part.index);
      if (part.content !== undefined && part.content.length > 0 && this.take(part.content.length + PIECE_OVERHEAD_CHARS)) choice.content.push(part.content);
      for (const call of part.toolCalls ?? []) {
        let text = choice.calls.get(call.index);
        if (text === undefined) {
          if (choice.calls.size >= MAX_TOOL_CALLS) this.overflow = true;
          text = { name: undefined, args: [] };
          choice.calls.set(call.index, text);
        }
        if (text.name === undefined && call.name !== undefined && this.take(call.name.length + PIECE_OVERHEAD_CHARS)) text.name = call.name;
        if (call.arguments !== undefined && call.arguments.length > 0 && this.take(call.arguments.length + PIECE_OVERHEAD_CHARS)) {
          text.args.push(call.arguments);
        }
      }
      if (this.overflow) {
        // Past the cap nothing more is kept, and what was kept is let go: the verdict is `unevaluated`.
        this.choices = new Map();
        return;
      }
    }
  }

  /** Whether the assembly went past its cap (format_valid is then unevaluated). */
  get overCap(): boolean {
    return this.overflow;
  }

  /** The content choice `index` produced, or undefined past the cap. */
  text(index: number): string | undefined {
    if (this.overflow) return undefined;
    return this.choices.get(index)?.content.join('') ?? '';
  }

  /** format_valid for choice `index` (`not_applicable` is reported as `unevaluated`: see formatVerdict). */
  formatValid(index: number, contract: OutputContract): CheckResult {
    const verdict = this.formatVerdict(index, contract);
    return verdict === 'not_applicable' ? 'unevaluated' : verdict;
  }

  /**
   * format_valid for choice `index`, telling a contract that asks nothing of this answer (`not_applicable`: no
   * contract; tools declared with `tool_choice` `auto` and a plain answer) from one that applies but could not be
   * judged (`unevaluated`: over the cap, a schema that does not compile). Only the second leaves the response out of
   * the evaluated cohort.
   */
  formatVerdict(index: number, contract: OutputContract): CheckResult | 'not_applicable' {
    if (!contractNeedsText(contract)) return 'not_applicable';
    if (this.overflow) return 'unevaluated';
    const choice = this.choices.get(index) ?? { content: [], calls: new Map<number, ToolCallText>() };
    const results: CheckResult[] = [];
    const calls = [...choice.calls.values()];
    const content = choice.content.join('');
    // Whitespace a model writes before its tool calls is not an answer to check against the response format.
    if (contract.content !== undefined && (content.trim().length > 0 || calls.length === 0)) {
      results.push(checkContent(content, contract.content, contract.compile));
    }
    if (calls.length > 0) {
      for (const call of calls) results.push(checkToolCall(call, contract));
    }
    const choiceRule = contract.toolChoice;
    if (choiceRule === 'required') results.push(calls.length > 0 ? 'pass' : 'fail');
    else if (choiceRule === 'none') results.push(calls.length === 0 ? 'pass' : 'fail');
    else if (typeof choiceRule === 'object') results.push(calls.some((c) => c.name === choiceRule.name) ? 'pass' : 'fail');
    return results.length === 0 ? 'not_applicable' : combine(results);
  }

  private choice(index: number): ChoiceText {
    let choice = this.choices.get(index);
    if (choice === undefined) {
      choice = { content: [], calls: new Map() };
      this.choices.set(index, choice);
    }
    return choice;
  }

  private take(chars: number): boolean {
    this.chars += chars;
    if (this.chars > this.maxChars) this.overflow = true;
    return !this.overflow;
  }
}

/** fail if any part failed; unevaluated if any could not be judged (or nothing applied); else pass. */
function combine(results: readonly CheckResult[]): CheckResult {
  if (results.length === 0) return 'unevaluated';
  if (results.includes('fail')) return 'fail';
  return results.includes('unevaluated') ? 'unevaluated' : 'pass';
}

/** JSON.parse as the client would run it on the answer: no fence stripping, no repair. */
function parseJson(text: string): { ok: true; value: unknown } | { ok: false } {
  try {
    return { ok: true, value: JSON.parse(text) };
  } catch {
    return { ok: false };
  }
}

function checkContent(content: string, format: ContentFormat, compile: SchemaCompiler): CheckResult {
  const parsed = parseJson(content);
  if (!parsed.ok) return 'fail';
  if (format.kind === 'json_object') return isRecord(parsed.value) ? 'pass' : 'fail';
  return verdict(compile(format.schema), parsed.value);
}

function verdict(validate: Validator | undefined, value: unknown): CheckResult {
  const valid = validate?.(value);
  if (valid === undefined) return 'unevaluated';
  return valid ? 'pass' : 'fail';
}

function checkToolCall(call: ToolCallText, contract: OutputContract): CheckResult {
  const tools = contract.tools;
  if (call.name === undefined || tools === undefined || !tools.has(call.name)) return 'fail';
  // vLLM's streamed tool parsers may send no argument text at all for a call without parameters: that is `{}`.
  const text = call.args.join('');
  const parsed = text.trim().length === 0 ? { ok: true as const, value: {} } : parseJson(text);
  if (!parsed.ok || !isRecord(parsed.value)) return 'fail';
  const parameters = tools.get(call.name);
  if (parameters === undefined) return 'pass';
  return verdict(contract.compile(parameters), parsed.value);
}

/** not_truncated: a normal finish. `length`, `abort`, filters, errors and a missing reason fail. */
export function notTruncated(reason: FinishReason): CheckResult {
  return reason === 'stop' || reason === 'tool_calls' || reason === 'function_call' ? 'pass' : 'fail';
}
