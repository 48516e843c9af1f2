/**
 * The live status page's script (status-html.ts): it follows `status/events` (EventSource, relative to the page, so
 * it works behind a path prefix) and renders each snapshot with `textContent` only, never as markup, so no label
 * value can become HTML. A string of its own, named by hash in the page's Content-Security-Policy (status-page.ts).
 * One script, kept whole: it is one program with one render loop, and shipped as one inline element.
 */
export const STATUS_SCRIPT = `
(function () {
  'use strict';
  var byId = function (id) { return document.getElementById(id); };
  var paused = false, latest = null, source = null, retryTimer = 0, retryDelay = 1000;

  function setConnection(state, text) { var el = byId('connection'); el.textContent = text; el.setAttribute('data-state', state); }
  function count(n) { return n === null || n === undefined ? '\\u2014' : Number(n).toLocaleString('en-US'); }
  function share(n, d) { return d > 0 ? (100 * n / d).toFixed(1) + '%' : '\\u2014'; }
  function ratio(r) { return r === null || r === undefined ? '\\u2014' : (100 * r).toFixed(1) + '%'; }
  function millis(v) {
    if (v === null || v === undefined) return '\\u2014';
    if (v >= 1000) return (v / 1000).toFixed(2) + ' s';
    return (v >= 10 ? Math.round(v) : v.toFixed(1)) + ' ms';
  }
  function clock(iso) { var d = new Date(iso); return isNaN(d.getTime()) ? '\\u2014' : d.toLocaleTimeString('en-GB', { hour12: false }); }
  function cell(tr, text, rowHeader, cls) {
    var c = document.createElement(rowHeader ? 'th' : 'td');
    if (rowHeader) c.scope = 'row';
    if (cls) c.className = cls;
    c.textContent = text;
    tr.appendChild(c);
    return c;
  }
  function fill(id, rows, columns, draw, empty) {
    var frag = document.createDocumentFragment();
    if (rows.length === 0) {
      var tr = document.createElement('tr');
      cell(tr, empty, false, 'text').colSpan = columns;
      frag.appendChild(tr);
    }
    rows.forEach(function (row) { var tr = document.createElement('tr'); draw(tr, row); frag.appendChild(tr); });
    byId(id).replaceChildren(frag);
  }
  function setText(id, text) { byId(id).textContent = text; }

  function drawFunnel(f) {
    var steps = [['requests', f.requests], ['2xx', f.http_2xx], ['delivered', f.delivered], ['accepted', f.accepted]];
    steps.forEach(function (step) {
      setText('f-' + step[0], count(step[1]));
      setText('f-' + step[0] + '-share', share(step[1], f.requests));
      byId('f-' + step[0] + '-bar').style.width = f.requests > 0 ? (100 * step[1] / f.requests) + '%' : '0';
    });
    setText('slo-attainment', ratio(f.slo_attainment));
    setText('slo-counts', count(f.slo_met) + ' met of ' + count(f.slo_eligible) + ' judged');
    setText('goodput', f.goodput_per_second.toFixed(2) + ' /s');
    setText('delivered-ratio', share(f.delivered, f.requests));
    setText('accepted-ratio', share(f.accepted, f.requests));
    // Beside the accepted ratio, its two cohort ratios, each over its own denominator (seed 000 section 7.3).
    setText('coverage-ratio', ratio(f.evaluation_coverage));
    setText('coverage-counts', count(f.evaluated) + ' of ' + count(f.checked) + ' checked evaluated');
    setText('accepted-evaluated-ratio', ratio(f.accepted_among_evaluated));
    setText('accepted-evaluated-counts', count(f.evaluated_accepted) + ' of ' + count(f.evaluated) + ' evaluated' + (f.evaluator > 0 ? '; ' + count(f.evaluator) + ' evaluator requests apart' : ''));
    var outcomes = Object.keys(f.outcomes).map(function (k) { return [k, f.outcomes[k]]; });
    fill('outcomes-body', outcomes, 3, function (tr, o) {
      cell(tr, o[0], true); cell(tr, count(o[1])); cell(tr, share(o[1], f.requests));
    }, 'no requests');
  }

  var SVG = 'http://www.w3.org/2000/svg';
  function drawSeries(series, bucketSeconds) {
    var svg = byId('series-chart');
    var max = 1;
    series.forEach(function (p) { if (p.requests > max) max = p.requests; });
    var width = 300, height = 100, step = width / Math.max(series.length, 1), frag = document.createDocumentFragment();
    series.forEach(function (p, i) {
      [['requests', 's-req'], ['delivered', 's-del'], ['accepted', 's-acc']].forEach(function (k) {
        var h = height * p[k[0]] / max;
        var r = document.createElementNS(SVG, 'rect');
        r.setAttribute('x', String(i * step + 0.5));
        r.setAttribute('width', String(Math.max(step - 1, 0.5)));
        r.setAttribute('y', String(height - h));
        r.setAttribute('height', String(h));
        r.setAttribute('class', k[1]);
        frag.appendChild(r);
      });
    });
    svg.replaceChildren(frag);
    var total = series.reduce(function (a, p) { return a + p.requests; }, 0);
    svg.setAttribute('aria-label', 'Requests, delivered and accepted per ' + bucketSeconds + ' s bucket over the window: ' +
      count(total) + ' requests in all, at most ' + count(max) + ' in one bucket. The table below has every bucket.');
    fill('series-body', series.slice().reverse(), 6, function (tr, p) {
      cell(tr, clock(p.start), true); cell(tr, count(p.requests)); cell(tr, count(p.http_2xx)); cell(tr, count(p.delivered));
      cell(tr, count(p.accepted)); cell(tr, p.slo_eligible > 0 ? share(p.slo_met, p.slo_eligible) : '\\u2014');
    }, 'no buckets');
  }

  function drawRows(id, rows) {
    fill(id, rows, 9, function (tr, r) {
      cell(tr, r.name, true); cell(tr, count(r.requests)); cell(tr, share(r.http_2xx, r.requests));
      cell(tr, share(r.delivered, r.requests)); cell(tr, share(r.accepted, r.requests));
      cell(tr, ratio(r.slo_attainment)); cell(tr, r.goodput_per_second.toFixed(2));
      cell(tr, count(r.prompt_tokens)); cell(tr, count(r.completion_tokens));
    }, 'none configured');
  }

  function drawUpstreams(rows) {
    fill('upstreams-body', rows, 11, function (tr, u) {
      cell(tr, u.name, true); cell(tr, u.pool, false, 'text');
      var state = u.circuit === 'open' ? 'ejected' : u.up ? 'up' : 'down';
      cell(tr, state, false, 'text ' + (state === 'up' ? 'ok' : 'bad'));
      cell(tr, u.healthy === null ? 'unknown' : u.healthy ? 'passing' : 'failing', false, 'text');
      cell(tr, u.circuit.replace('_', ' '), false, 'text');
      cell(tr, count(u.inflight) + (u.max_inflight === null ? '' : ' / ' + count(u.max_inflight)));
      cell(tr, count(u.attempts)); cell(tr, count(u.failed_attempts), false, u.failed_attempts > 0 ? 'bad' : '');
      cell(tr, millis(u.first_output.p50)); cell(tr, millis(u.first_output.p95));
      cell(tr, u.last_failure === null ? '\\u2014' : u.last_failure.result + ' at ' + clock(u.last_failure.at), false, 'text');
    }, 'no upstreams');
  }

  function drawLatency(rows) {
    fill('latency-body', rows, 9, function (tr, l) {
      cell(tr, l.prompt_len, true);
      cell(tr, count(l.ttft.count)); cell(tr, millis(l.ttft.p50)); cell(tr, millis(l.ttft.p95)); cell(tr, millis(l.ttft.p99));
      cell(tr, count(l.tpot.count)); cell(tr, millis(l.tpot.p50)); cell(tr, millis(l.tpot.p95)); cell(tr, millis(l.tpot.p99));
    }, 'no classes');
  }

  /** An id cell: the id as a button (cut to fit by CSS; whole in its text, its title and what it copies). */
  function idCell(tr, id, kind) {
    if (id === null || id === undefined) return cell(tr, '\\u2014', false, 'text');
    var c = cell(tr, '', false, 'text');
    var b = document.createElement('button');
    b.type = 'button';
    b.className = 'id';
    b.textContent = id;
    b.title = id + ' \\u2014 press to copy';
    b.setAttribute('data-id', id);
    b.setAttribute('data-kind', kind);
    b.setAttribute('aria-label', 'copy ' + kind + ' ' + id);
    c.appendChild(b);
    return c;
  }
  function copyId(button) {
    var id = button.getAttribute('data-id') || '';
    var selectIt = function () {
      var range = document.createRange();
      range.selectNodeContents(button);
      var selection = window.getSelection();
      if (selection) { selection.removeAllRanges(); selection.addRange(range); }
      setText('copy-status', id + ' selected: press Ctrl+C (\\u2318C) to copy it');
    };
    // The clipboard needs a secure context (https, or localhost); elsewhere the id is selected for the user to copy.
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(id).then(function () { setText('copy-status', 'Copied ' + id); }, selectIt);
    } else selectIt();
  }

  var failuresDrawn = null;
  function drawFailures(rows) {
    setText('failures-count', rows.length === 0 ? 'none yet' : rows.length + ' shown, newest first');
    // Redrawn only when they changed, so a focused or selected id stays focused or selected.
    var drawn = JSON.stringify(rows);
    if (drawn === failuresDrawn) return;
    failuresDrawn = drawn;
    var active = document.activeElement;
    var focused = active && active.classList && active.classList.contains('id') ? [active.getAttribute('data-kind'), active.getAttribute('data-id')] : null;
    fill('failures-body', rows, 10, function (tr, f) {
      tr.setAttribute('data-outcome', f.outcome);
      cell(tr, clock(f.at), true); idCell(tr, f.request_id, 'request id'); cell(tr, f.model, false, 'text');
      cell(tr, f.tenant, false, 'text'); cell(tr, f.route + (f.stream ? ' (stream)' : ''), false, 'text');
      cell(tr, String(f.code)); cell(tr, f.outcome, false, f.outcome === 'delivered' ? 'text warn' : 'text bad'); cell(tr, f.cause, false, 'text');
      cell(tr, f.upstream === null ? '\\u2014' : f.upstream + (f.attempts > 1 ? ' (' + f.attempts + ' attempts)' : ''), false, 'text');
      idCell(tr, f.trace_id, 'trace id');
    }, 'no failed requests kept');
    if (focused !== null) {
      var buttons = byId('failures-body').querySelectorAll('button.id');
      for (var i = 0; i < buttons.length; i++) {
        if (buttons[i].getAttribute('data-kind') === focused[0] && buttons[i].getAttribute('data-id') === focused[1]) { buttons[i].focus(); break; }
      }
    }
  }

  function render(s) {
    setText('generated', clock(s.generated_at));
    setText('gateway-state', s.state);
    var w = s.window;
    setText('window', 'Last ' + (w.seconds / 60) + ' minutes in ' + w.bucket_seconds + ' s buckets' +
      (w.covered_seconds < w.seconds ? ' (' + Math.round(w.covered_seconds) + ' s of data since the gateway started)' : '') + '.');
    drawFunnel(s.funnel);
    drawSeries(s.series, w.bucket_seconds);
    drawLatency(s.latency);
    drawRows('models-body', s.models);
    drawRows('tenants-body', s.tenants);
    drawUpstreams(s.upstreams);
    drawFailures(s.failures);
  }

  function connect() {
    if (source !== null) source.close();
    setConnection('connecting', 'connecting\\u2026');
    source = new EventSource('status/events');
    source.onopen = function () { retryDelay = 1000; setConnection('live', 'live'); };
    source.onmessage = function (event) {
      var snapshot;
      try { snapshot = JSON.parse(event.data); } catch (e) { return; }
      latest = snapshot;
      if (!paused) render(snapshot);
    };
    source.onerror = function () {
      setConnection('down', 'disconnected \\u2014 retrying');
      // A refused stream (503: too many pages open, or shutting down) closes the EventSource for good; retry ourselves.
      if (source.readyState === EventSource.CLOSED) {
        clearTimeout(retryTimer);
        retryTimer = setTimeout(connect, retryDelay);
        retryDelay = Math.min(retryDelay * 2, 30000);
      }
    };
  }

  byId('failures-body').addEventListener('click', function (event) {
    var button = event.target && event.target.closest ? event.target.closest('button.id') : null;
    if (button) copyId(button);
  });
  byId('pause').addEventListener('click', function () {
    paused = !paused;
    this.setAttribute('aria-pressed', String(paused));
    this.textContent = paused ? 'Resume updates' : 'Pause updates';
    if (!paused && latest !== null) render(latest);
  });
  connect();
})();
`;
