/**
 * Just enough PromQL reading for the deploy tests: which metric names an expression selects. promtool (2.42) has no
 * query parser of its own; its rule checker parses for us, this only lists names.
 */
import { spawnSync } from 'node:child_process';
import type { SystemTool } from './system-tool.js';

/** Debian's `prometheus` package brings both promtool and prometheus; .ci/run installs it. */
const INSTALL = 'Debian: apt-get install prometheus';
export const PROMTOOL: SystemTool = { command: 'promtool', install: INSTALL };
/** PROMETHEUS_BIN picks another build of the server. */
export const PROMETHEUS: SystemTool = { command: process.env.PROMETHEUS_BIN ?? 'prometheus', install: INSTALL };

const KEYWORDS = new Set(['and', 'or', 'unless', 'bool', 'offset', 'by', 'without', 'on', 'ignoring', 'group_left', 'group_right', 'inf', 'nan', 'start', 'end']);

/** Metric names selected by a PromQL expression (functions, keywords, label names and literals left out). */
export function metricNames(expr: string): string[] {
  const stripped = expr
    // Strings first: they may hold braces, brackets and anything else.
    .replace(/"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`/g, '""')
    .replace(/\{[^}]*\}/g, ' ')
    .replace(/\[[^\]]*\]/g, ' ')
    // Label lists of grouping and matching modifiers: `by (model)`, `on (model)`, `group_left (le)`.
    .replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, ' ')
    .replace(/\boffset\s+-?[0-9a-z]+/g, ' ')
    .replace(/@\s*[0-9.]+/g, ' ');
  const names = new Set<string>();
  for (const match of stripped.matchAll(/(?<![\w.:])([A-Za-z_:][\w:]*)(\s*\()?/g)) {
    const name = match[1] ?? '';
    if (match[2] !== undefined) continue; // a function or aggregation
    if (KEYWORDS.has(name.toLowerCase())) continue;
    names.add(name);
  }
  return [...names];
}

/** Grafana's variables replaced by values that keep an expression valid PromQL. */
export function withoutGrafanaVariables(expr: string): string {
  return expr
    .replace(/\$__(rate_interval|interval|range)\b/g, '5m')
    .replace(/\$\{(\w+)(?::[^}]*)?\}|\$(\w+)/g, '.*');
}

export interface Spawned {
  status: number | null;
  output: string;
}

/**
 * Runs a Prometheus tool (promtool, prometheus). The tests using it check for the tool first (describeWithTool); a
 * binary that is still missing fails loudly.
 */
export function runTool(tool: string, args: readonly string[], cwd?: string): Spawned {
  const result = spawnSync(tool, args, { encoding: 'utf8', ...(cwd !== undefined ? { cwd } : {}) });
  if (result.error !== undefined) {
    const missing = (result.error as NodeJS.ErrnoException).code === 'ENOENT';
    throw new Error(
      missing
        ? `${tool} not found on PATH. .ci/run installs it (Debian package "prometheus": apt-get install prometheus).`
        : `${tool} failed to start: ${result.error.message}`,
    );
  }
  return { status: result.status, output: `${result.stdout}${result.stderr}` };
}
