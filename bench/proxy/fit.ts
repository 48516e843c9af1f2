/**
 * Issue 15's split of a proxy's CPU into a cost per request and a cost per event: for each measured window,
 *
 *   CPU in the window − CPU at rest × window length  ≈  a × requests + b × events
 *
 * fitted by least squares over windows of paced streaming scenarios. The windows must differ in events per request
 * (64- and 200-token answers: 66 and 202 events) or a and b cannot be told apart; with one ratio the fit is
 * reported as undetermined. Each window is weighted by 1 / its CPU, so every window counts equally in relative
 * terms and the busier c256 windows do not decide the fit alone. Saturated windows stay out: there a read carries
 * several events and a write several events, so the cost per event is not the paced one.
 */

export interface CostPoint {
  /** scenario and repeat, for the residuals printed. */
  label: string;
  /** The scenario: windows of one group share an answer length (events per request). */
  group: string;
  /** Requests that ended in the window. */
  requests: number;
  /** SSE events the client received in the window. */
  events: number;
  /** The proxy's CPU in the window, less what it spends at rest over the same time, µs. */
  cpuUs: number;
}

export interface CostFit {
  /** µs of proxy CPU per request (a) and per event (b); NaN when undetermined. */
  usPerRequest: number;
  usPerEvent: number;
  /** Windows used. */
  windows: number;
  /** Events per request of each group (all its windows' events ÷ requests, rounded), ascending. */
  eventsPerRequest: number[];
  /** Root mean square of (measured − fitted) / measured over the windows. */
  rmsRelativeResidual: number;
  /** Per window: measured and fitted CPU, µs. */
  residuals: { label: string; measuredUs: number; fittedUs: number }[];
}

/**
 * Weighted least squares for y ≈ a·r + b·e with no intercept. Rows are divided by y (weight 1/y²), so the normal
 * equations are over r/y and e/y against 1. Undetermined when the two columns are (nearly) proportional: then only
 * a·r + b·e at that one ratio is known, not a and b.
 */
export function fitCost(points: readonly CostPoint[]): CostFit {
  const usable = points.filter((p) => p.cpuUs > 0 && p.requests > 0 && p.events > 0);
  let srr = 0;
  let see = 0;
  let sre = 0;
  let sr = 0;
  let se = 0;
  for (const p of usable) {
    const r = p.requests / p.cpuUs;
    const e = p.events / p.cpuUs;
    srr += r * r;
    see += e * e;
    sre += r * e;
    sr += r;
    se += e;
  }
  const det = srr * see - sre * sre;
  // det / (srr·see) = 1 − cos² of the angle between the columns: near 0 when every window has the same ratio.
  const determined = usable.length >= 2 && det > 1e-6 * srr * see;
  const a = determined ? (sr * see - se * sre) / det : Number.NaN;
  const b = determined ? (se * srr - sr * sre) / det : Number.NaN;
  const residuals = usable.map((p) => ({ label: p.label, measuredUs: p.cpuUs, fittedUs: a * p.requests + b * p.events }));
  const rms = determined
    ? Math.sqrt(residuals.reduce((sum, x) => sum + ((x.measuredUs - x.fittedUs) / x.measuredUs) ** 2, 0) / residuals.length)
    : Number.NaN;
  return {
    usPerRequest: a,
    usPerEvent: b,
    windows: usable.length,
    eventsPerRequest: groupRatios(usable),
    rmsRelativeResidual: rms,
    residuals,
  };
}

/** A window's edges cut requests in half, so one window's events ÷ requests wanders; a group's total does not. */
function groupRatios(points: readonly CostPoint[]): number[] {
  const totals = new Map<string, { events: number; requests: number }>();
  for (const p of points) {
    const total = totals.get(p.group) ?? { events: 0, requests: 0 };
    total.events += p.events;
    total.requests += p.requests;
    totals.set(p.group, total);
  }
  const ratios = [...totals.values()].map((t) => Math.round(t.events / t.requests));
  return [...new Set(ratios)].sort((x, y) => x - y);
}
