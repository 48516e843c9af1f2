/**
 * The events that come to a request's exchange while it carries out a step's effects (proxy/exchange.ts): a write
 * that fills the client's socket, an attempt that reads on when resumed. Each waits its turn with the time it
 * happened, and the time handed to the delivery machine never goes back — an upstream read's events carry the read's
 * start, which an event queued inside that read (stamped as it came) may have passed.
 */
export class EventQueue<E> {
  private readonly events: E[] = [];
  private readonly stamps: number[] = [];
  private lastAt = -Infinity;
  /** When the event `shift` returned last happened. */
  at = 0;

  get length(): number {
    return this.events.length;
  }

  push(event: E, at: number): void {
    this.events.push(event);
    this.stamps.push(at);
  }

  /** The oldest waiting event (its time in `at`), or undefined. */
  shift(): E | undefined {
    const event = this.events.shift();
    if (event !== undefined) this.at = this.stamps.shift() as number;
    return event;
  }

  /** The time to hand the machine for an event that happened `at`: `at`, or the latest handed out when that is later. */
  clock(at: number): number {
    if (at < this.lastAt) return this.lastAt;
    this.lastAt = at;
    return at;
  }
}
