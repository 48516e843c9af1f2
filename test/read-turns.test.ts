/**
 * Fair under saturation (src/proxy/read-turns.ts): answering streams share a CPU budget per event-loop turn and
 * yield past it. The bookkeeping with a hand-driven turn; then a gateway whose budget is so small that every
 * answering read yields, which must still deliver every stream whole, in order, and count the yields.
 */
import type { IncomingMessage } from 'node:http';
import { request as httpRequest } from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import { ReadTurns, type Yielding } from '../src/proxy/read-turns.js';
import { choiceText } from '../src/sim/wire.js';
import { CHAT, eventData, startStack, type Stack } from './helpers/stack.js';

class Stream implements Yielding {
  finished = false;
  resumed = 0;
  constructor(private readonly onResume: () => void = () => undefined) {}
  resumeTurn(): void {
    this.resumed++;
    this.onResume();
  }
}

/** A ReadTurns whose end of turn runs when the test says. */
function manual(): { turns: ReadTurns; endTurn: () => void; pending: () => number; yields: () => number } {
  const queue: Array<() => void> = [];
  let yields = 0;
  const turns = new ReadTurns({ defer: (callback) => queue.push(callback), onYield: () => yields++ });
  return {
    turns,
    endTurn: () => {
      const due = queue.splice(0);
      for (const callback of due) callback();
    },
    pending: () => queue.length,
    yields: () => yields,
  };
}

describe('ReadTurns', () => {
  it('says yield only once the turn has spent more than its budget, and starts afresh each turn', () => {
    const { turns, endTurn } = manual();
    expect(turns.spent(0.8, 2)).toBe(false);
    expect(turns.spent(1.2, 2)).toBe(false);
    expect(turns.spent(0.1, 2)).toBe(true);
    endTurn();
    expect(turns.spent(1.9, 2)).toBe(false);
  });

  it('never yields with budget 0', () => {
    const { turns } = manual();
    expect(turns.spent(1000, 0)).toBe(false);
  });

  it('resumes yielded streams at the end of the turn in the order they yielded, skipping finished ones', () => {
    const { turns, endTurn, yields } = manual();
    const order: string[] = [];
    const a = new Stream(() => order.push('a'));
    const b = new Stream(() => order.push('b'));
    const c = new Stream(() => order.push('c'));
    turns.spent(5, 2);
    turns.yield(a, 2);
    turns.yield(b, 2);
    turns.yield(c, 2);
    b.finished = true;
    expect(yields()).toBe(3);
    expect(order).toEqual([]);
    endTurn();
    expect(order).toEqual(['a', 'c']);
    expect(turns.yielded).toBe(0);
  });

  it('resumes only while the new turn has budget left; the rest wait for the turn after', () => {
    const { turns, endTurn, pending } = manual();
    // Each resumed stream reads 1.5 ms at once; the budget is 2 ms: two fit in a turn (the second ends past it).
    const streams = [0, 1, 2, 3].map(() => new Stream(() => turns.spent(1.5, 2)));
    turns.spent(3, 2);
    for (const stream of streams) turns.yield(stream, 2);
    endTurn();
    expect(streams.map((s) => s.resumed)).toEqual([1, 1, 0, 0]);
    expect(pending()).toBe(1);
    endTurn();
    expect(streams.map((s) => s.resumed)).toEqual([1, 1, 1, 1]);
    expect(turns.yielded).toBe(0);
  });

  it('a resume that throws does not strand the streams behind it', () => {
    const { turns, endTurn, pending } = manual();
    const broken = new Stream(() => {
      throw new Error('resume failed');
    });
    const after = new Stream();
    turns.spent(3, 2);
    turns.yield(broken, 2);
    turns.yield(after, 2);
    expect(endTurn).toThrow('resume failed');
    expect(pending()).toBe(1);
    endTurn();
    expect(after.resumed).toBe(1);
  });

  it('a resumed stream that yields again goes to the back, behind those still waiting', () => {
    const { turns, endTurn } = manual();
    const order: string[] = [];
    let first = true;
    const again: Stream = new Stream(() => {
      order.push('again');
      if (first) {
        first = false;
        turns.spent(10, 2);
        turns.yield(again, 2);
      }
    });
    const other = new Stream(() => order.push('other'));
    turns.spent(3, 2);
    turns.yield(again, 2);
    turns.yield(other, 2);
    endTurn();
    // `again` spent the new turn's budget: `other` waits for the next turn, then `again` follows it.
    expect(order).toEqual(['again']);
    endTurn();
    expect(order).toEqual(['again', 'other', 'again']);
  });
});

describe('a gateway whose answering streams yield at every read', () => {
  let stack: Stack | undefined;
  afterEach(async () => {
    await stack?.close();
    stack = undefined;
  });

  // ~110 KB per answer: more than one 64 KiB socket read even when a loaded machine lets it all pile up, so every stream
  // has a read after its first write (its reads from then on are answering reads).
  const TOKENS = 1000;

  /** Streams one chat completion with the raw client, optionally pausing it once mid-stream. */
  function stream(base: string, pauseMs = 0): Promise<string> {
    const body = JSON.stringify({ ...CHAT, stream: true });
    return new Promise((resolve, reject) => {
      const req = httpRequest(`${base}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' } }, (res: IncomingMessage) => {
        let text = '';
        let paused = pauseMs === 0;
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          text += chunk;
          if (!paused && text.length > 4096) {
            paused = true;
            res.pause();
            setTimeout(() => res.resume(), pauseMs);
          }
        });
        res.on('end', () => resolve(text));
        res.on('error', reject);
      });
      req.on('error', reject);
      req.end(body);
    });
  }

  it('delivers every stream whole and in order, and counts the yields', async () => {
    // 1 µs per turn: every read of an answering stream ends past it and yields.
    stack = await startStack({ sim: { ttftMs: 1, itlMs: 0, outputTokens: TOKENS }, config: { streaming: { turn_budget: '0.001ms' } } });
    const s = stack;
    // Twelve clients, three streams each one after the other, so new streams keep arriving while others answer; one
    // client also stops reading for 50 ms in each of its streams.
    const client = async (pauseMs: number) => {
      const bodies: string[] = [];
      for (let i = 0; i < 3; i++) bodies.push(await stream(s.base, pauseMs));
      return bodies;
    };
    const bodies = (await Promise.all([...Array.from({ length: 11 }, () => client(0)), client(50)])).flat();
    expect(bodies).toHaveLength(36);
    for (const body of bodies) {
      const data = eventData(body);
      expect(data[data.length - 1]).toBe('[DONE]');
      const chunks = data.slice(0, -1).map((d) => JSON.parse(d) as { choices: Array<{ delta: { content?: string }; finish_reason: string | null }> });
      // The role chunk, one chunk per token, the finish: nothing lost, nothing doubled.
      const contents = chunks.map((c) => c.choices[0]?.delta.content ?? '').filter((t) => t !== '');
      expect(contents).toHaveLength(TOKENS);
      // In order: the simulator's words for choice 0, as it sent them.
      expect(contents.join('')).toBe(choiceText(0, 0, TOKENS));
      expect(chunks[chunks.length - 1]?.choices[0]?.finish_reason).toBe('stop');
    }
    const settled = await s.settled(36);
    expect(settled.map((x) => x.outcome)).toEqual(Array(36).fill('delivered'));
    // At least one yield per stream: every stream has an answering read, and each ends past a 1 µs budget.
    expect(await s.metric('waybill_turn_yields_total')).toBeGreaterThanOrEqual(36);
  });

  it('with turn_budget 0 nobody yields, on the same workload', async () => {
    stack = await startStack({ sim: { ttftMs: 1, itlMs: 0, outputTokens: TOKENS }, config: { streaming: { turn_budget: 0 } } });
    const s = stack;
    const client = async () => {
      for (let i = 0; i < 3; i++) await stream(s.base);
    };
    await Promise.all(Array.from({ length: 12 }, () => client()));
    const settled = await s.settled(36);
    expect(settled.map((x) => x.outcome)).toEqual(Array(36).fill('delivered'));
    expect(await s.metric('waybill_turn_yields_total')).toBe(0);
  });
});
