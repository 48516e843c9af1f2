/**
 * The `x-sim-fault` request header: a `;`-separated list of directives, at most one of which is a fault,
 * the rest modifiers. Grammar and semantics are documented in docs/simulator.md; keep the two in step.
 */
import { randomInt, type Random } from '../util/prng.js';

export const FAULT_KINDS = [
  'status',
  'error_before_output',
  'error_after',
  'reset_after',
  'reset_before_response',
  'stall_after',
  'end_after',
  'no_done',
  'drop_finish',
  'malformed_after',
  'oversized_after',
  'data_after_done',
] as const;

export type FaultKind = (typeof FAULT_KINDS)[number];

/** Directives that parameterise a fault rather than being one. */
export const FAULT_PARAMETERS = ['error_code', 'oversized_bytes'] as const;

/** Directives that shape a normal answer. */
export const MODIFIER_NAMES = [
  'finish_reason',
  'tokens',
  'ttft_ms',
  'prefill_ms_per_1k_tokens',
  'itl_ms',
  'tokens_per_event',
  'cached_tokens',
  'no_usage',
  'framing',
  'comments',
  'multiline_data',
] as const;

export type Fault =
  | { readonly kind: 'status'; readonly status: number }
  | { readonly kind: 'error_before_output'; readonly code: number }
  | { readonly kind: 'error_after'; readonly after: number; readonly code: number }
  | { readonly kind: 'reset_after'; readonly after: number }
  | { readonly kind: 'reset_before_response' }
  | { readonly kind: 'stall_after'; readonly after: number }
  | { readonly kind: 'end_after'; readonly after: number }
  | { readonly kind: 'no_done' }
  | { readonly kind: 'drop_finish' }
  | { readonly kind: 'malformed_after'; readonly after: number }
  | { readonly kind: 'oversized_after'; readonly after: number; readonly bytes: number }
  | { readonly kind: 'data_after_done' };

export type Framing = 'lf' | 'crlf' | 'cr';

/** Per-request overrides that shape a normal answer; none of them is a fault. */
export interface Modifiers {
  readonly finishReason?: string;
  readonly tokens?: number;
  readonly ttftMs?: number;
  readonly prefillMsPer1kTokens?: number;
  readonly itlMs?: number;
  readonly tokensPerEvent?: number;
  readonly cachedTokens?: number;
  readonly noUsage: boolean;
  readonly framing: Framing;
  readonly comments: boolean;
  readonly multilineData: boolean;
}

export interface Directives {
  readonly fault: Fault | null;
  readonly modifiers: Modifiers;
}

export const NO_DIRECTIVES: Directives = Object.freeze({
  fault: null,
  modifiers: Object.freeze({ noUsage: false, framing: 'lf', comments: false, multilineData: false }),
});

export const DEFAULT_OVERSIZED_BYTES = 2_097_152;
const DEFAULT_ERROR_BEFORE_OUTPUT_CODE = 400;
const DEFAULT_ERROR_AFTER_CODE = 500;

export type ParseResult = { readonly ok: true; readonly directives: Directives } | { readonly ok: false; readonly message: string };

/** Faults that also mean something for `stream: false`; the rest only alter an event stream. */
const NON_STREAM_FAULTS: ReadonlySet<FaultKind> = new Set<FaultKind>([
  'status',
  'error_before_output',
  'error_after',
  'reset_after',
  'reset_before_response',
  'stall_after',
]);

export function appliesToNonStream(kind: FaultKind): boolean {
  return NON_STREAM_FAULTS.has(kind);
}

export function isFaultKind(value: string): value is FaultKind {
  return (FAULT_KINDS as readonly string[]).includes(value);
}

const INTEGER = /^\d{1,9}$/;
const REASON = /^[a-z_]{1,32}$/;

class DirectiveError extends Error {}

function integer(name: string, value: string | undefined, min: number, max = 999_999_999): number {
  if (value === undefined || !INTEGER.test(value)) throw new DirectiveError(`'${name}' needs an integer value`);
  const parsed = Number(value);
  if (parsed < min || parsed > max) throw new DirectiveError(`'${name}' must be between ${min} and ${max}`);
  return parsed;
}

function flag(name: string, value: string | undefined): true {
  if (value !== undefined) throw new DirectiveError(`'${name}' takes no value`);
  return true;
}

/**
 * Parse an `x-sim-fault` header value. Every problem is a message naming the directive, meant for a 400.
 *
 * @example parseFaultHeader('error_after=3; error_code=503')
 */
export function parseFaultHeader(header: string): ParseResult {
  try {
    return { ok: true, directives: parseDirectives(header) };
  } catch (error) {
    if (error instanceof DirectiveError) return { ok: false, message: `Invalid x-sim-fault header: ${error.message}.` };
    throw error;
  }
}

function parseDirectives(header: string): Directives {
  const seen = new Set<string>();
  const values = new Map<string, string | undefined>();
  for (const part of header.split(';')) {
    const directive = part.trim();
    if (directive === '') continue;
    const eq = directive.indexOf('=');
    const name = (eq === -1 ? directive : directive.slice(0, eq)).trim().toLowerCase();
    const value = eq === -1 ? undefined : directive.slice(eq + 1).trim();
    if (seen.has(name)) throw new DirectiveError(`'${name}' is given twice`);
    seen.add(name);
    values.set(name, value);
  }

  let fault: Fault | null = null;
  const setFault = (next: Fault): void => {
    if (fault !== null) throw new DirectiveError(`'${next.kind}' and '${fault.kind}' are both faults; give at most one`);
    fault = next;
  };
  const modifiers: {
    finishReason?: string;
    tokens?: number;
    ttftMs?: number;
    prefillMsPer1kTokens?: number;
    itlMs?: number;
    tokensPerEvent?: number;
    cachedTokens?: number;
    noUsage: boolean;
    framing: Framing;
    comments: boolean;
    multilineData: boolean;
  } = { noUsage: false, framing: 'lf', comments: false, multilineData: false };

  for (const [name, value] of values) {
    switch (name) {
      case 'status':
        setFault({ kind: 'status', status: integer(name, value, 400, 599) });
        break;
      case 'error_before_output':
        setFault({
          kind: 'error_before_output',
          code: value === undefined ? DEFAULT_ERROR_BEFORE_OUTPUT_CODE : integer(name, value, 400, 599),
        });
        break;
      case 'error_after': {
        const code = values.get('error_code');
        setFault({
          kind: 'error_after',
          after: integer(name, value, 0),
          code: values.has('error_code') ? integer('error_code', code, 400, 599) : DEFAULT_ERROR_AFTER_CODE,
        });
        break;
      }
      case 'error_code':
        if (!values.has('error_after')) throw new DirectiveError(`'error_code' needs 'error_after'`);
        break;
      case 'reset_after':
        setFault({ kind: 'reset_after', after: integer(name, value, 0) });
        break;
      case 'reset_before_response':
        flag(name, value);
        setFault({ kind: 'reset_before_response' });
        break;
      case 'stall_after':
        setFault({ kind: 'stall_after', after: integer(name, value, 0) });
        break;
      case 'end_after':
        setFault({ kind: 'end_after', after: integer(name, value, 0) });
        break;
      case 'no_done':
        flag(name, value);
        setFault({ kind: 'no_done' });
        break;
      case 'drop_finish':
        flag(name, value);
        setFault({ kind: 'drop_finish' });
        break;
      case 'malformed_after':
        setFault({ kind: 'malformed_after', after: integer(name, value, 0) });
        break;
      case 'oversized_after': {
        const bytes = values.get('oversized_bytes');
        setFault({
          kind: 'oversized_after',
          after: integer(name, value, 0),
          bytes: values.has('oversized_bytes') ? integer('oversized_bytes', bytes, 1, 1 << 30) : DEFAULT_OVERSIZED_BYTES,
        });
        break;
      }
      case 'oversized_bytes':
        if (!values.has('oversized_after')) throw new DirectiveError(`'oversized_bytes' needs 'oversized_after'`);
        break;
      case 'data_after_done':
        flag(name, value);
        setFault({ kind: 'data_after_done' });
        break;
      case 'finish_reason':
        if (value === undefined || !REASON.test(value)) {
          throw new DirectiveError(`'finish_reason' needs a value of lowercase letters and '_'`);
        }
        modifiers.finishReason = value;
        break;
      case 'tokens':
        modifiers.tokens = integer(name, value, 1);
        break;
      case 'ttft_ms':
        modifiers.ttftMs = integer(name, value, 0);
        break;
      case 'prefill_ms_per_1k_tokens':
        modifiers.prefillMsPer1kTokens = integer(name, value, 0);
        break;
      case 'itl_ms':
        modifiers.itlMs = integer(name, value, 0);
        break;
      case 'tokens_per_event':
        modifiers.tokensPerEvent = integer(name, value, 1);
        break;
      case 'cached_tokens':
        modifiers.cachedTokens = integer(name, value, 0);
        break;
      case 'no_usage':
        modifiers.noUsage = flag(name, value);
        break;
      case 'framing':
        if (value !== 'lf' && value !== 'crlf' && value !== 'cr') {
          throw new DirectiveError(`'framing' must be lf, crlf or cr`);
        }
        modifiers.framing = value;
        break;
      case 'comments':
        modifiers.comments = flag(name, value);
        break;
      case 'multiline_data':
        modifiers.multilineData = flag(name, value);
        break;
      default:
        throw new DirectiveError(`unknown directive '${name}'`);
    }
  }
  return { fault, modifiers };
}

/** Status codes a random `status` fault picks from: the two a healthy-looking vLLM fleet really returns. */
const RANDOM_STATUSES = [500, 503] as const;

/**
 * Draw a fault for a request that carried no header, or null. Draws are taken from `random` in request
 * arrival order, so a seed gives the same mix for the same request sequence.
 * `kinds` should already exclude kinds that do not apply (stream-only kinds for non-streaming requests).
 */
export function drawFault(
  random: Random,
  rate: number,
  kinds: readonly FaultKind[],
  outputTokens: number,
): Fault | null {
  if (rate <= 0 || random() >= rate || kinds.length === 0) return null;
  const kind = kinds[randomInt(random, 0, kinds.length)] ?? 'error_after';
  const after = randomInt(random, 0, outputTokens);
  switch (kind) {
    case 'status':
      return { kind, status: RANDOM_STATUSES[randomInt(random, 0, RANDOM_STATUSES.length)] ?? 500 };
    case 'error_before_output':
      return { kind, code: DEFAULT_ERROR_BEFORE_OUTPUT_CODE };
    case 'error_after':
      return { kind, after, code: DEFAULT_ERROR_AFTER_CODE };
    case 'reset_after':
    case 'stall_after':
    case 'end_after':
    case 'malformed_after':
      return { kind, after };
    case 'oversized_after':
      return { kind, after, bytes: DEFAULT_OVERSIZED_BYTES };
    case 'reset_before_response':
    case 'no_done':
    case 'drop_finish':
    case 'data_after_done':
      return { kind };
  }
}
