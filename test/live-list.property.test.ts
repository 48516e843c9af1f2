/**
 * The in-flight list (src/util/live-list.ts) against a model — an array of the entries added and not yet deleted —
 * on random sequences of adds, deletes (of entries in the list, deleted already, or another list's) and iterations
 * that delete as they go; and the shape the module's reason needs: an entry taken out keeps no links (to the list or
 * its neighbours), and nothing in the list points at it. That the shape does what it is for — a request in flight is
 * not promoted through the list — is test/live-list-gc.test.ts, on V8's own trace.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { LiveList, type LiveEntry } from '../src/util/live-list.js';

/** The links of an entry, which the list keeps private. */
interface Links {
  prev: unknown;
  next: unknown;
  list: unknown;
}
const links = (entry: LiveEntry<number>): Links => entry as unknown as Links;

type Op =
  | { kind: 'add'; value: number }
  | { kind: 'delete'; pick: number }
  | { kind: 'delete_stale'; pick: number }
  | { kind: 'delete_foreign' }
  | { kind: 'iterate'; deleteEvery: number };

const op: fc.Arbitrary<Op> = fc.oneof(
  { weight: 4, arbitrary: fc.record({ kind: fc.constant('add' as const), value: fc.integer({ min: 0, max: 5 }) }) },
  { weight: 3, arbitrary: fc.record({ kind: fc.constant('delete' as const), pick: fc.nat() }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('delete_stale' as const), pick: fc.nat() }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('delete_foreign' as const) }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('iterate' as const), deleteEvery: fc.integer({ min: 0, max: 3 }) }) },
);

describe('LiveList', () => {
  it('holds what a model holds, in insertion order, whatever is added, deleted and iterated', () => {
    fc.assert(
      fc.property(fc.array(op, { maxLength: 200 }), (ops) => {
        const list = new LiveList<number>();
        const other = new LiveList<number>();
        const foreign = other.add(-1);
        let model: LiveEntry<number>[] = [];
        const removed: LiveEntry<number>[] = [];
        for (const o of ops) {
          switch (o.kind) {
            case 'add':
              model.push(list.add(o.value));
              break;
            case 'delete': {
              if (model.length === 0) break;
              const entry = model[o.pick % model.length] as LiveEntry<number>;
              expect(list.delete(entry)).toBe(true);
              model = model.filter((e) => e !== entry);
              removed.push(entry);
              break;
            }
            case 'delete_stale': {
              if (removed.length === 0) break;
              expect(list.delete(removed[o.pick % removed.length] as LiveEntry<number>)).toBe(false);
              break;
            }
            case 'delete_foreign':
              expect(list.delete(foreign)).toBe(false);
              expect(other.has(foreign)).toBe(true);
              break;
            case 'iterate': {
              // Values in the list when the iteration began, skipping those deleted since (here: every n-th one
              // ahead of the current, and the current itself).
              const seen: number[] = [];
              const expected: number[] = [];
              const snapshot = [...model];
              const gone = new Set<LiveEntry<number>>();
              let i = 0;
              for (const value of list) {
                while (gone.has(snapshot[i] as LiveEntry<number>)) i++;
                seen.push(value);
                expected.push((snapshot[i] as LiveEntry<number>).value);
                if (o.deleteEvery > 0 && i % o.deleteEvery === 0) {
                  const ahead = snapshot[i + 1];
                  if (ahead !== undefined && !gone.has(ahead)) {
                    list.delete(ahead);
                    gone.add(ahead);
                  }
                  list.delete(snapshot[i] as LiveEntry<number>);
                  gone.add(snapshot[i] as LiveEntry<number>);
                }
                i++;
              }
              expect(seen).toEqual(expected);
              model = model.filter((e) => !gone.has(e));
              removed.push(...gone);
              break;
            }
          }
          expect(list.size).toBe(model.length);
          expect(list.first()).toBe(model[0]?.value);
          expect([...list]).toEqual(model.map((e) => e.value));
          for (const entry of model) expect(list.has(entry)).toBe(true);
        }
        for (const entry of removed) {
          expect(list.has(entry)).toBe(false);
          expect(links(entry)).toMatchObject({ prev: null, next: null, list: null });
        }
        // Nothing in the list points at a removed entry.
        const inList = new Set<unknown>(model);
        for (const entry of model) {
          const { prev, next } = links(entry);
          if (prev !== null) expect(inList.has(prev)).toBe(true);
          if (next !== null) expect(inList.has(next)).toBe(true);
        }
      }),
      { numRuns: 300 },
    );
  });

  it('keeps a value added twice as two entries, each deleted on its own', () => {
    const list = new LiveList<string>();
    const a = list.add('x');
    const b = list.add('x');
    expect(list.size).toBe(2);
    expect(list.delete(a)).toBe(true);
    expect([...list]).toEqual(['x']);
    expect(list.has(b)).toBe(true);
    expect(list.delete(a)).toBe(false);
    expect(list.delete(b)).toBe(true);
    expect(list.size).toBe(0);
    expect(list.first()).toBeUndefined();
  });
});
