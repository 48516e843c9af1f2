/**
 * The hash of prefix-key.ts's blocks: two 32-bit multiply-xor lanes per character (cyrb53's mixing), finalised to a
 * 53-bit integer, each block's lanes started from the one before's, so a block's hash names its whole prefix. The
 * first block's seed folds in the prompt family, the model, `cache_salt` and the tools. Pure and bounded, like its
 * caller.
 */
import { isRecord } from '../util/json.js';
import type { PrefixBlocks } from './prefix-key.js';

/** Which template renders the prompt: a chat template (chat, Responses, Messages) or none (completions). */
export type Family = 'chat' | 'raw' | 'tokens';


const M1 = 0x9e3779b1; // 2654435761, golden ratio
const M2 = 0x5f356495;
const F1 = 0x85ebca77;
const F2 = 0xc2b2ae3d;

/** Two 32-bit lanes, the running state of one hash. */
interface Lanes {
  a: number;
  b: number;
}

/** cyrb53's finaliser, in place: both lanes avalanche into each other. */
function finalise(l: Lanes): void {
  let a = l.a;
  let b = l.b;
  a = Math.imul(a ^ (a >>> 16), F1) ^ Math.imul(b ^ (b >>> 13), F2);
  b = Math.imul(b ^ (b >>> 16), F1) ^ Math.imul(a ^ (a >>> 13), F2);
  l.a = a;
  l.b = b;
}

function to53(l: Lanes): number {
  return (l.b & 0x1fffff) * 0x100000000 + (l.a >>> 0);
}

function mixUnit(l: Lanes, unit: number): void {
  l.a = Math.imul(l.a ^ unit, M1);
  l.b = Math.imul(l.b ^ unit, M2);
}

/** Mixes a string and its length (so "ab"+"c" and "a"+"bc" differ in the seed), at most `limit` characters. */
function mixString(l: Lanes, s: string, limit: number): number {
  const n = Math.min(s.length, limit);
  for (let i = 0; i < n; i++) mixUnit(l, s.charCodeAt(i));
  mixUnit(l, 0x10000 + n); // above every UTF-16 unit: a separator no character can fake
  return n;
}

/**
 * The first block's chaining value: family, model, cache_salt, tools. Bounded by `maxParts` values and `maxChars`
 * characters, like the prompt.
 */
export function seed(family: Family, body: Record<string, unknown>, maxParts: number, maxChars: number): Lanes {
  const l: Lanes = { a: 0x2545f491, b: 0x4f6cdd1d };
  mixString(l, family, 16);
  mixString(l, typeof body.model === 'string' ? body.model : '', 1024);
  const salt = body.cache_salt;
  if (typeof salt === 'string' && salt !== '') {
    mixUnit(l, 0x10001);
    mixString(l, salt, 1024);
  }
  if (body.tools !== undefined && body.tools !== null) {
    mixUnit(l, 0x10002);
    mixValue(l, body.tools, { parts: maxParts, chars: maxChars }, 0);
  }
  finalise(l);
  return l;
}

/** A JSON value's structure and content, depth-first, within `budget` (shared across the walk). */
function mixValue(l: Lanes, value: unknown, budget: { parts: number; chars: number }, depth: number): void {
  if (budget.parts <= 0 || budget.chars <= 0 || depth > 16) return;
  budget.parts--;
  if (typeof value === 'string') {
    budget.chars -= mixString(l, value, budget.chars);
  } else if (typeof value === 'number') {
    mixUnit(l, 0x10003);
    mixUnit(l, value | 0);
    mixUnit(l, Math.floor(value / 0x100000000) | 0);
  } else if (typeof value === 'boolean') {
    mixUnit(l, value ? 0x10004 : 0x10005);
  } else if (Array.isArray(value)) {
    mixUnit(l, 0x10006);
    for (const item of value as readonly unknown[]) mixValue(l, item, budget, depth + 1);
    mixUnit(l, 0x10007);
  } else if (isRecord(value)) {
    mixUnit(l, 0x10008);
    for (const key in value) {
      if (!Object.hasOwn(value, key)) continue;
      budget.chars -= mixString(l, key, budget.chars);
      mixValue(l, value[key], budget, depth + 1);
      if (budget.parts <= 0) break;
    }
    mixUnit(l, 0x10009);
  } else {
    mixUnit(l, 0x1000a); // null and anything JSON cannot hold
  }
}

/**
 * Streams text (or token ids) into fixed-size blocks: block i's lanes start from block i−1's finalised lanes, so
 * h_i = H(h_{i−1}, block_i) and a changed block changes every later hash. No substring is ever taken.
 */
export class BlockHasher {
  private readonly blocks: number[] = [];
  private readonly turnEnds: number[] = [];
  private readonly lanes: Lanes;
  private filled = 0;
  private parts = 0;
  private truncated = false;
  /** maxBlocks are hashed: any further input only means the key is truncated. */
  private done = false;

  constructor(
    first: Lanes,
    private readonly blockSize: number,
    private readonly maxBlocks: number,
    private readonly maxParts: number,
  ) {
    this.lanes = { a: first.a, b: first.b };
  }

  /** Whether more input can still change the result. */
  open(): boolean {
    return !this.truncated;
  }

  /** Counts a part that contributes no text against the budget. */
  skip(): void {
    if (++this.parts > this.maxParts) this.truncated = true;
  }

  text(s: string): void {
    this.skip();
    if (this.truncated || s.length === 0) return;
    if (this.done) {
      this.truncated = true;
      return;
    }
    // The hot loop: a tight run up to the end of the block (or string) with the lanes in locals, then the block's
    // close — about 1.5 ns a character, against 4 with a fill check per character.
    const lanes = this.lanes;
    const size = this.blockSize;
    const n = s.length;
    let i = 0;
    while (i < n) {
      const end = Math.min(n, i + size - this.filled);
      let a = lanes.a;
      let b = lanes.b;
      for (let j = i; j < end; j++) {
        const c = s.charCodeAt(j);
        a = Math.imul(a ^ c, M1);
        b = Math.imul(b ^ c, M2);
      }
      lanes.a = a;
      lanes.b = b;
      this.filled += end - i;
      i = end;
      if (this.filled === size && !this.close(i < n)) return;
    }
  }

  /** One token id; false once the block budget is spent. */
  token(id: number): boolean {
    if (this.truncated) return false;
    if (this.done) {
      this.truncated = true;
      return false;
    }
    mixUnit(this.lanes, id | 0);
    mixUnit(this.lanes, Math.floor(id / 0x100000000) | 0);
    if (++this.filled === this.blockSize) this.close(false); // the next id, if any, finds `done` and truncates
    return true;
  }

  endTurn(): void {
    if (this.truncated) return;
    this.turnEnds.push(this.blocks.length);
    this.skip();
  }

  result(): PrefixBlocks {
    return { blocks: this.blocks, turnEnds: this.turnEnds, truncated: this.truncated };
  }

  /** Ends the current full block: its hash, then the next block chains on it. False once `maxBlocks` are hashed. */
  private close(more: boolean): boolean {
    const lanes = this.lanes;
    finalise(lanes); // the finalised lanes are both this block's hash and the next block's starting state
    this.blocks.push(to53(lanes));
    this.filled = 0;
    if (this.blocks.length < this.maxBlocks) return true;
    this.done = true;
    if (more) this.truncated = true;
    return false;
  }
}
