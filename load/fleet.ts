/**
 * Fleet workloads: traffic shaped like a fleet's, for prefix caches and session-affine routing to act on.
 *
 * - `shared-prefix`: G groups, each with its own system prompt of P tokens, picked by a uniform or Zipf popularity,
 *   followed by a Q-token question unique to the request.
 * - `multi-turn`: sessions of T turns; each turn resends the conversation so far, the answer the client received and
 *   a new question, after a think time.
 *
 * Pure: every text and draw comes from the seed (and, for a session, its number), so the same seed sends the same
 * requests, whatever order the workers happen to take them in. Lengths are in the simulator's tokens (4 characters
 * a token of the concatenated message contents, src/sim/request.ts): P tokens are exactly 4P characters.
 */
import { createRandom, deriveSeed, type Random } from '../src/util/prng.js';
import type { PlannedRequest, Range, Workload } from './workload.js';

export const FLEET_KINDS = ['shared-prefix', 'multi-turn'] as const;
export type FleetKind = (typeof FLEET_KINDS)[number];
export type Popularity = 'uniform' | 'zipf';
export type ThinkTimeDist = 'exp' | 'fixed';

export interface SharedPrefixFleet {
  readonly kind: 'shared-prefix';
  readonly groups: number;
  readonly prefixTokens: number;
  readonly questionTokens: number;
  readonly popularity: Popularity;
  /** Zipf exponent: group k (from 0) is drawn with weight 1 / (k + 1)^s. */
  readonly zipfS: number;
  /**
   * Seed of the groups' system prompts when not the run's own: load processes with different seeds (their own
   * questions and draws) then share the same prefixes, as several clients of one application do.
   */
  readonly prefixSeed?: number | undefined;
}

export interface MultiTurnFleet {
  readonly kind: 'multi-turn';
  /** Concurrent sessions (the runner's closed loop). */
  readonly sessions: number;
  /** Turns per session, fixed or drawn per session. */
  readonly turns: Range;
  readonly prefixTokens: number;
  readonly questionTokens: number;
  readonly thinkTimeMs: number;
  readonly thinkTimeDist: ThinkTimeDist;
  /** A header carrying the session's stable id, when asked. */
  readonly sessionHeader: string | undefined;
}

export type Fleet = SharedPrefixFleet | MultiTurnFleet;

export interface ChatMessage {
  readonly role: 'system' | 'user' | 'assistant';
  readonly content: string;
}

/** Which group, session and turn a fleet request belongs to (the report groups by these). */
export interface FleetTag {
  readonly kind: FleetKind;
  readonly group?: number;
  readonly session?: number;
  readonly turn?: number;
}

export const CHARS_PER_TOKEN = 4;

/** Groups (and sessions) whose first token differs: leadToken's 4 base-36 characters. */
export const MAX_GROUPS = 36 ** 4;

// Salts keep the texts' streams apart from each other and from the run's own draws of the same seed.
const GROUP_SALT = 0x51a7e;
const QUESTION_SALT = 0x9e57;
const SESSION_SALT = 0x5e55;

const WORDS = ['alpha', 'bravo', 'charlie', 'delta', 'echo', 'foxtrot', 'golf', 'hotel', 'india', 'juliet', 'kilo', 'lima', 'mike', 'oscar', 'papa', 'tango'];

/**
 * Exactly `tokens` tokens of text (4 characters each) opening with `lead`, the rest seeded words. The lead is what
 * makes two texts differ from their first characters; callers keep it within the length.
 */
export function seededText(lead: string, tokens: number, random: Random): string {
  const length = tokens * CHARS_PER_TOKEN;
  const parts = [lead];
  let size = lead.length;
  while (size < length) {
    const word = WORDS[Math.floor(random() * WORDS.length)] ?? 'x';
    parts.push(word);
    size += word.length + 1;
  }
  return parts.join(' ').slice(0, length);
}

/**
 * A number as exactly one token (4 characters, base 36): the first token of every group's (or session's) text
 * differs, so no two share even their first prefix-cache block. Up to 36^4 ≈ 1.7 M distinct values.
 */
export function leadToken(n: number): string {
  return n.toString(36).padStart(CHARS_PER_TOKEN, '0').slice(-CHARS_PER_TOKEN);
}

/** Group `group`'s system prompt: P tokens, distinct per group from its first token, the same for the same seed. */
export function groupPrompt(seed: number, group: number, tokens: number): string {
  return seededText(leadToken(group), tokens, createRandom(deriveSeed(seed ^ GROUP_SALT, group)));
}

/** A question unique to `key` (a request index, or a session's turn): it opens with the key itself. */
export function questionText(seed: number, key: string, tokens: number, stream: number): string {
  return seededText(`q${key}`, tokens, createRandom(deriveSeed(seed ^ QUESTION_SALT, stream)));
}

/** Each group's probability: uniform, or Zipf (group 0 the most popular). They sum to 1. */
export function groupWeights(groups: number, popularity: Popularity, zipfS: number): number[] {
  const raw = Array.from({ length: groups }, (_, k) => (popularity === 'uniform' ? 1 : 1 / (k + 1) ** zipfS));
  const total = raw.reduce((a, b) => a + b, 0);
  return raw.map((w) => w / total);
}

/** The group a uniform draw in [0, 1) falls on, by cumulative weights; the last group takes the rounding rest. */
export function pickGroup(weights: readonly number[], roll: number): number {
  let cumulative = 0;
  for (let k = 0; k < weights.length; k++) {
    cumulative += weights[k] ?? 0;
    if (roll < cumulative) return k;
  }
  return Math.max(0, weights.length - 1);
}

const draw = (random: Random, range: Range) => range.min + Math.floor(random() * (range.max - range.min + 1));

/** Tokens of a chat prompt as the simulator counts them: ceil(characters of every content / 4). */
export function messagesTokens(messages: readonly ChatMessage[]): number {
  return Math.max(1, Math.ceil(messages.reduce((sum, m) => sum + m.content.length, 0) / CHARS_PER_TOKEN));
}

/** The plan of a fleet request: always a chat completion, usage asked for on every stream, no fault or cancel. */
function chatPlan(index: number, messages: readonly ChatMessage[], maxTokens: number, stream: boolean, simulator: boolean, fleet: FleetTag, headers?: Readonly<Record<string, string>>): PlannedRequest {
  return {
    index,
    route: 'chat_completions',
    stream,
    n: 1,
    promptTokens: messagesTokens(messages),
    maxTokens,
    // The cached-prompt ratio is read from usage, which a stream only carries when asked (a non-stream always).
    includeUsage: stream,
    simHeader: simulator ? `tokens=${maxTokens}` : undefined,
    fault: undefined,
    cancel: undefined,
    slow: undefined,
    messages,
    fleet,
    ...(headers === undefined ? {} : { headers }),
  };
}

/**
 * Shared-prefix request `index`. Draws from the run's `random` in a fixed order (group, stream, max_tokens); the
 * texts come from the seed, so the system prompt of a group is one string however many requests use it.
 */
export function planSharedPrefix(
  workload: Workload,
  fleet: SharedPrefixFleet,
  seed: number,
  random: Random,
  index: number,
  simulator: boolean,
  prompts: readonly string[],
  weights: readonly number[] = groupWeights(fleet.groups, fleet.popularity, fleet.zipfS),
): PlannedRequest {
  const group = pickGroup(weights, random());
  const stream = random() < workload.streamShare;
  const maxTokens = Math.max(1, draw(random, workload.outputTokens));
  const system = prompts[group] ?? groupPrompt(seed, group, fleet.prefixTokens);
  const messages: ChatMessage[] = [
    { role: 'system', content: system },
    { role: 'user', content: questionText(seed, String(index), fleet.questionTokens, index) },
  ];
  return chatPlan(index, messages, maxTokens, stream, simulator, { kind: 'shared-prefix', group });
}

/** Every group's system prompt, made once per run: from `fleet.prefixSeed` when given, else the run's seed. */
export function groupPrompts(seed: number, fleet: SharedPrefixFleet): string[] {
  const from = fleet.prefixSeed ?? seed;
  return Array.from({ length: fleet.groups }, (_, g) => groupPrompt(from, g, fleet.prefixTokens));
}

/** Everything about a session drawn up front from its own seeded stream: the same session is the same whoever runs it. */
export interface SessionPlan {
  readonly session: number;
  /** Stable per session (and seed): sent in `--session-header`. */
  readonly id: string;
  readonly system: string;
  readonly turns: number;
  /** Think time before turn k + 1 (after turn k's completion), ms. */
  readonly thinkMs: readonly number[];
  readonly stream: readonly boolean[];
  readonly maxTokens: readonly number[];
}

/** A think time: exactly the mean (`fixed`), or exponential with that mean (`exp`, a user reading and typing). */
export function thinkTime(dist: ThinkTimeDist, meanMs: number, roll: number): number {
  return dist === 'fixed' ? meanMs : -Math.log(1 - roll) * meanMs;
}

export function planSession(workload: Workload, fleet: MultiTurnFleet, seed: number, session: number): SessionPlan {
  const random = createRandom(deriveSeed(seed ^ SESSION_SALT, session));
  const turns = Math.max(1, draw(random, fleet.turns));
  const thinkMs: number[] = [];
  const stream: boolean[] = [];
  const maxTokens: number[] = [];
  for (let t = 0; t < turns; t++) {
    stream.push(random() < workload.streamShare);
    maxTokens.push(Math.max(1, draw(random, workload.outputTokens)));
    if (t + 1 < turns) thinkMs.push(thinkTime(fleet.thinkTimeDist, fleet.thinkTimeMs, random()));
  }
  return { session, id: `session-${seed}-${session}`, system: seededText(leadToken(session), fleet.prefixTokens, random), turns, thinkMs, stream, maxTokens };
}

/**
 * Turn k's messages: turn k − 1's, the answer the client received to it, and a new question (turn 0: the system
 * prompt and the first question). A session's messages grow by two per turn, so they are bounded by its turns.
 */
export function turnMessages(previous: readonly ChatMessage[] | undefined, answer: string, system: string, question: string): ChatMessage[] {
  if (previous === undefined) return [{ role: 'system', content: system }, { role: 'user', content: question }];
  return [...previous, { role: 'assistant', content: answer }, { role: 'user', content: question }];
}

/** The request of a session's turn, as request `index` of the run. */
export function planTurn(fleet: MultiTurnFleet, seed: number, session: SessionPlan, turn: number, messages: readonly ChatMessage[], index: number, simulator: boolean): PlannedRequest {
  const headers = fleet.sessionHeader === undefined ? undefined : { [fleet.sessionHeader]: session.id };
  return chatPlan(index, messages, session.maxTokens[turn] ?? 1, session.stream[turn] ?? true, simulator, { kind: 'multi-turn', session: session.session, turn }, headers);
}

/** The question of a session's turn: unique per session and turn. */
export function turnQuestion(seed: number, fleet: MultiTurnFleet, session: number, turn: number): string {
  return questionText(seed, `${leadToken(session)}.${turn}`, fleet.questionTokens, deriveSeed(session, turn));
}
