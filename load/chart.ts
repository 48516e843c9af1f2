/**
 * Inline SVG charts for the HTML report: a line chart of per-second series and a histogram, each with axes, "nice"
 * ticks (steps of 1, 2 or 5 × 10^k) and units, so a number can be read off the page. No script, no external asset:
 * the report stays one self-contained file. The scale and path functions are pure and exported for the tests.
 */

export interface Ticks {
  /** The axis runs from the first tick to the last: both are multiples of the step that enclose the data. */
  readonly values: readonly number[];
  readonly step: number;
  /** Decimals that show every tick exactly (0 for steps ≥ 1). */
  readonly decimals: number;
}

/**
 * About `target` ticks over [min, max], at a step of 1, 2 or 5 × 10^k: a reader interpolates between 0, 20, 40 at a
 * glance, not between 0, 17.3, 34.6. An empty or inverted range gets one step above `min`, so a flat series still
 * has an axis.
 */
export function niceTicks(min: number, max: number, target = 5): Ticks {
  const hiData = max > min ? max : min + 1;
  const raw = (hiData - min) / Math.max(1, target);
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const normalized = raw / magnitude;
  const step = (normalized <= 1 ? 1 : normalized <= 2 ? 2 : normalized <= 5 ? 5 : 10) * magnitude;
  const decimals = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
  // A float hair past a tick (0.30000000000000004 for 0.3) is on it: it must not add a whole step to the axis.
  const first = Math.floor(min / step + 1e-9);
  const last = Math.ceil(hiData / step - 1e-9);
  // Index × step, rounded to the step's decimals: repeated addition would give 0.30000000000000004.
  const values = Array.from({ length: last - first + 1 }, (_, i) => Number(((first + i) * step).toFixed(decimals)));
  return { values, step, decimals };
}

/**
 * Ticks for a log axis over [min, max] (both > 0): the powers of ten inside it, with 2 and 5 × 10^k added when fewer
 * than three powers fall inside (a span under two decades would otherwise show one or two labels).
 */
export function logTicks(min: number, max: number): number[] {
  const lo = Math.floor(Math.log10(min));
  const hi = Math.ceil(Math.log10(max));
  const inside = (v: number) => v >= min * (1 - 1e-9) && v <= max * (1 + 1e-9);
  const powers: number[] = [];
  for (let e = lo; e <= hi; e++) powers.push(10 ** e);
  if (powers.filter(inside).length >= 3) return powers.filter(inside);
  return powers.flatMap((p) => [p, 2 * p, 5 * p]).filter(inside);
}

/** A tick's label: as many decimals as the step needs on a linear axis; on a log axis, as the value needs. */
export function tickLabel(value: number, decimals?: number): string {
  if (decimals !== undefined) return value.toFixed(decimals);
  return value >= 1 ? String(Math.round(value)) : value.toFixed(Math.min(6, -Math.floor(Math.log10(value))));
}

/**
 * The runs of defined values in a per-bin series, as [bin, value] lists. A bin without a value (a second in which no
 * request started has no TTFT median) ends a run, so the line breaks there: drawing it as 0 ms would show the
 * fastest second of the run exactly where nothing was measured.
 */
export function segmentsOf(values: ReadonlyArray<number | undefined>): Array<Array<readonly [number, number]>> {
  const segments: Array<Array<readonly [number, number]>> = [];
  let current: Array<readonly [number, number]> | undefined;
  values.forEach((value, i) => {
    if (value === undefined || !Number.isFinite(value)) {
      current = undefined;
      return;
    }
    if (current === undefined) {
      current = [];
      segments.push(current);
    }
    current.push([i, value]);
  });
  return segments;
}

/** An SVG path `d` for the segments: each starts with a move (M), so nothing is drawn across a gap. */
export function pathOf(segments: ReadonlyArray<ReadonlyArray<readonly [number, number]>>, x: (bin: number) => number, y: (value: number) => number): string {
  return segments
    .map((segment) => segment.map(([bin, value], i) => `${i === 0 ? 'M' : 'L'}${x(bin).toFixed(1)},${y(value).toFixed(1)}`).join(' '))
    .join(' ');
}

const escape = (text: string) => text.replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c] ?? c);

const WIDTH = 560;
const HEIGHT = 220;
const MARGIN = { left: 56, right: 16, top: 14, bottom: 42 };
const PLOT_W = WIDTH - MARGIN.left - MARGIN.right;
const PLOT_H = HEIGHT - MARGIN.top - MARGIN.bottom;
const BOTTOM = MARGIN.top + PLOT_H;
const AXIS = 'stroke="#333" stroke-width="1"';
const GRID = 'stroke="#e4e4e4" stroke-width="1"';

/** The axes, grid, ticks and titles of a plot whose scales map values to pixels. */
function axesSvg(xTicks: ReadonlyArray<readonly [number, string]>, yTicks: ReadonlyArray<readonly [number, string]>, xTitle: string, yTitle: string): string {
  const parts: string[] = [];
  for (const [py, label] of yTicks) {
    parts.push(`<line x1="${MARGIN.left}" y1="${py.toFixed(1)}" x2="${MARGIN.left + PLOT_W}" y2="${py.toFixed(1)}" ${GRID}/>`);
    parts.push(`<line x1="${MARGIN.left - 4}" y1="${py.toFixed(1)}" x2="${MARGIN.left}" y2="${py.toFixed(1)}" ${AXIS}/>`);
    parts.push(`<text x="${MARGIN.left - 6}" y="${(py + 3).toFixed(1)}" font-size="10" text-anchor="end">${escape(label)}</text>`);
  }
  for (const [px, label] of xTicks) {
    parts.push(`<line x1="${px.toFixed(1)}" y1="${BOTTOM}" x2="${px.toFixed(1)}" y2="${BOTTOM + 4}" ${AXIS}/>`);
    parts.push(`<text x="${px.toFixed(1)}" y="${BOTTOM + 15}" font-size="10" text-anchor="middle">${escape(label)}</text>`);
  }
  parts.push(`<line x1="${MARGIN.left}" y1="${BOTTOM}" x2="${MARGIN.left + PLOT_W}" y2="${BOTTOM}" ${AXIS}/>`);
  parts.push(`<line x1="${MARGIN.left}" y1="${MARGIN.top}" x2="${MARGIN.left}" y2="${BOTTOM}" ${AXIS}/>`);
  parts.push(`<text x="${MARGIN.left + PLOT_W / 2}" y="${HEIGHT - 6}" font-size="11" text-anchor="middle">${escape(xTitle)}</text>`);
  parts.push(`<text transform="translate(14 ${MARGIN.top + PLOT_H / 2}) rotate(-90)" font-size="11" text-anchor="middle">${escape(yTitle)}</text>`);
  return parts.join('');
}

const svgOpen = `<svg width="${WIDTH}" height="${HEIGHT}" viewBox="0 0 ${WIDTH} ${HEIGHT}" role="img">`;

/** A vertical line at a moment of the run (e.g. where the duration window closed). */
export interface Marker {
  readonly atS: number;
  readonly label: string;
}

export interface LineChart {
  readonly title: string;
  /** The y axis title, with its unit: `TTFT (ms)`, `requests/s`. */
  readonly yTitle: string;
  /** One value per second of the run; undefined where nothing was measured (drawn as a gap). */
  readonly values: ReadonlyArray<number | undefined>;
  readonly markers?: readonly Marker[];
}

/** A line chart of a per-second series: x in seconds since the run started, each value at its second's middle. */
export function lineChartSvg(chart: LineChart): string {
  const segments = segmentsOf(chart.values);
  if (segments.length === 0) return `<figure><figcaption>${escape(chart.title)}: no data</figcaption></figure>`;
  const markers = chart.markers ?? [];
  const xt = niceTicks(0, Math.max(chart.values.length, ...markers.map((m) => m.atS)));
  const xMax = xt.values[xt.values.length - 1] ?? 1;
  let top = 0;
  for (const segment of segments) for (const [, v] of segment) if (v > top) top = v;
  const yt = niceTicks(0, top);
  const yMax = yt.values[yt.values.length - 1] ?? 1;
  const sx = (s: number) => MARGIN.left + (PLOT_W * s) / xMax;
  const sy = (v: number) => BOTTOM - (PLOT_H * v) / yMax;
  const x = (bin: number) => sx(bin + 0.5);
  const axes = axesSvg(
    xt.values.map((v) => [sx(v), tickLabel(v, xt.decimals)] as const),
    yt.values.map((v) => [sy(v), tickLabel(v, yt.decimals)] as const),
    'time since start (s)',
    chart.yTitle,
  );
  // A run of one value has no line to draw: a dot shows it.
  const dots = segments
    .filter((segment) => segment.length === 1)
    .map(([[bin, value] = [0, 0]]) => `<circle cx="${x(bin).toFixed(1)}" cy="${sy(value).toFixed(1)}" r="2" fill="#c05030"/>`)
    .join('');
  const marks = markers
    .map((m) => `<line x1="${sx(m.atS).toFixed(1)}" y1="${MARGIN.top}" x2="${sx(m.atS).toFixed(1)}" y2="${BOTTOM}" stroke="#888" stroke-dasharray="4 3"/><text x="${(sx(m.atS) - 3).toFixed(1)}" y="${MARGIN.top + 10}" font-size="10" text-anchor="end" fill="#555">${escape(m.label)}</text>`)
    .join('');
  const gaps = chart.values.some((v) => v === undefined) ? ' (gaps: seconds without a value)' : '';
  return `<figure><figcaption>${escape(chart.title)}${gaps}</figcaption>${svgOpen}${axes}${marks}<path d="${pathOf(segments, x, sy)}" fill="none" stroke="#c05030" stroke-width="1.5"/>${dots}</svg></figure>`;
}

/**
 * A histogram of `values` in `unit`, log-spaced bins when they span more than 50× (latencies with a long tail);
 * `counted` names what the y axis counts (requests, events).
 */
export function histogramSvg(title: string, values: readonly number[], unit: string, counted = 'requests'): string {
  if (values.length === 0) return `<figure><figcaption>${escape(title)}: no data</figcaption></figure>`;
  // A loop, not Math.min(...values): a long run has millions of inter-token gaps, past the engine's argument limit.
  let lowest = Number.POSITIVE_INFINITY;
  let highest = Number.NEGATIVE_INFINITY;
  for (const v of values) {
    if (v < lowest) lowest = v;
    if (v > highest) highest = v;
  }
  const min = Math.max(1e-3, lowest);
  const max = Math.max(highest, min * 1.001);
  const bins = 40;
  const log = max / min > 50;
  const position = (v: number) => (log ? Math.log(v / min) / Math.log(max / min) : (v - min) / (max - min));
  const edge = (i: number) => (log ? min * (max / min) ** (i / bins) : min + ((max - min) * i) / bins);
  const counts = new Array<number>(bins).fill(0);
  for (const v of values) {
    const i = Math.min(bins - 1, Math.max(0, Math.floor(position(Math.max(min, v)) * bins)));
    counts[i] = (counts[i] ?? 0) + 1;
  }
  let most = 0;
  for (const c of counts) if (c > most) most = c;
  const yt = niceTicks(0, most);
  const yMax = yt.values[yt.values.length - 1] ?? 1;
  const sx = (v: number) => MARGIN.left + PLOT_W * position(v);
  const sy = (c: number) => BOTTOM - (PLOT_H * c) / yMax;
  const linear = niceTicks(min, max);
  const xTicks = log
    ? logTicks(min, max).map((v) => [sx(v), tickLabel(v)] as const)
    : linear.values.filter((v) => v >= min && v <= max).map((v) => [sx(v), tickLabel(v, linear.decimals)] as const);
  const bar = PLOT_W / bins;
  const rects = counts
    .map((c, i) => {
      const y = sy(c);
      return `<rect x="${(MARGIN.left + i * bar).toFixed(1)}" y="${y.toFixed(1)}" width="${(bar - 1).toFixed(1)}" height="${(BOTTOM - y).toFixed(1)}" fill="#4878a8"><title>${edge(i).toFixed(2)}–${edge(i + 1).toFixed(2)} ${escape(unit)}: ${c}</title></rect>`;
    })
    .join('');
  const axes = axesSvg(xTicks, yt.values.map((v) => [sy(v), tickLabel(v, yt.decimals)] as const), `${title} (${unit}${log ? ', log scale' : ''})`, counted);
  return `<figure><figcaption>${escape(title)} (${values.length} values${log ? ', log scale' : ''})</figcaption>${svgOpen}${axes}${rects}</svg></figure>`;
}
