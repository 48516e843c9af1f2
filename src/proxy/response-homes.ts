/**
 * Where a stored response lives. vLLM keeps stored and background responses in the memory of the one process that
 * generated them (docs/routes.md), so `GET /v1/responses/{id}` and `/cancel` must reach that process. Waybill
 * remembers the upstream of every response id it relayed (a bounded map, least recent forgotten) and, for an id it
 * does not know — another gateway replica relayed it, or this one restarted — asks every upstream at once; a 404
 * from all of them is the answer.
 */
import type { Upstream, UpstreamRegistry } from './upstreams.js';

/** A response id as vLLM makes them (`resp_<hex>`, or the client's `request_id`): a bounded, path-safe token. */
const RESPONSE_ID = /^[A-Za-z0-9._:-]{1,256}$/;

export function isResponseId(id: string): boolean {
  // Not `.` or `..`: a proxy on the way that normalises paths would turn them into another path.
  return RESPONSE_ID.test(id) && !/^\.+$/.test(id);
}

/** Lookups (a GET to every upstream each) in flight at once; past it a request is refused, not queued. */
export const MAX_LOOKUPS = 32;

export class ResponseHomes {
  /** Response id → upstream name, least recently used first. */
  private readonly homes = new Map<string, string>();
  private lookups = 0;

  constructor(
    private readonly capacity: number,
    private readonly lookupTimeoutMs: number,
  ) {}

  get size(): number {
    return this.homes.size;
  }

  learn(responseId: string, upstream: string): void {
    if (this.capacity === 0 || !isResponseId(responseId)) return;
    this.homes.delete(responseId);
    this.homes.set(responseId, upstream);
    if (this.homes.size > this.capacity) {
      const oldest = this.homes.keys().next();
      if (oldest.done !== true) this.homes.delete(oldest.value);
    }
  }

  /** Its home no longer holds it (a 404 there): the next request asks every upstream again. */
  forget(responseId: string): void {
    this.homes.delete(responseId);
  }

  /**
   * The upstream holding `responseId`: the remembered one, or the first that answers it with a 2xx (an error is no
   * answer: a 503 or a 401 says nothing about where the response lives); undefined if none does; 'busy' when
   * MAX_LOOKUPS are already in flight.
   */
  async find(responseId: string, registry: UpstreamRegistry): Promise<Upstream | undefined | 'busy'> {
    const all = distinct(registry.upstreams);
    const known = this.homes.get(responseId);
    const remembered = known === undefined ? undefined : all.find((upstream) => upstream.name === known);
    if (remembered !== undefined) {
      this.learn(responseId, remembered.name);
      return remembered;
    }
    if (this.lookups >= MAX_LOOKUPS) return 'busy';
    this.lookups++;
    try {
      const path = `/v1/responses/${encodeURIComponent(responseId)}`;
      const answers = await Promise.all(
        all.map(async (upstream) => {
          try {
            const status = await upstream.lookup(path, this.lookupTimeoutMs);
            return status >= 200 && status < 300 ? upstream : undefined;
          } catch {
            return undefined;
          }
        }),
      );
      const home = answers.find((upstream) => upstream !== undefined);
      if (home !== undefined) this.learn(responseId, home.name);
      return home;
    } finally {
      this.lookups--;
    }
  }
}

function distinct(upstreams: readonly Upstream[]): Upstream[] {
  const seen = new Set<string>();
  return upstreams.filter((upstream) => !seen.has(upstream.name) && seen.add(upstream.name) !== undefined);
}
