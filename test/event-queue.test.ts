/**
 * The exchange's queue of events that come while a step runs (src/proxy/event-queue.ts): in order, each with when it
 * happened, and the time handed to the machine never going back.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { EventQueue } from '../src/proxy/event-queue.js';

describe('EventQueue', () => {
  it('gives the events back in the order they came, each with its own time', () => {
    const queue = new EventQueue<string>();
    queue.push('client_blocked', 5);
    queue.push('block', 3);
    queue.push('chunk_done', 3);
    const out: Array<[string, number]> = [];
    for (let event = queue.shift(); event !== undefined; event = queue.shift()) out.push([event, queue.at]);
    expect(out).toEqual([
      ['client_blocked', 5],
      ['block', 3],
      ['chunk_done', 3],
    ]);
    expect(queue.length).toBe(0);
  });

  it('the clock it hands out is the latest time so far: never below an earlier one, equal to the time when later', () => {
    fc.assert(
      fc.property(fc.array(fc.double({ min: -1e6, max: 1e6, noNaN: true }), { maxLength: 50 }), (times) => {
        const queue = new EventQueue<number>();
        let latest = -Infinity;
        for (const at of times) {
          const handed = queue.clock(at);
          latest = Math.max(latest, at);
          // Compared as numbers: after 0, a -0 is the same time (the clock hands it out as it came), though toBe's
          // Object.is tells it from the 0 Math.max keeps. fast-check's doubles include -0 (seed -1294907920, path 65:9).
          expect(handed === latest, `handed ${String(handed)} for ${String(at)}, the latest so far ${String(latest)}`).toBe(true);
        }
      }),
    );
  });
});
