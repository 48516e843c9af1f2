/**
 * The live status page (docs/status-page.md): one self-contained HTML document — no CDN, no build step, no
 * external file — shipped in the compiled package as this module's strings. Its script follows
 * `status/events` (EventSource, relative to the page, so it works behind a path prefix) and renders each snapshot
 * with `textContent` only, never as markup, so no label value can become HTML.
 *
 * The style and the script are kept apart so the server can name them by hash in its Content-Security-Policy
 * (`script-src 'sha256-…'`): nothing else may run on the page.
 *
 * The script is status-script.ts; the style and the document are here.
 */
import { STATUS_SCRIPT } from './status-script.js';

export { STATUS_SCRIPT } from './status-script.js';

export const STATUS_STYLE = `
:root { color-scheme: light dark; --fg: #1b1f24; --muted: #57606a; --bg: #ffffff; --panel: #f6f8fa; --line: #d0d7de;
  --accent: #0b5cad; --ok: #1a7f37; --warn: #9a6700; --bad: #cf222e; --req: #afb8c1; --del: #54aeff; --acc: #0b5cad; }
@media (prefers-color-scheme: dark) {
  :root { --fg: #e6edf3; --muted: #9ea7b3; --bg: #0d1117; --panel: #161b22; --line: #30363d; --accent: #58a6ff;
    --ok: #3fb950; --warn: #d29922; --bad: #f85149; --req: #484f58; --del: #1f6feb; --acc: #58a6ff; }
}
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--fg); font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; }
a { color: var(--accent); }
:focus-visible { outline: 3px solid var(--accent); outline-offset: 2px; }
.skip { position: absolute; left: 8px; top: -48px; padding: 8px 12px; background: var(--bg); border: 2px solid var(--accent); z-index: 10; }
.skip:focus { top: 8px; }
header { border-bottom: 1px solid var(--line); background: var(--panel); }
.wrap { max-width: 1280px; margin: 0 auto; padding: 0 12px; }
header .wrap { display: flex; flex-wrap: wrap; align-items: center; gap: 4px 16px; padding-top: 10px; padding-bottom: 10px; }
h1 { font-size: 1.25rem; margin: 0; }
h2 { font-size: 1.1rem; margin: 28px 0 6px; }
p { margin: 4px 0; overflow-wrap: anywhere; }
nav ul { list-style: none; display: flex; flex-wrap: wrap; gap: 4px 14px; margin: 0; padding: 0; }
.meta { color: var(--muted); font-size: 0.9rem; }
#connection { font-weight: 600; padding: 2px 8px; border-radius: 10px; border: 1px solid var(--line); }
#connection[data-state="live"] { color: var(--ok); }
#connection[data-state="down"] { color: var(--bad); }
#connection[data-state="connecting"] { color: var(--warn); }
button { font: inherit; padding: 4px 12px; border: 1px solid var(--line); border-radius: 6px; background: var(--bg); color: var(--fg); cursor: pointer; }
button[aria-pressed="true"] { background: var(--accent); color: var(--bg); }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(150px, 1fr)); gap: 8px; margin: 8px 0; }
.card { background: var(--panel); border: 1px solid var(--line); border-radius: 8px; padding: 8px 10px; }
.card .label { color: var(--muted); font-size: 0.85rem; display: block; }
.card .value { font-size: 1.4rem; font-weight: 600; }
.scroll { position: relative; overflow-x: auto; max-width: 100%; border: 1px solid var(--line); border-radius: 8px; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
caption { text-align: left; padding: 6px 8px; font-weight: 600; }
th, td { padding: 4px 8px; border-top: 1px solid var(--line); text-align: right; white-space: nowrap; }
th:first-child, td:first-child, .text { text-align: left; }
thead th { background: var(--panel); font-weight: 600; }
.bar { display: inline-block; width: 120px; max-width: 30vw; height: 10px; background: var(--panel); border: 1px solid var(--line); vertical-align: middle; }
.bar span { display: block; height: 100%; width: 0; background: var(--acc); }
.bad { color: var(--bad); }
.warn { color: var(--warn); }
th[scope="colgroup"] { text-align: center; }
.ok { color: var(--ok); }
svg { display: block; width: 100%; height: 120px; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 14px; font-size: 0.85rem; color: var(--muted); margin: 4px 0; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 4px; vertical-align: middle; }
.s-req { background: var(--req); fill: var(--req); } .s-del { background: var(--del); fill: var(--del); } .s-acc { background: var(--acc); fill: var(--acc); }
/* Ids (UUIDs, 32-hex trace ids) are cut with an ellipsis so the failed-requests table fits 1280 px; each is a button
   whose title shows it whole and whose press copies it whole. */
button.id { display: inline-block; max-width: 13ch; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; vertical-align: bottom;
  padding: 0 2px; border: 0; border-radius: 3px; background: none; color: var(--accent); font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 0.9em; text-align: left; }
.sr { position: absolute; width: 1px; height: 1px; overflow: hidden; clip-path: inset(50%); white-space: nowrap; }
details { margin: 6px 0; }
summary { cursor: pointer; }
footer { margin: 32px 0 24px; color: var(--muted); font-size: 0.85rem; }
`;

const METRIC_ROW_HEAD = `<tr><th scope="col">name</th><th scope="col">requests</th><th scope="col">2xx</th><th scope="col">delivered</th>
<th scope="col">accepted</th><th scope="col">SLO attainment</th><th scope="col">goodput /s</th><th scope="col">prompt tokens</th>
<th scope="col">completion tokens</th></tr>`;

function funnelRow(key: string, label: string): string {
  return `<tr><th scope="row">${label}</th><td id="f-${key}">—</td><td id="f-${key}-share">—</td>
<td><span class="bar" aria-hidden="true"><span id="f-${key}-bar"></span></span></td></tr>`;
}

/** The page, with the style and script inline. */
export const STATUS_PAGE_HTML = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>Waybill status</title>
<link rel="icon" href="data:,">
<style>${STATUS_STYLE}</style>
</head>
<body>
<a class="skip" href="#main">Skip to content</a>
<header>
  <div class="wrap">
    <h1>Waybill status</h1>
    <p id="connection" role="status" aria-live="polite" data-state="connecting">connecting…</p>
    <p class="meta">gateway <span id="gateway-state">—</span>, updated <span id="generated">—</span></p>
    <button id="pause" type="button" aria-pressed="false">Pause updates</button>
  </div>
  <nav class="wrap" aria-label="Sections">
    <ul>
      <li><a href="#funnel">Funnel</a></li>
      <li><a href="#latency">Latency</a></li>
      <li><a href="#models">Models</a></li>
      <li><a href="#tenants">Tenants</a></li>
      <li><a href="#upstreams">Upstreams</a></li>
      <li><a href="#failures">Failed requests</a></li>
    </ul>
  </nav>
</header>
<main id="main" class="wrap" tabindex="-1">
  <p class="meta" id="window">Waiting for the first snapshot.</p>

  <section id="funnel" aria-labelledby="funnel-title">
    <h2 id="funnel-title">2xx → delivered → accepted</h2>
    <p class="meta">Every request the gateway answered, counted once when it ended. 2xx ⊇ delivered ⊇ accepted, over one
    denominator: the gap between 2xx and delivered is failures a status code hides (errors and cuts after the 200).</p>
    <div class="cards">
      <div class="card"><span class="label">delivered</span><span class="value" id="delivered-ratio">—</span></div>
      <div class="card"><span class="label">accepted</span><span class="value" id="accepted-ratio">—</span></div>
      <div class="card"><span class="label">evaluation coverage</span><span class="value" id="coverage-ratio">—</span><span class="label" id="coverage-counts"></span></div>
      <div class="card"><span class="label">accepted among evaluated</span><span class="value" id="accepted-evaluated-ratio">—</span><span class="label" id="accepted-evaluated-counts"></span></div>
      <div class="card"><span class="label">SLO attainment</span><span class="value" id="slo-attainment">—</span><span class="label" id="slo-counts"></span></div>
      <div class="card"><span class="label">goodput (SLO met)</span><span class="value" id="goodput">—</span></div>
    </div>
    <div class="scroll" role="region" tabindex="0" aria-labelledby="funnel-caption">
      <table>
        <caption id="funnel-caption">Request funnel over the window</caption>
        <thead><tr><th scope="col">step</th><th scope="col">requests</th><th scope="col">of all</th><th scope="col"><span class="sr">share</span></th></tr></thead>
        <tbody>
          ${funnelRow('requests', 'all requests')}
          ${funnelRow('2xx', 'HTTP 2xx')}
          ${funnelRow('delivered', 'delivered')}
          ${funnelRow('accepted', 'accepted')}
        </tbody>
      </table>
    </div>
    <h3 class="meta">Requests per bucket</h3>
    <div class="legend" aria-hidden="true"><span><span class="swatch s-req"></span>requests</span><span><span class="swatch s-del"></span>delivered</span><span><span class="swatch s-acc"></span>accepted</span></div>
    <svg id="series-chart" viewBox="0 0 300 100" preserveAspectRatio="none" role="img" aria-label="Requests per bucket: waiting for data"></svg>
    <details>
      <summary>Every bucket, as a table</summary>
      <div class="scroll" role="region" tabindex="0" aria-labelledby="series-caption">
        <table>
          <caption id="series-caption">Requests per bucket, newest first</caption>
          <thead><tr><th scope="col">from</th><th scope="col">requests</th><th scope="col">2xx</th><th scope="col">delivered</th><th scope="col">accepted</th><th scope="col">SLO attainment</th></tr></thead>
          <tbody id="series-body"></tbody>
        </table>
      </div>
    </details>
    <div class="scroll" role="region" tabindex="0" aria-labelledby="outcomes-caption">
      <table>
        <caption id="outcomes-caption">Requests by outcome</caption>
        <thead><tr><th scope="col">outcome</th><th scope="col">requests</th><th scope="col">of all</th></tr></thead>
        <tbody id="outcomes-body"></tbody>
      </table>
    </div>
  </section>

  <section id="latency" aria-labelledby="latency-title">
    <h2 id="latency-title">Latency by prompt length</h2>
    <p class="meta">Streamed requests. TTFT: arrival to the first output written to the client. TPOT: per request, between
    its first and last output per token. Percentiles are estimated from the histogram buckets (metrics.buckets), as
    histogram_quantile does.</p>
    <div class="scroll" role="region" tabindex="0" aria-labelledby="latency-caption">
      <table>
        <caption id="latency-caption">TTFT and TPOT percentiles by prompt-length class</caption>
        <thead>
          <tr><th scope="col" rowspan="2">prompt length</th><th scope="colgroup" colspan="4">TTFT</th><th scope="colgroup" colspan="4">TPOT</th></tr>
          <tr><th scope="col">n</th><th scope="col">p50</th><th scope="col">p95</th><th scope="col">p99</th><th scope="col">n</th><th scope="col">p50</th><th scope="col">p95</th><th scope="col">p99</th></tr>
        </thead>
        <tbody id="latency-body"></tbody>
      </table>
    </div>
  </section>

  <section id="models" aria-labelledby="models-title">
    <h2 id="models-title">Models</h2>
    <div class="scroll" role="region" tabindex="0" aria-labelledby="models-caption">
      <table>
        <caption id="models-caption">Per model, over the window (shares of the model's requests)</caption>
        <thead>${METRIC_ROW_HEAD}</thead>
        <tbody id="models-body"></tbody>
      </table>
    </div>
  </section>

  <section id="tenants" aria-labelledby="tenants-title">
    <h2 id="tenants-title">Tenants</h2>
    <div class="scroll" role="region" tabindex="0" aria-labelledby="tenants-caption">
      <table>
        <caption id="tenants-caption">Per tenant, over the window (shares of the tenant's requests)</caption>
        <thead>${METRIC_ROW_HEAD}</thead>
        <tbody id="tenants-body"></tbody>
      </table>
    </div>
  </section>

  <section id="upstreams" aria-labelledby="upstreams-title">
    <h2 id="upstreams-title">Upstreams</h2>
    <p class="meta">State now; attempts and first-output latency (attempt sent to its first output) over the window.
    Failed attempts are those passive health counts toward an ejection.</p>
    <div class="scroll" role="region" tabindex="0" aria-labelledby="upstreams-caption">
      <table>
        <caption id="upstreams-caption">Per upstream</caption>
        <thead><tr><th scope="col">upstream</th><th scope="col" class="text">pool</th><th scope="col" class="text">state</th><th scope="col" class="text">health check</th>
        <th scope="col" class="text">circuit</th><th scope="col">in flight</th><th scope="col">attempts</th><th scope="col">failed</th>
        <th scope="col">first output p50</th><th scope="col">p95</th><th scope="col" class="text">last failure</th></tr></thead>
        <tbody id="upstreams-body"></tbody>
      </table>
    </div>
  </section>

  <section id="failures" aria-labelledby="failures-title">
    <h2 id="failures-title">Failed requests</h2>
    <p class="meta">The last requests that were not accepted (<span id="failures-count">none yet</span>): ids and causes
    only, never a prompt, a completion, a header or a key. A long id is cut to fit: hover it to see it whole, press it
    (or Enter on it) to copy it.</p>
    <p class="meta" id="copy-status" role="status" aria-live="polite"></p>
    <div class="scroll" role="region" tabindex="0" aria-labelledby="failures-caption">
      <table id="failures-table">
        <caption id="failures-caption">Failed requests, newest first</caption>
        <thead><tr><th scope="col">time</th><th scope="col" class="text">request id</th><th scope="col" class="text">model</th><th scope="col" class="text">tenant</th>
        <th scope="col" class="text">route</th><th scope="col">code</th><th scope="col" class="text">outcome</th><th scope="col" class="text">cause</th>
        <th scope="col" class="text">upstream</th><th scope="col" class="text">trace id</th></tr></thead>
        <tbody id="failures-body"></tbody>
      </table>
    </div>
  </section>
  <footer>Read from the gateway's own ledger (not Prometheus), one snapshot a second. The same data: <a href="status.json">status.json</a>.</footer>
</main>
<script>${STATUS_SCRIPT}</script>
</body>
</html>
`;
