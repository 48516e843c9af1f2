/**
 * nginx's reference figures (bench/reference/nginx.json, which says where they come from): the CPU per event the
 * report compares with when nginx is not installed here.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { REPO } from './layout.js';

export interface NginxReference {
  /** How the report names the source (`nginxSource`). */
  readonly label: 'peer-figures.md';
  readonly source: string;
  /** µs of nginx CPU per event, by scenario name. */
  readonly usPerEvent: Readonly<Record<string, number>>;
}

export const NGINX_REFERENCE_FILE = join(REPO, 'bench', 'reference', 'nginx.json');

export function readNginxReference(file = NGINX_REFERENCE_FILE): NginxReference {
  const parsed = JSON.parse(readFileSync(file, 'utf8')) as Partial<NginxReference>;
  const figures = parsed.usPerEvent;
  if (parsed.label !== 'peer-figures.md' || typeof parsed.source !== 'string' || typeof figures !== 'object' || figures === null) {
    throw new Error(`${file}: needs "label": "peer-figures.md", a "source" and "usPerEvent" figures`);
  }
  for (const [scenario, us] of Object.entries(figures)) {
    if (typeof us !== 'number' || !Number.isFinite(us) || us <= 0) throw new Error(`${file}: usPerEvent.${scenario} must be a positive number`);
  }
  return { label: parsed.label, source: parsed.source, usPerEvent: figures };
}
