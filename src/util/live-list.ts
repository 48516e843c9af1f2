/**
 * What is in flight right now, for the life of the process: a list in insertion order whose removal, by the entry
 * `add` returned, is O(1) and leaves nothing in the list pointing at what was removed (nor the removed entry at the
 * list).
 *
 * Why not a Set: V8's young-generation collector (the scavenger) treats every pointer from the old generation as a
 * root, whether or not the old object holding it is still alive. A Set that lives for the process is in the old
 * generation, and so are the hash tables it grows and rehashes into (V8 allocates a rehashed table in the old table's
 * generation). With requests added and deleted all the time, its table is rehashed about every capacity/2 additions,
 * and each table it leaves behind is dead but still holds the entries it had then: every request in flight at that
 * moment. Those stay alive through every scavenge until the next full collection, so they are copied, then promoted,
 * then collected by a mark-compact seconds later. In the gateway, the set of exchanges in flight (http/lifecycle.ts) did
 * that to nearly every request: at 64 concurrent non-streaming requests, 2.40 MB promoted per scavenge (0.28 MB with
 * this list), a median scavenge of 19.5 ms (6.5), and a mark-compact every ~9 s (docs/performance.md, "Requests
 * promoted"; test/live-list-gc.test.ts shows it on V8's trace). A node here is young and dies with its request; taking
 * it out clears its links, so no dead node points into a request that is still young.
 *
 * Iterating sees the values in the list when the iteration began (its first `next()`), in insertion order, skipping
 * those removed since and not seeing those added since: a caller may remove (the current value or any other) while it
 * iterates.
 */

/** A value's place in its list: what `delete` takes. */
export interface LiveEntry<T> {
  readonly value: T;
}

class LiveNode<T> implements LiveEntry<T> {
  prev: LiveNode<T> | null = null;
  next: LiveNode<T> | null = null;
  /** The list the node is in; null once removed. */
  list: LiveList<T> | null;

  constructor(
    readonly value: T,
    list: LiveList<T>,
  ) {
    this.list = list;
  }
}

export class LiveList<T> implements Iterable<T> {
  private head: LiveNode<T> | null = null;
  private tail: LiveNode<T> | null = null;
  private count = 0;

  get size(): number {
    return this.count;
  }

  /** Appends `value` (a value may be in the list more than once, each with its own entry). */
  add(value: T): LiveEntry<T> {
    const node = new LiveNode(value, this);
    node.prev = this.tail;
    if (this.tail === null) this.head = node;
    else this.tail.next = node;
    this.tail = node;
    this.count++;
    return node;
  }

  /** Whether `entry` is in this list (it is from the time `add` returns it until it is deleted). */
  has(entry: LiveEntry<T>): boolean {
    return entry instanceof LiveNode && entry.list === this;
  }

  /** Takes `entry` out. False when it is not in this list (deleted already, or another list's). */
  delete(entry: LiveEntry<T>): boolean {
    if (!(entry instanceof LiveNode) || entry.list !== this) return false;
    const node = entry as LiveNode<T>;
    if (node.prev === null) this.head = node.next;
    else node.prev.next = node.next;
    if (node.next === null) this.tail = node.prev;
    else node.next.prev = node.prev;
    node.prev = null;
    node.next = null;
    node.list = null;
    this.count--;
    return true;
  }

  /** The oldest value in the list, or undefined when it is empty. */
  first(): T | undefined {
    return this.head?.value;
  }

  *[Symbol.iterator](): Iterator<T> {
    const nodes: LiveNode<T>[] = [];
    for (let node = this.head; node !== null; node = node.next) nodes.push(node);
    for (const node of nodes) if (node.list === this) yield node.value;
  }
}
