/**
 * Route records: what one cache_aware pick sent where (pool, upstream, the request's prefix blocks), as other
 * processes learn it — the workers of one gateway through the primary (src/app/primary.ts), gateway replicas through
 * Redis (src/routing/route-bus.ts). Pure: shapes and bounds, checked on every record another process sends.
 */

/** One pick's record: pool, upstream, the request's prefix blocks (53-bit hashes). */
export type RouteRecord = readonly [pool: string, upstream: string, blocks: readonly number[]];

/** Records per message and blocks per record a receiver accepts: more is not one of ours. */
export const MAX_ROUTES_PER_MESSAGE = 4096;
export const MAX_BLOCKS_PER_ROUTE = 65_536;

/** A route record's shape: two bounded names and an array of safe integers. */
export function isRoute(route: unknown): route is RouteRecord {
  if (!Array.isArray(route) || route.length !== 3) return false;
  const [pool, upstream, blocks] = route as unknown[];
  return typeof pool === 'string' && pool.length > 0 && pool.length <= 256 && typeof upstream === 'string' && upstream.length > 0 && upstream.length <= 256
    && Array.isArray(blocks) && blocks.length <= MAX_BLOCKS_PER_ROUTE && blocks.every((b) => Number.isSafeInteger(b));
}
