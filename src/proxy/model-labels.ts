/**
 * Which model names are metric label values: every configured name, and discovered names up to a cap per pool, for
 * the life of the process. A name once admitted keeps its label (a series never changes its name mid-life); a name
 * discovered after its pool's cap is full is still served, but its requests are counted under `_other`. So an
 * upstream whose `GET /v1/models` changes at every refresh (LoRA adapters loading and unloading) cannot grow
 * /metrics without bound (docs/metrics.md, "Label values").
 */
import { OTHER } from '../accounting/outcomes.js';

export interface Admitted {
  /** Names of this call that got no label (the pool's cap is full). */
  readonly refused: number;
  /** Whether this is the pool's first refusal in the life of the process (log it once). */
  readonly firstRefusal: boolean;
}

export class ModelLabels {
  private readonly labels = new Set<string>();
  /** Discovered names admitted per pool (names configured, or admitted by another pool first, are not counted). */
  private readonly admittedPerPool = new Map<string, number>();
  private readonly refusing = new Set<string>();

  /** Configured names are labels: configuration bounds them. */
  configure(names: Iterable<string>): void {
    for (const name of names) this.labels.add(name);
  }

  /** Discovered names of `pool`: each one not yet a label gets one while the pool has admitted fewer than `cap`. */
  admit(pool: string, cap: number, names: Iterable<string>): Admitted {
    let admitted = this.admittedPerPool.get(pool) ?? 0;
    let refused = 0;
    for (const name of names) {
      if (this.labels.has(name)) continue;
      if (admitted < cap) {
        this.labels.add(name);
        admitted++;
      } else {
        refused++;
      }
    }
    this.admittedPerPool.set(pool, admitted);
    const firstRefusal = refused > 0 && !this.refusing.has(pool);
    if (firstRefusal) this.refusing.add(pool);
    return { refused, firstRefusal };
  }

  /** The metric label of a served model: its name if it has a label, else `_other`. */
  label(model: string): string {
    return this.labels.has(model) ? model : OTHER;
  }

  has(model: string): boolean {
    return this.labels.has(model);
  }
}
