// Tailgate's built-in dashboard: polls v1/dashboard (live) and v1/history (stored samples)
// and draws small canvas line charts. No library: the gateway serves this file itself.
"use strict";

(() => {
  const PALETTE = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1",
    "#76b7b2", "#edc948", "#ff9da7", "#9c755f", "#7f7f7f",
  ];
  const THRESHOLD_COLORS = { admission: "#c53030", upper: "#dd6b20", lower: "#38a169" };
  const state = { samples: [], now: null, live: null, rangeS: 900, full: true, colors: new Map() };

  function colorOf(name) {
    if (!state.colors.has(name)) {
      state.colors.set(name, PALETTE[state.colors.size % PALETTE.length]);
    }
    return state.colors.get(name);
  }

  // -- formatting ----------------------------------------------------------------------
  const pct = (v) => (v * 100).toFixed(v < 0.01 ? 2 : 1) + "%";
  const ms = (v) => (v >= 1000 ? (v / 1000).toFixed(2) + " s" : v.toFixed(v < 10 ? 2 : 0) + " ms");
  const num = (v) => (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2));
  const clock = (t) => new Date(t * 1000).toLocaleTimeString([], { hour12: false });

  function niceStep(span, ticks) {
    const raw = span / Math.max(ticks, 1);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const norm = raw / mag;
    return (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
  }

  // -- one chart -----------------------------------------------------------------------
  // opts: {series: [{name, color, points: [[x, y|null]], dash, width}], hlines: [{y, color,
  // label, at (0..1: where along the line the label goes)}], vmarks: [{x, color, label}],
  // x: [x0, x1], xFormat, yFormat, yMax, yInteger}
  function drawChart(canvas, opts) {
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth;
    const h = canvas.clientHeight;
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
    const g = canvas.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    g.font = "11px system-ui, sans-serif";

    let count = 0;
    let yMax = opts.yMax || 0;
    for (const s of opts.series) {
      for (const [, y] of s.points) {
        if (y !== null && Number.isFinite(y)) {
          count += 1;
          yMax = Math.max(yMax, y);
        }
      }
    }
    canvas.dataset.points = String(count);
    for (const l of opts.hlines || []) {
      if (l.y !== null && Number.isFinite(l.y)) yMax = Math.max(yMax, l.y);
    }
    if (!(yMax > 0)) yMax = 1;
    yMax *= 1.08;

    const legendRows = layoutLegend(g, opts.series, w - 60);
    const left = 56;
    const right = 12;
    const top = 8 + legendRows.length * 15;
    const bottom = 20;
    const pw = w - left - right;
    const ph = h - top - bottom;
    const [x0, x1] = opts.x;
    const sx = (x) => left + ((x - x0) / (x1 - x0 || 1)) * pw;
    const sy = (y) => top + ph - (y / yMax) * ph;

    // grid and y labels
    g.strokeStyle = "#e3e6eb";
    g.fillStyle = "#6b7280";
    g.lineWidth = 1;
    g.textAlign = "right";
    g.textBaseline = "middle";
    const yStep = opts.yInteger ? Math.max(1, Math.round(niceStep(yMax, 4))) : niceStep(yMax, 4);
    for (let y = 0; y <= yMax + 1e-12; y += yStep) {
      const py = Math.round(sy(y)) + 0.5;
      g.beginPath();
      g.moveTo(left, py);
      g.lineTo(left + pw, py);
      g.stroke();
      g.fillText(opts.yFormat(y), left - 6, py);
    }
    // x labels
    g.textAlign = "center";
    g.textBaseline = "top";
    const xStep = niceStep(x1 - x0, 5);
    for (let x = Math.ceil(x0 / xStep) * xStep; x <= x1; x += xStep) {
      const px = sx(x);
      g.fillText(opts.xFormat(x), px, top + ph + 5);
      g.beginPath();
      g.moveTo(Math.round(px) + 0.5, top + ph);
      g.lineTo(Math.round(px) + 0.5, top + ph + 3);
      g.stroke();
    }
    g.strokeStyle = "#9aa1ad";
    g.strokeRect(left + 0.5, top + 0.5, pw, ph);

    g.save();
    g.beginPath();
    g.rect(left, top, pw, ph);
    g.clip();
    // vertical markers (autoscaler actions)
    for (const m of opts.vmarks || []) {
      if (m.x < x0 || m.x > x1) continue;
      const px = Math.round(sx(m.x)) + 0.5;
      g.strokeStyle = m.color;
      g.setLineDash([2, 3]);
      g.beginPath();
      g.moveTo(px, top);
      g.lineTo(px, top + ph);
      g.stroke();
      g.setLineDash([]);
      g.fillStyle = m.color;
      g.textAlign = "left";
      g.textBaseline = "top";
      g.fillText(m.label, px + 3, top + 2);
    }
    // series
    for (const s of opts.series) {
      g.strokeStyle = s.color;
      g.lineWidth = s.width || 1.6;
      g.setLineDash(s.dash || []);
      g.beginPath();
      let open = false;
      let lastX = null;
      for (const [x, y] of s.points) {
        const gap = lastX !== null && opts.gapX && x - lastX > opts.gapX;
        if (y === null || !Number.isFinite(y) || gap) open = false;
        if (y !== null && Number.isFinite(y)) {
          if (open) g.lineTo(sx(x), sy(y));
          else g.moveTo(sx(x), sy(y));
          open = true;
        }
        lastX = x;
      }
      g.stroke();
      // a lone point would not show as a line
      if (s.points.length === 1 && s.points[0][1] !== null) {
        g.fillStyle = s.color;
        g.fillRect(sx(s.points[0][0]) - 2, sy(s.points[0][1]) - 2, 4, 4);
      }
    }
    g.setLineDash([]);
    // thresholds
    for (const l of opts.hlines || []) {
      if (l.y === null || !Number.isFinite(l.y)) continue;
      const py = Math.round(sy(l.y)) + 0.5;
      g.strokeStyle = l.color;
      g.lineWidth = 1.2;
      g.setLineDash([6, 4]);
      g.beginPath();
      g.moveTo(left, py);
      g.lineTo(left + pw, py);
      g.stroke();
      g.setLineDash([]);
      g.fillStyle = l.color;
      g.textAlign = "right";
      g.textBaseline = "bottom";
      // Thresholds sit close together: each label has its own place along the line.
      g.fillText(l.label, left + pw * (l.at || 1) - 4, py - 2);
    }
    g.restore();

    drawLegend(g, legendRows, left);
    if (count === 0) {
      g.fillStyle = "#6b7280";
      g.textAlign = "center";
      g.textBaseline = "middle";
      g.font = "13px system-ui, sans-serif";
      g.fillText("no data yet", left + pw / 2, top + ph / 2);
    }
  }

  function layoutLegend(g, series, width) {
    const rows = [[]];
    let used = 0;
    for (const s of series) {
      const item = { name: s.name, color: s.color, dash: s.dash, w: g.measureText(s.name).width + 26 };
      if (used + item.w > width && rows[rows.length - 1].length) {
        rows.push([]);
        used = 0;
      }
      rows[rows.length - 1].push(item);
      used += item.w;
    }
    return rows.length === 1 && rows[0].length === 0 ? [] : rows;
  }

  function drawLegend(g, rows, left) {
    g.textAlign = "left";
    g.textBaseline = "middle";
    rows.forEach((row, i) => {
      let x = left;
      const y = 8 + i * 15;
      for (const item of row) {
        g.strokeStyle = item.color;
        g.lineWidth = 2;
        g.setLineDash(item.dash || []);
        g.beginPath();
        g.moveTo(x, y);
        g.lineTo(x + 16, y);
        g.stroke();
        g.setLineDash([]);
        g.fillStyle = "#1f2430";
        g.fillText(item.name, x + 20, y);
        x += item.w;
      }
    });
  }

  // -- data ----------------------------------------------------------------------------
  function seriesOf(key, name, pick, extra) {
    return Object.assign(
      { name, color: colorOf(key), points: state.samples.map((s) => [s.t, pick(s)]) },
      extra || {},
    );
  }

  function namesIn(field) {
    const names = new Set();
    for (const s of state.samples) for (const k of Object.keys(s[field] || {})) names.add(k);
    return [...names].sort();
  }

  function classNames() {
    const configured = (state.live ? state.live.classes : []).map((c) => c.name);
    const seen = new Set([...namesIn("qps"), ...namesIn("miss")]);
    seen.delete("all");
    return [...configured, ...[...seen].filter((n) => !configured.includes(n)).sort()];
  }

  function render() {
    const live = state.live;
    if (!live) return;
    const now = state.now || live.now;
    const interval = live.history.interval_s;
    // A young history spreads over the width (at least ten samples' worth), not a sliver.
    const first = state.samples.length ? state.samples[0].t : now;
    const x = [Math.max(now - state.rangeS, Math.min(first, now - 10 * interval)), now];
    const common = { x, xFormat: clock, gapX: Math.max(3 * interval, 2) };
    const classes = classNames();
    const th = live.thresholds;
    const scaling = live.autoscaler.enabled ? "" : " (autoscaling off)";
    const marks = live.autoscaler.actions.map((a) => ({
      x: a.t,
      color: a.to > a.from ? "#c53030" : "#2f855a",
      label: `${a.from}→${a.to}`,
    }));
    const charts = {};
    for (const c of document.querySelectorAll("canvas[data-chart]")) charts[c.dataset.chart] = c;

    drawChart(charts.miss, {
      ...common,
      series: [
        seriesOf("all", "all classes", (s) => (s.miss ? s.miss.all : null), { width: 2.4, color: "#1f2430" }),
        ...classes.map((c) => seriesOf(c, c, (s) => (s.miss && c in s.miss ? s.miss[c] : null))),
      ],
      hlines: [
        { y: th.admission, color: THRESHOLD_COLORS.admission, label: "admission R_cth" },
        { y: th.autoscale_upper, color: THRESHOLD_COLORS.upper, label: "scale-up R_sth^U" + scaling, at: 0.7 },
        { y: th.autoscale_lower, color: THRESHOLD_COLORS.lower, label: "scale-down R_sth^L" + scaling, at: 0.4 },
      ],
      vmarks: marks,
      yFormat: pct,
    });

    const slo = {};
    for (const c of live.classes) slo[c.name] = c;
    drawChart(charts.latency, {
      ...common,
      series: classes.map((c) => {
        const p = slo[c] ? `p${slo[c].percentile}` : "p99";
        return seriesOf(c, `${c} ${p}`, (s) => (s.tail_ms && c in s.tail_ms ? s.tail_ms[c] : null));
      }),
      hlines: live.classes.map((c) => ({ y: c.latency_ms, color: colorOf(c.name), label: `${c.name} SLO` })),
      yFormat: ms,
    });

    drawChart(charts.rejections, {
      ...common,
      series: [
        ...classes.map((c) =>
          seriesOf(c, `${c} rejected`, (s) => (s.rejected_per_s ? s.rejected_per_s[c] ?? 0 : null))),
        ...classes.map((c) =>
          seriesOf(c, `${c} deferred`, (s) => (s.deferred_per_s ? s.deferred_per_s[c] ?? 0 : null), {
            dash: [4, 3],
          })),
      ],
      yFormat: num,
    });

    drawChart(charts.throughput, {
      ...common,
      series: classes.map((c) => seriesOf(c, c, (s) => (s.qps ? s.qps[c] ?? 0 : null))),
      yFormat: num,
    });

    const servers = namesIn("server_queue");
    const pools = namesIn("queue");
    drawChart(charts.queues, {
      ...common,
      series: [
        ...servers.map((id) =>
          seriesOf("server:" + id, id, (s) => (s.server_queue && id in s.server_queue ? s.server_queue[id] : null))),
        ...pools.map((p) =>
          seriesOf("pool:" + p, `${p} (pool)`, (s) => (s.queue ? s.queue[p] ?? 0 : null), { dash: [5, 3] })),
      ],
      yFormat: (v) => v.toFixed(0),
      yInteger: true,
    });

    let xMax = 0;
    for (const c of live.cdfs) xMax = Math.max(xMax, c.points[c.points.length - 1][0]);
    drawChart(charts.cdf, {
      x: [0, xMax || 1],
      xFormat: (v) => ms(v),
      yFormat: (v) => v.toFixed(2),
      yMax: 1 / 1.08,
      series: live.cdfs.map((c) => ({
        name: c.servers.length > 1 ? `${c.servers[0]} +${c.servers.length - 1}` : c.servers[0],
        color: colorOf("server:" + c.servers[0]),
        points: c.points,
      })),
      hlines: [{ y: 0.99, color: "#6b7280", label: "F = 0.99" }],
    });

    const replicaPools = namesIn("replicas");
    drawChart(charts.servers, {
      ...common,
      series: [
        seriesOf("servers:up", "up", (s) => (s.servers ? s.servers.up || 0 : null), { color: "#2f855a" }),
        seriesOf("servers:all", "registered", (s) =>
          s.servers ? Object.values(s.servers).reduce((a, b) => a + b, 0) : null, { color: "#4a5568", dash: [4, 3] }),
        ...replicaPools.map((p) =>
          seriesOf("replicas:" + p, `replicas (${p})`, (s) => (s.replicas && p in s.replicas ? s.replicas[p] : null), {
            color: "#dd6b20",
          })),
      ],
      vmarks: marks,
      yFormat: (v) => v.toFixed(0),
      yInteger: true,
    });

    renderTable(live);
    renderActions(live);
    renderSummary(live);
  }

  function cell(tr, text, cls) {
    const td = document.createElement("td");
    if (cls) td.className = cls;
    td.textContent = text;
    tr.appendChild(td);
    return td;
  }

  function renderTable(live) {
    const body = document.querySelector("#servers tbody");
    body.replaceChildren();
    for (const s of live.servers) {
      const tr = document.createElement("tr");
      cell(tr, s.id);
      cell(tr, s.pool);
      cell(tr, s.cluster || "");
      const badge = document.createElement("span");
      badge.className = "state " + s.state;
      badge.textContent = s.state;
      cell(tr, "").appendChild(badge);
      cell(tr, String(s.outstanding), "num");
      cell(tr, pct(s.miss_ratio), "num");
      const q = s.post_queue_ms || {};
      for (const k of ["p50", "p99", "p99.9"]) cell(tr, k in q ? ms(q[k]) : "", "num");
      cell(tr, s.rtt_ms === null ? "" : ms(s.rtt_ms), "num");
      body.appendChild(tr);
    }
    if (!live.servers.length) {
      const tr = document.createElement("tr");
      cell(tr, "no server registered", "empty").colSpan = 10;
      body.appendChild(tr);
    }
  }

  function renderActions(live) {
    const a = live.autoscaler;
    document.getElementById("autoscaler-note").textContent = a.enabled
      ? `${a.policy} policy on pool ${a.pool}: ${a.replicas} replica(s) now`
      : "autoscaling is off (tailgate up --autoscale, or [autoscaling] enabled = true)";
    const list = document.getElementById("actions");
    list.replaceChildren();
    for (const act of [...a.actions].reverse()) {
      const li = document.createElement("li");
      const dir = document.createElement("span");
      dir.className = act.to > act.from ? "up" : "down";
      dir.textContent = `${act.from} → ${act.to}`;
      li.append(`${clock(act.t)}  `, dir, `  ${act.reason}, miss ratio ${pct(act.miss_ratio)}`);
      list.appendChild(li);
    }
    if (!a.actions.length) {
      const li = document.createElement("li");
      li.className = "empty";
      li.textContent = "no scaling action yet";
      list.appendChild(li);
    }
  }

  function renderSummary(live) {
    const up = live.servers.filter((s) => s.state === "up").length;
    const adm = live.admission;
    document.getElementById("summary").textContent =
      `${live.servers_total} server(s), ${up} up · admission ${adm.rule}: miss ratio ` +
      `${pct(adm.miss_ratio)}${adm.overloaded ? " (overloaded: rejecting)" : ""} · ` +
      `history every ${live.history.interval_s} s in ${live.history.storage || "memory"}`;
  }

  // -- polling -------------------------------------------------------------------------
  async function getJSON(path) {
    const r = await fetch(path, { cache: "no-store" });
    if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
    return r.json();
  }

  function merge(samples, full) {
    if (full) {
      state.samples = samples;
    } else {
      const last = state.samples.length ? state.samples[state.samples.length - 1].t : -Infinity;
      for (const s of samples) if (s.t > last) state.samples.push(s);
    }
    const cutoff = (state.now || 0) - state.rangeS;
    let drop = 0;
    while (drop < state.samples.length && state.samples[drop].t < cutoff) drop += 1;
    if (drop) state.samples.splice(0, drop);
  }

  function setStatus(text, cls) {
    const el = document.getElementById("status");
    el.textContent = text;
    el.className = "status " + cls;
  }

  async function poll() {
    try {
      const live = await getJSON("v1/dashboard");
      state.live = live;
      for (const c of live.classes) colorOf(c.name);
      const full = state.full || !state.samples.length;
      const last = state.samples.length ? state.samples[state.samples.length - 1].t : live.now;
      const since = full ? state.rangeS : Math.max(1, live.now - last + 1);
      const h = await getJSON(`v1/history?since_s=${since.toFixed(3)}`);
      state.now = h.now;
      merge(h.samples, full);
      state.full = false;
      render();
      document.body.dataset.samples = String(state.samples.length);
      setStatus(`live · ${clock(h.now)}`, "ok");
    } catch (err) {
      setStatus(`disconnected: ${err.message}`, "err");
    }
    const interval = state.live ? state.live.history.interval_s : 2;
    setTimeout(poll, Math.min(Math.max(interval * 1000, 500), 2000));
  }

  document.getElementById("range").addEventListener("change", (e) => {
    state.rangeS = Number(e.target.value);
    state.full = true;
  });
  window.addEventListener("resize", () => render());
  poll();
})();
