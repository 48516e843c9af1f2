/**
 * Route records on their way to other processes (the workers' relay through the primary, replicas' Redis channel):
 * batched per event-loop turn, so a turn with many picks sends one message, and sent early in messages of at most
 * MAX_ROUTES_PER_MESSAGE, which is what a receiver accepts.
 */
import { MAX_ROUTES_PER_MESSAGE, type RouteRecord } from './route-records.js';

export class RouteBatch {
  private batch: RouteRecord[] = [];
  private flush: NodeJS.Immediate | undefined;

  constructor(private readonly send: (routes: RouteRecord[]) => void) {}

  push(pool: string, upstream: string, blocks: readonly number[]): void {
    this.batch.push([pool, upstream, blocks]);
    if (this.batch.length >= MAX_ROUTES_PER_MESSAGE) {
      this.sendNow();
      return;
    }
    this.flush ??= setImmediate(() => {
      this.flush = undefined;
      this.sendNow();
    });
  }

  /** Drops what is not sent yet (closing). */
  clear(): void {
    if (this.flush !== undefined) clearImmediate(this.flush);
    this.flush = undefined;
    this.batch = [];
  }

  private sendNow(): void {
    const routes = this.batch;
    this.batch = [];
    if (routes.length > 0) this.send(routes);
  }
}
