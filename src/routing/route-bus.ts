/**
 * Route sharing between gateway replicas through Redis pub/sub (docs/routing.md, "Across replicas"): each cache_aware
 * pick's record (pool, upstream, prefix blocks) is published, batched per event-loop turn, on one channel; every
 * replica subscribed to it records what the others sent in its own prefix index. Fails open: with Redis down or slow,
 * nothing waits for it — a publish that cannot be written is dropped and counted, and the local index serves alone.
 *
 * What is received is another process's word: a message larger than MAX_MESSAGE_CHARS, not JSON, or not of the
 * shape below is dropped whole and counted; records are checked one by one (src/routing/route-records.ts). A
 * replica's own messages (its random id) are ignored.
 */
import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { RouteBatch } from './route-batch.js';
import { isRoute, MAX_ROUTES_PER_MESSAGE, type RouteRecord } from './route-records.js';

/** What happened to a message: closed, the `result` label of waybill_routing_shared_messages_total. */
export { ROUTE_SHARE_RESULTS } from '../telemetry/labels.js';
import type { RouteShareResult } from '../telemetry/labels.js';

/** The longest message read: 4 096 records of 256 blocks of 16-digit hashes is about 70 MB; ours are far smaller. */
export const MAX_MESSAGE_CHARS = 8 * 1024 * 1024;

export interface RouteBusOptions {
  readonly url: string;
  readonly password?: string | undefined;
  readonly channel: string;
  /** Another replica's record: record it (UpstreamRegistry.learnRoute). */
  readonly onRoute: (pool: string, upstream: string, blocks: readonly number[]) => void;
  readonly onResult?: (result: RouteShareResult) => void;
  readonly onError?: (error: unknown) => void;
}

interface Message {
  readonly from: string;
  readonly routes: readonly RouteRecord[];
}

export class RouteBus {
  /** This process's id on the channel: its own messages come back to it and are ignored. */
  readonly id = randomUUID();
  private readonly publisher: Redis;
  private readonly subscriber: Redis;
  private readonly batch = new RouteBatch((routes) => this.send(routes));
  private closed = false;

  constructor(private readonly options: RouteBusOptions) {
    const common = {
      ...(options.password !== undefined && { password: options.password }),
      connectionName: 'waybill-routes',
      // Reconnects in the background; the subscriber resubscribes by itself.
      retryStrategy: (times: number) => Math.min(times * 100, 1000),
    };
    // A publish never waits for a connection: dropped at once when Redis is away (fail open).
    this.publisher = new Redis(options.url, { ...common, enableOfflineQueue: false, maxRetriesPerRequest: 0 });
    this.subscriber = new Redis(options.url, common);
    for (const client of [this.publisher, this.subscriber]) client.on('error', (error: Error) => options.onError?.(error));
    this.subscriber.subscribe(options.channel).catch((error: unknown) => options.onError?.(error));
    this.subscriber.on('message', (channel: string, text: string) => {
      if (channel === options.channel) this.received(text);
    });
  }

  /** Resolves when the subscription is in place (tests; the gateway does not wait for it). */
  async ready(): Promise<void> {
    for (;;) {
      const [, subscribers] = (await this.publisher.call('PUBSUB', 'NUMSUB', this.options.channel)) as [string, number];
      if (Number(subscribers) > 0 && this.subscriber.status === 'ready') return;
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  }

  /** This process sent `blocks` to `upstream` of `pool`: published with the turn's other picks. */
  share(pool: string, upstream: string, blocks: readonly number[]): void {
    if (!this.closed) this.batch.push(pool, upstream, blocks);
  }

  async close(): Promise<void> {
    this.closed = true;
    this.batch.clear();
    this.publisher.disconnect();
    this.subscriber.disconnect();
    await Promise.resolve();
  }

  private send(routes: readonly RouteRecord[]): void {
    const message: Message = { from: this.id, routes };
    this.publisher.publish(this.options.channel, JSON.stringify(message)).then(
      () => this.options.onResult?.('sent'),
      () => this.options.onResult?.('send_failed'),
    );
  }

  private received(text: string): void {
    let message: unknown;
    try {
      message = text.length > MAX_MESSAGE_CHARS ? undefined : JSON.parse(text);
    } catch {
      message = undefined;
    }
    if (!isMessage(message)) {
      this.options.onResult?.('invalid');
      return;
    }
    if (message.from === this.id) return;
    this.options.onResult?.('received');
    for (const route of message.routes) if (isRoute(route)) this.options.onRoute(route[0], route[1], route[2]);
  }
}

function isMessage(value: unknown): value is Message {
  if (value === null || typeof value !== 'object') return false;
  const { from, routes } = value as { from?: unknown; routes?: unknown };
  return typeof from === 'string' && from.length > 0 && from.length <= 64 && Array.isArray(routes) && routes.length <= MAX_ROUTES_PER_MESSAGE;
}
