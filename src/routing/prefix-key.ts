/**
 * Prefix keys for cache-aware routing: the request's rendered prompt prefix cut into fixed-size blocks, each block's
 * hash chained on the one before, the way vLLM's prefix cache keys its KV blocks. Two requests whose first k blocks
 * hash the same very probably share their first k blocks of KV in an engine that served one of them.
 *
 * Pure and bounded: it reads the parsed JSON body in place (no rendered copy of the prompt is ever built), hashes at
 * most `maxBlocks` blocks and visits at most `maxParts` strings, and never throws on a body of any shape.
 *
 * Hash (block-hasher.ts): two 32-bit multiply-xor lanes per character (cyrb53's mixing), finalised to a 53-bit integer (a JS number,
 * so a Map key with no allocation). Not cryptographic: a client can craft collisions, which only costs it a worse
 * routing guess. For random inputs, a false match of one block against an index of N entries has probability about
 * N / 2^53 (2·10⁻¹¹ at 200 000 entries); any collision among N entries about N² / 2^54 (2·10⁻⁶ at 200 000).
 */
import type { ProxiedRoute } from '../accounting/outcomes.js';
import { BlockHasher, seed } from './block-hasher.js';

export interface PrefixKeyOptions {
  /**
   * Characters per block; default 64 ≈ 16 tokens at 4 characters a token, vLLM's default block of 16 tokens. The
   * simulator (src/sim/request.ts) tokenizes 4 characters a token and renders a chat prompt as its messages' texts
   * concatenated, exactly as here, so there one block is exactly one engine block.
   */
  readonly blockChars?: number;
  /** Token ids per block for a completions prompt given as token ids; default 16, vLLM's block size. */
  readonly blockTokens?: number;
  /** At most this many blocks are hashed (the start of the prompt); default 256 = 16 KiB of text. */
  readonly maxBlocks?: number;
  /** At most this many strings, messages and parts are visited, so a body of a million empty parts stays cheap; default 4096. */
  readonly maxParts?: number;
}

export interface PrefixBlocks {
  /**
   * The chained hash of each *full* block, first block first (53-bit integers). A trailing partial block is not
   * hashed: vLLM caches full blocks only, so it could never be a hit.
   */
  readonly blocks: readonly number[];
  /**
   * For each message but the last, the number of full blocks at its end (non-decreasing). Because hashes chain,
   * recording a prompt's blocks records every shorter prefix too, including each earlier turn's; turnEnds tells how
   * much of the prompt is the conversation so far (`reusableBlocks`), which is what a follow-up turn can hit.
   */
  readonly turnEnds: readonly number[];
  /** Whether the prompt went on past `maxBlocks` (or `maxParts`): the blocks are its start only. */
  readonly truncated: boolean;
}

const EMPTY: PrefixBlocks = Object.freeze({ blocks: Object.freeze([]), turnEnds: Object.freeze([]), truncated: false });

const DEFAULTS = { blockChars: 64, blockTokens: 16, maxBlocks: 256, maxParts: 4096 } as const;


/**
 * The prefix blocks of a request on `route` with the parsed JSON `body`. Routes without a generated prompt (pooling,
 * audio, the store routes) and bodies of the wrong shape give no blocks.
 *
 * What is rendered, in order (each message's text; roles and template tokens are not, as in the simulator):
 * - chat_completions: every message's string content, or its parts' `text`, and an assistant's tool calls' names
 *   and arguments (system and tool messages are messages like any other);
 * - completions: the prompt string; a list of prompts keys on its first (vLLM runs each as its own sequence, and
 *   they all go to one upstream); token ids are cut into blocks of `blockTokens` ids, aligned with vLLM's blocks;
 * - responses: `instructions` (rendered first, as the system message), then `input` (a string, or each item's text,
 *   tool output and call arguments);
 * - messages (Anthropic): `system`, then each message's text blocks and tool results' text.
 * The first block's hash folds in the prompt family, the model, vLLM's `cache_salt` (vLLM folds it into its first
 * block, so differently salted requests never share KV) and the `tools` definitions (templates render them before
 * the messages; folded into the seed rather than the text so the blocks stay aligned with the message text).
 */
export function prefixBlocks(route: ProxiedRoute, body: unknown, options: PrefixKeyOptions = {}): PrefixBlocks {
  if (!isRecord(body)) return EMPTY;
  const blockChars = positiveInt(options.blockChars, DEFAULTS.blockChars);
  const blockTokens = positiveInt(options.blockTokens, DEFAULTS.blockTokens);
  const maxBlocks = positiveInt(options.maxBlocks, DEFAULTS.maxBlocks);
  const maxParts = positiveInt(options.maxParts, DEFAULTS.maxParts);
  switch (route) {
    case 'chat_completions': {
      const { messages } = body;
      if (!Array.isArray(messages)) return EMPTY;
      const h = new BlockHasher(seed('chat', body, maxParts, blockChars * maxBlocks), blockChars, maxBlocks, maxParts);
      feedTurns(h, messages, chatMessage);
      return h.result();
    }
    case 'completions':
      return completionBlocks(body, blockChars, blockTokens, maxBlocks, maxParts);
    case 'responses': {
      const h = new BlockHasher(seed('chat', body, maxParts, blockChars * maxBlocks), blockChars, maxBlocks, maxParts);
      const { instructions, input } = body;
      if (typeof instructions === 'string' && instructions !== '') {
        h.text(instructions);
        h.endTurn();
      }
      if (typeof input === 'string') h.text(input);
      else if (Array.isArray(input)) feedTurns(h, input, responsesItem);
      else return EMPTY;
      return h.result();
    }
    case 'messages': {
      const { messages } = body;
      if (!Array.isArray(messages)) return EMPTY;
      const h = new BlockHasher(seed('chat', body, maxParts, blockChars * maxBlocks), blockChars, maxBlocks, maxParts);
      const { system } = body;
      if (typeof system === 'string' ? system !== '' : Array.isArray(system)) {
        textOrBlocks(h, system);
        h.endTurn();
      }
      feedTurns(h, messages, anthropicMessage);
      return h.result();
    }
    // No generated prompt, or none vLLM prefix-caches across requests: nothing to route on.
    case 'embeddings':
    case 'pooling':
    case 'classify':
    case 'score':
    case 'rerank':
    case 'tokenize':
    case 'detokenize':
    case 'transcriptions':
    case 'translations':
    case 'responses_retrieve':
    case 'responses_cancel':
    case 'count_tokens':
    case 'passthrough':
      return EMPTY;
  }
}

/** The blocks a follow-up turn can hit: the prompt up to the end of its last earlier message. */
export function reusableBlocks(key: PrefixBlocks): number {
  return key.turnEnds.length === 0 ? 0 : (key.turnEnds[key.turnEnds.length - 1] ?? 0);
}

function completionBlocks(body: Record<string, unknown>, blockChars: number, blockTokens: number, maxBlocks: number, maxParts: number): PrefixBlocks {
  let prompt = body.prompt;
  // A list of prompts (strings or token-id lists) keys on its first; a flat list of numbers is one token-id prompt.
  if (Array.isArray(prompt) && prompt.length > 0 && typeof prompt[0] !== 'number') prompt = prompt[0];
  if (typeof prompt === 'string') {
    const h = new BlockHasher(seed('raw', body, maxParts, blockChars * maxBlocks), blockChars, maxBlocks, maxParts);
    h.text(prompt);
    return h.result();
  }
  if (!Array.isArray(prompt)) return EMPTY;
  const h = new BlockHasher(seed('tokens', body, maxParts, blockChars * maxBlocks), blockTokens, maxBlocks, maxParts);
  for (const id of prompt as readonly unknown[]) {
    // vLLM refuses a non-integer id; the key just stops there rather than guess.
    if (typeof id !== 'number' || !Number.isInteger(id) || !h.token(id)) break;
  }
  return h.result();
}

/** Feeds each item of a turn list, marking the end of every item but the last. */
function feedTurns(h: BlockHasher, items: readonly unknown[], feed: (h: BlockHasher, item: unknown) => void): void {
  const last = items.length - 1;
  for (let i = 0; i <= last && h.open(); i++) {
    feed(h, items[i]);
    if (i < last) h.endTurn();
  }
}

function chatMessage(h: BlockHasher, message: unknown): void {
  if (!isRecord(message)) return;
  textOrParts(h, message.content);
  const calls = message.tool_calls;
  if (!Array.isArray(calls)) return;
  for (const call of calls as readonly unknown[]) {
    if (!h.open()) return;
    const fn = isRecord(call) ? call.function : undefined;
    if (!isRecord(fn)) continue;
    if (typeof fn.name === 'string') h.text(fn.name);
    if (typeof fn.arguments === 'string') h.text(fn.arguments);
  }
}

function responsesItem(h: BlockHasher, item: unknown): void {
  if (typeof item === 'string') {
    h.text(item);
    return;
  }
  if (!isRecord(item)) return;
  textOrParts(h, item.content);
  if (typeof item.output === 'string') h.text(item.output);
  if (typeof item.arguments === 'string') h.text(item.arguments);
}

function anthropicMessage(h: BlockHasher, message: unknown): void {
  if (!isRecord(message)) return;
  const { content } = message;
  if (typeof content === 'string') {
    h.text(content);
    return;
  }
  if (!Array.isArray(content)) return;
  for (const block of content as readonly unknown[]) {
    if (!h.open()) return;
    if (!isRecord(block)) continue;
    if (typeof block.text === 'string') h.text(block.text);
    // A tool result's content is a string or text blocks of its own (one level, no deeper).
    else if (block.type === 'tool_result') textOrBlocks(h, block.content);
  }
}

/** A string, or a list of parts whose `text` strings count (OpenAI content parts). */
function textOrParts(h: BlockHasher, content: unknown): void {
  if (typeof content === 'string') h.text(content);
  else if (Array.isArray(content)) textOrBlocks(h, content);
}

function textOrBlocks(h: BlockHasher, value: unknown): void {
  if (typeof value === 'string') {
    h.text(value);
    return;
  }
  if (!Array.isArray(value)) return;
  for (const part of value as readonly unknown[]) {
    if (!h.open()) return;
    if (isRecord(part) && typeof part.text === 'string') h.text(part.text);
    else h.skip();
  }
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function positiveInt(value: number | undefined, fallback: number): number {
  return value !== undefined && Number.isInteger(value) && value > 0 ? value : fallback;
}
