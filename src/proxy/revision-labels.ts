/**
 * Which revisions are metric label values (`revision` on the SLO counter, output checks, finish reasons, TPOT and
 * waybill_upstream_revision_info): every configured one (pools[].upstreams[].revision), and revisions read from an
 * upstream's `GET /version` up to discovery.max_revisions_per_pool per pool, for the life of the process. A revision
 * once admitted keeps its label; one read after its pool's cap is full is counted under `_other`. So a fleet that
 * rolls a new vLLM build every hour, or an upstream whose /version answers something new at every read, cannot grow
 * /metrics without bound (docs/metrics.md, "Label values").
 */
import { OTHER } from '../accounting/outcomes.js';

/**
 * What a revision may be as a label value: vLLM's release strings (`0.8.5`, `0.8.5.post1`, `0.9.0rc1`,
 * `0.8.5.dev123+g1234abc`), an image tag or a commit. Starts with a letter or digit: never one of the closed values.
 */
export const REVISION = /^[A-Za-z0-9][A-Za-z0-9._+:-]{0,63}$/;

export class RevisionLabels {
  /** Labels per pool: configured revisions and those admitted under the cap. */
  private readonly labels = new Map<string, Set<string>>();
  /** Read (not configured) revisions admitted per pool. */
  private readonly admittedPerPool = new Map<string, number>();
  private readonly refusing = new Set<string>();

  private of(pool: string): Set<string> {
    let labels = this.labels.get(pool);
    if (labels === undefined) {
      labels = new Set();
      this.labels.set(pool, labels);
    }
    return labels;
  }

  /** Configured revisions are labels: configuration bounds them (one per upstream at most). */
  configure(pool: string, revision: string): void {
    this.of(pool).add(revision);
  }

  /**
   * A revision read from an upstream of `pool`: its label, admitted while the pool has admitted fewer than `cap`,
   * else `_other`. `firstRefusal`: the pool's first refusal in the life of the process (log it once).
   */
  admit(pool: string, cap: number, revision: string): { label: string; firstRefusal: boolean } {
    const labels = this.of(pool);
    if (labels.has(revision)) return { label: revision, firstRefusal: false };
    const admitted = this.admittedPerPool.get(pool) ?? 0;
    if (admitted < cap) {
      labels.add(revision);
      this.admittedPerPool.set(pool, admitted + 1);
      return { label: revision, firstRefusal: false };
    }
    const firstRefusal = !this.refusing.has(pool);
    this.refusing.add(pool);
    return { label: OTHER, firstRefusal };
  }
}
