/** The report printed at the end of a run: per target, against direct, the cost split and the targets' verdicts. */
import type { Comparison, CostSplit } from './compare.js';
import { f1, f2, mib, pct, signed, table } from './format.js';
import type { ScenarioResult, TargetSummary } from './run.js';
import type { TargetCheck } from './targets.js';

export function printChecks(title: string, checks: TargetCheck[]): void {
  if (checks.length === 0) return;
  console.log(`\n${title}`);
  for (const check of checks) {
    const verdict = check.met === undefined ? 'n/a   ' : check.met ? 'met   ' : 'MISSED';
    console.log(`  ${verdict}  ${check.target}: ${check.measured}`);
  }
}

export function printCostSplit(splits: CostSplit[]): void {
  if (splits.length === 0) return;
  const scenarios = [...new Set(splits.flatMap((s) => s.scenarios))];
  console.log(
    `\nCost per request (a) and per event (b): each window's proxy CPU, less its CPU at rest, fitted as a × requests + b × events ` +
      `(least squares, relative) over the windows of ${scenarios.join(', ') || 'no paced streaming scenario'}; ` +
      `req = the non-streaming scenario's CPU per request:`,
  );
  const rows: string[][] = [['proxy', '', 'a µs/request', 'b µs/event', 'windows', 'events/request', 'rms residual', 'per-request share', 'at rest ms/s', 'req µs/request']];
  for (const s of splits) {
    rows.push([
      s.proxy,
      '',
      f1(s.fit.usPerRequest),
      f2(s.fit.usPerEvent),
      String(s.fit.windows),
      s.fit.eventsPerRequest.join(', ') || '–',
      pct(s.fit.rmsRelativeResidual),
      Number.isFinite(s.perRequestShare) ? `${pct(s.perRequestShare)} at ${s.fit.eventsPerRequest[0]}` : '–',
      f1(s.idleCpuMsPerS),
      f1(s.reqUsPerRequest),
    ]);
  }
  console.log(table(rows));
  const waybill = splits.find((s) => s.proxy === 'waybill');
  const nginx = splits.find((s) => s.proxy === 'nginx');
  if (waybill !== undefined && nginx !== undefined) {
    console.log(
      `waybill ÷ nginx: a ${f2(waybill.fit.usPerRequest / nginx.fit.usPerRequest)}x, b ${f2(waybill.fit.usPerEvent / nginx.fit.usPerEvent)}x, ` +
        `req ${f2(waybill.reqUsPerRequest / nginx.reqUsPerRequest)}x`,
    );
  }
  if (splits.some((s) => s.fit.windows > 0 && !Number.isFinite(s.fit.usPerRequest))) {
    console.log('a and b need windows with two different events per request (e.g. c64s with c64): undetermined where –');
  }
}

export function printReport(results: ScenarioResult[], comparisons: Comparison[]): void {
  const raw: string[][] = [
    ['scenario', 'target', 'events/s', 'req/s', 'ev/chunk', 'TTFT p50', 'TTFT p99', 'ITL p50', 'ITL p99', 'proxy µs/ev', 'µs/req', 'proxy CPU', 'idle ms/s', 'sim µs/ev', 'client µs/ev', 'RSS MiB', 'other load c0/c1', 'errors'],
  ];
  for (const result of results) {
    for (const t of result.targets) {
      raw.push([
        result.scenario.name,
        t.target,
        String(Math.round(t.eventsPerS)),
        String(Math.round(t.requestsPerS)),
        f2(t.eventsPerRead),
        f2(t.ttftP50),
        f2(t.ttftP99),
        f2(t.itlP50),
        f2(t.itlP99),
        f1(t.proxyUsPerEvent),
        f1(t.proxyUsPerRequest),
        pct(t.proxyCpuShare),
        f1(t.idleCpuMsPerS),
        f1(t.simUsPerEvent),
        f1(t.clientUsPerEvent),
        mib(t.rssMedianKiB),
        `${pct(t.core0Foreign)}/${pct(t.core1Foreign)}`,
        String(t.errors + t.incomplete),
      ]);
    }
  }
  console.log('\nPer target (medians over repeats; latencies in ms, measured by the client; for req, TTFT = whole-request latency):');
  console.log(table(raw));

  const rows: string[][] = [
    ['scenario', 'proxy', '+TTFT p50', '+TTFT p99', '+ITL p99', 'throughput', 'CPU µs/event', 'µs/request', 'x nginx', 'RSS/stream KiB', 'no-GC KiB', 'peak RSS MiB'],
  ];
  for (const c of comparisons) {
    rows.push([
      c.scenario,
      c.proxy,
      signed(c.addedTtftP50Ms),
      signed(c.addedTtftP99Ms),
      signed(c.addedItlP99Ms),
      `${f2(c.throughputRatio)}x`,
      f1(c.usPerEvent),
      f1(c.usPerRequest),
      c.proxy === 'nginx' ? '' : `${f2(c.vsNginx)}${c.nginxSource === 'peer-figures.md' ? '*' : ''}`,
      f1(c.rssPerStreamKiB),
      f1(c.rssWindowPerStreamKiB),
      f1(c.peakRssMiB),
    ]);
  }
  console.log('\nAgainst the direct run (added ms; throughput = events/s through the proxy / direct, requests/s for req; x nginx per event, per request for req):');
  console.log(table(rows));
  if (comparisons.some((c) => c.nginxSource === 'peer-figures.md')) console.log('* nginx not run here: ratio to the nginx figure in peer-figures.md');
  console.log(
    'RSS/stream (c256, c256s): (VmRSS with the streams in flight - VmRSS at rest) / streams, both read after a full GC; no-GC: ' +
      '(median VmRSS during the measured windows - VmRSS after start-up) / streams. Peak: VmHWM at the end of the scenario.',
  );
  for (const result of results) {
    const targets = result.targets;
    const plain = targets.find((x) => x.target === 'waybill');
    if (plain === undefined) continue;
    const unit = (t: TargetSummary) => (result.scenario.stream ? t.proxyUsPerEvent : t.proxyUsPerRequest);
    const unitName = result.scenario.stream ? 'µs/event' : 'µs/request';
    const lean = targets.find((x) => x.target === 'waybill-lean');
    const perRequest = (a: TargetSummary, b: TargetSummary) =>
      result.scenario.stream ? `; ${signed(a.proxyUsPerRequest - b.proxyUsPerRequest, 1)} µs/request` : '';
    if (lean !== undefined) {
      console.log(
        `request logs (default config vs lean) at ${result.scenario.name}: ${signed(unit(plain) - unit(lean), 1)} ${unitName} ` +
          `(${f1(unit(plain))} vs ${f1(unit(lean))}${perRequest(plain, lean)}), ${Math.round(plain.logBytesPerRequest)} bytes of log per request`,
      );
    }
    const otel = targets.find((x) => x.target === 'waybill+otel');
    if (otel !== undefined) {
      console.log(
        `tracing to an unreachable collector at ${result.scenario.name}: ${signed(unit(otel) - unit(plain), 1)} ${unitName} ` +
          `(${f1(unit(otel))} vs ${f1(unit(plain))}${perRequest(otel, plain)})`,
      );
    }
    const contract = targets.find((x) => x.target === 'waybill+contract');
    if (contract !== undefined) {
      console.log(
        `output contract (response_format json_object) at ${result.scenario.name}: ${signed(contract.proxyUsPerEvent - plain.proxyUsPerEvent, 1)} µs/event ` +
          `(${f1(contract.proxyUsPerEvent)} vs ${f1(plain.proxyUsPerEvent)} without a contract)`,
      );
    }
  }
}

