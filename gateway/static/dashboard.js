// Tailgate's built-in dashboard: polls v1/dashboard (live), v1/history (stored samples) and,
// with autoscaling on, v1/autoscaler, and draws uPlot charts (vendored beside this file:
// vendor/uplot, served by the gateway itself; no CDN). Hover a chart for a tooltip and the
// legend's values at that time; click a legend entry to hide or show its series.
"use strict";

(() => {
  // Classes keep one colour in every panel; outcomes, servers and clusters have their own.
  const CLASS_COLORS = [
    "#2563eb", "#ea580c", "#7c3aed", "#0891b2", "#be185d", "#65a30d", "#92400e", "#475569",
  ];
  const PALETTE = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1",
    "#76b7b2", "#edc948", "#ff9da7", "#9c755f", "#7f7f7f",
  ];
  const OUTCOMES = [
    ["met", "met", "#2e9e5b"],
    ["missed_slo", "missed SLO", "#f2b134"],
    ["rejected", "rejected", "#7b61ff"],
    ["dropped", "dropped", "#ff8fab"],
    ["failed", "failed", "#d62728"],
    ["timeout", "timed out", "#8c2d04"],
  ];
  const THRESHOLD_COLORS = { admission: "#c53030", upper: "#dd6b20", lower: "#2f855a" };
  const CHART_HEIGHT = 240;
  const state = {
    samples: [], now: null, live: null, scaler: null, rangeS: 900, full: true,
    colors: new Map(), charts: {}, hidden: {},
  };
  // For the browser test and for a curious reader: the live uPlot instances.
  window.tailgateDashboard = { charts: state.charts };

  function colorOf(key) {
    if (!state.colors.has(key)) {
      const n = [...state.colors.keys()].filter((k) => !k.startsWith("class:")).length;
      state.colors.set(key, PALETTE[n % PALETTE.length]);
    }
    return state.colors.get(key);
  }

  function classColor(name) {
    const key = "class:" + name;
    if (!state.colors.has(key)) {
      const n = [...state.colors.keys()].filter((k) => k.startsWith("class:")).length;
      state.colors.set(key, CLASS_COLORS[n % CLASS_COLORS.length]);
    }
    return state.colors.get(key);
  }

  // -- formatting ----------------------------------------------------------------------
  const pct = (v) => (v * 100).toFixed(Math.abs(v) < 0.01 ? 2 : 1) + "%";
  const ms = (v) => (v >= 1000 ? (v / 1000).toFixed(2) + " s" : v.toFixed(v < 10 ? 2 : 0) + " ms");
  const num = (v) => (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2));
  const perS = (v) => num(v) + "/s";
  const secs = (v) => (v >= 10 ? v.toFixed(0) : v.toFixed(1)) + " s";
  const int = (v) => v.toFixed(0);
  const clock = (t) => new Date(t * 1000).toLocaleTimeString([], { hour12: false });
  const finite = (v) => (typeof v === "number" && Number.isFinite(v) ? v : null);
  const positive = (v) => (typeof v === "number" && Number.isFinite(v) && v > 0 ? v : null);

  // -- uPlot glue ----------------------------------------------------------------------
  // A chart spec: {series: [{label, color, dash, width, fill, fmt}], data: [xs, ...ys],
  //   x: [x0, x1] (time charts) or null (auto), xFmt (non-time charts), yFmt, log, yMax,
  //   stacked, hlines: [{y, color, label}], vmarks: [{x, color, label}], empty (text)}.

  function stackUp(raw, shown) {
    // Cumulative sums bottom-up over the shown series; uPlot draws the later (smaller)
    // ones over the earlier, so series run from the top of the stack down.
    const [xs, ...ys] = raw;
    const out = ys.map(() => new Array(xs.length).fill(null));
    for (let i = 0; i < xs.length; i++) {
      let acc = 0;
      let any = false;
      for (let s = ys.length - 1; s >= 0; s--) {
        const v = ys[s][i];
        if (v !== null) any = true;
        if (shown[s] && v !== null) acc += v;
        out[s][i] = any && shown[s] ? acc : null;
      }
    }
    return [xs, ...out];
  }

  function yRange(c, dmin, dmax) {
    const spec = c.spec;
    const marks = (spec.hlines || []).map((h) => h.y).filter((y) => finite(y) !== null);
    if (spec.log) {
      const vals = [dmin, dmax, ...marks].filter((v) => positive(v) !== null);
      if (!vals.length) return [1, 1000];
      // Whole decades: the axis reads 10 ms, 100 ms, 1 s whatever the data.
      return uPlot.rangeLog(Math.min(...vals) / 1.2, Math.max(...vals) * 1.2, 10, true);
    }
    let hi = Math.max(finite(dmax) ?? 0, ...marks, spec.yMax || 0);
    if (!(hi > 0)) hi = 1;
    return [0, hi * 1.08];
  }

  function drawMarks(u, c) {
    const spec = c.spec;
    const ctx = u.ctx;
    const px = uPlot.pxRatio;
    const { left, top, width, height } = u.bbox;
    ctx.save();
    ctx.beginPath();
    ctx.rect(left, top, width, height);
    ctx.clip();
    ctx.font = `${11 * px}px system-ui, sans-serif`;
    ctx.textBaseline = "top";
    for (const m of spec.vmarks || []) {
      const x = Math.round(u.valToPos(m.x, "x", true)) + 0.5;
      if (x < left || x > left + width) continue;
      ctx.strokeStyle = m.color;
      ctx.lineWidth = px;
      ctx.setLineDash([2 * px, 3 * px]);
      ctx.beginPath();
      ctx.moveTo(x, top);
      ctx.lineTo(x, top + height);
      ctx.stroke();
      ctx.setLineDash([]);
      ctx.fillStyle = m.color;
      ctx.textAlign = "left";
      ctx.fillText(m.label, x + 3 * px, top + 2 * px);
    }
    // Threshold lines, each labelled on a white plate; labels that would overlap another's
    // move left along their line.
    const placed = [];
    ctx.textBaseline = "bottom";
    ctx.textAlign = "left";
    const sc = u.scales.y;
    for (const h of spec.hlines || []) {
      if (finite(h.y) === null || h.y < sc.min || h.y > sc.max) continue;
      const y = Math.round(u.valToPos(h.y, "y", true)) + 0.5;
      ctx.strokeStyle = h.color;
      ctx.lineWidth = 1.5 * px;
      ctx.setLineDash([6 * px, 4 * px]);
      ctx.beginPath();
      ctx.moveTo(left, y);
      ctx.lineTo(left + width, y);
      ctx.stroke();
      ctx.setLineDash([]);
      const tw = ctx.measureText(h.label).width;
      const th = 13 * px;
      let right = left + width - 4 * px;
      for (const p of placed) {
        if (Math.abs(p.y - y) < th + 2 * px && right > p.x0 - 8 * px) right = p.x0 - 8 * px;
      }
      const x0 = right - tw;
      const ly = y - 2 * px < top + th ? y + th + 2 * px : y - 2 * px;
      ctx.fillStyle = "rgba(255,255,255,0.88)";
      ctx.fillRect(x0 - 3 * px, ly - th, tw + 6 * px, th);
      ctx.fillStyle = h.color;
      ctx.fillText(h.label, x0, ly);
      placed.push({ x0: x0 - 3 * px, y });
    }
    ctx.restore();
  }

  // The value a series has at a data index (stacked charts: before stacking).
  function rawValue(u, c, si, idx) {
    const v = (c.raw || u.data)[si][idx];
    return v === undefined ? null : v;
  }

  function tooltip(c) {
    let tip = null;
    return {
      hooks: {
        init: (u) => {
          tip = document.createElement("div");
          tip.className = "u-tooltip";
          tip.style.display = "none";
          u.over.appendChild(tip);
        },
        setCursor: (u) => {
          const idx = u.cursor.idx;
          if (idx === null || idx === undefined || u.cursor.left < 0) {
            tip.style.display = "none";
            return;
          }
          const x = u.data[0][idx];
          const head = document.createElement("div");
          head.className = "t";
          head.textContent = c.spec.xFmt ? c.spec.xFmt(x) : clock(x);
          const rows = [head];
          c.spec.series.forEach((s, i) => {
            const v = rawValue(u, c, i + 1, idx);
            if (!u.series[i + 1].show || v === null) return;
            const row = document.createElement("div");
            const sw = document.createElement("span");
            sw.className = "sw";
            sw.style.background = s.color;
            row.append(sw, `${s.label}: ${(s.fmt || c.spec.yFmt)(v)}`);
            rows.push(row);
          });
          if (rows.length === 1) {
            tip.style.display = "none";
            return;
          }
          tip.replaceChildren(...rows);
          tip.style.display = "block";
          const ow = u.over.clientWidth;
          const tw = tip.offsetWidth;
          const left = u.cursor.left + 14 + tw > ow ? u.cursor.left - 14 - tw : u.cursor.left + 14;
          tip.style.left = Math.max(left, 0) + "px";
          tip.style.top = Math.max(u.cursor.top - 10, 0) + "px";
        },
      },
    };
  }

  function create(name, el, spec, key) {
    const hidden = state.hidden[name] || new Set();
    const c = { key, spec, raw: null, u: null };
    const time = !spec.xFmt;
    const series = [
      time ? { label: "time", value: (u, v) => (v === null ? "–" : clock(v)) }
        : { label: spec.xLabel || "x", value: (u, v) => (v === null ? "–" : spec.xFmt(v)) },
      ...spec.series.map((s, i) => ({
        label: s.label,
        stroke: s.color,
        width: s.width || 1.6,
        dash: s.dash,
        fill: s.fill,
        show: !hidden.has(s.label),
        spanGaps: !!spec.spanGaps,
        value: (u, v, si, idx) => {
          const raw = idx === null || idx === undefined ? null : rawValue(u, c, i + 1, idx);
          return raw === null ? "–" : (s.fmt || c.spec.yFmt)(raw);
        },
      })),
    ];
    const y = { range: (u, dmin, dmax) => yRange(c, dmin, dmax) };
    if (spec.log) Object.assign(y, { distr: 3, log: 10 });
    const opts = {
      width: Math.max(el.clientWidth, 200),
      height: CHART_HEIGHT,
      series,
      scales: {
        x: time
          ? { time: true, range: (u, a, b) => c.spec.x || [a, b] }
          : { time: false },
        y,
      },
      axes: [
        time ? {} : { values: (u, splits) => splits.map((v) => (v === null ? "" : c.spec.xFmt(v))) },
        {
          size: 62,
          values: (u, splits) => splits.map((v) => (v === null ? "" : c.spec.yFmt(v))),
        },
      ],
      cursor: { drag: { x: false, y: false } },
      legend: { live: true },
      plugins: [tooltip(c)],
      hooks: {
        draw: [(u) => drawMarks(u, c)],
        setSeries: [
          (u, si) => {
            if (si === null) return;
            const set = state.hidden[name] || (state.hidden[name] = new Set());
            if (u.series[si].show) set.delete(u.series[si].label);
            else set.add(u.series[si].label);
            if (c.spec.stacked) u.setData(stackUp(c.raw, shownOf(u)), false);
          },
        ],
      },
    };
    const data = spec.stacked ? stackUp(spec.data, spec.series.map((s) => !hidden.has(s.label))) : spec.data;
    c.raw = spec.stacked ? spec.data : null;
    c.u = new uPlot(opts, data, el);
    return c;
  }

  function shownOf(u) {
    return u.series.slice(1).map((s) => s.show);
  }

  function draw(name, spec) {
    const el = document.querySelector(`.chart[data-chart="${name}"]`);
    if (!el) return;
    const key = JSON.stringify([spec.series.map((s) => [s.label, s.color, s.dash || 0]), !!spec.log]);
    let c = state.charts[name];
    if (c && c.key !== key) {
      c.u.destroy();
      c = null;
    }
    let points = 0;
    for (const ys of spec.data.slice(1)) for (const v of ys) if (v !== null) points += 1;
    if (!c) {
      c = state.charts[name] = create(name, el, spec, key);
    } else {
      c.spec = spec;
      if (spec.stacked) {
        c.raw = spec.data;
        c.u.setData(stackUp(spec.data, shownOf(c.u)), true);
      } else {
        c.u.setData(spec.data, true);
      }
    }
    el.dataset.points = String(points);
    el.dataset.series = String(spec.series.length);
    let note = el.querySelector(".empty-note");
    if (points === 0) {
      if (!note) {
        note = document.createElement("div");
        note.className = "empty-note";
        el.appendChild(note);
      }
      note.textContent = spec.empty || "no data yet";
    } else if (note) {
      note.remove();
    }
  }

  // -- data ----------------------------------------------------------------------------
  function timeline() {
    const live = state.live;
    const interval = live.history.interval_s;
    const now = state.now || live.now;
    const first = state.samples.length ? state.samples[0].t : now;
    // A young history spreads over the width (at least ten samples' worth), not a sliver.
    return {
      x: [Math.max(now - state.rangeS, Math.min(first, now - 10 * interval)), now],
      gapS: Math.max(3 * interval, 2, (1.5 * state.rangeS) / Math.max(state.samples.length, 1)),
      interval,
    };
  }

  // [xs, ...ys] from the samples, one value per pick; a null row breaks the lines where
  // the history has a gap (the gateway was down).
  function fromSamples(picks, gapS, interval) {
    const xs = [];
    const ys = picks.map(() => []);
    let last = null;
    for (const s of state.samples) {
      if (last !== null && s.t - last > gapS) {
        xs.push(last + interval);
        for (const a of ys) a.push(null);
      }
      xs.push(s.t);
      picks.forEach((p, i) => ys[i].push(finite(p(s))));
      last = s.t;
    }
    return [xs, ...ys];
  }

  // [xs, ...ys] from lists of [x, y] points on x values of their own (nulls elsewhere).
  function align(lists) {
    const xs = [...new Set(lists.flatMap((l) => l.map((p) => p[0])))].sort((a, b) => a - b);
    const at = new Map(xs.map((x, i) => [x, i]));
    return [
      xs,
      ...lists.map((l) => {
        const ys = new Array(xs.length).fill(null);
        for (const [x, y] of l) ys[at.get(x)] = finite(y);
        return ys;
      }),
    ];
  }

  function namesIn(field) {
    const names = new Set();
    for (const s of state.samples) for (const k of Object.keys(s[field] || {})) names.add(k);
    return [...names].sort();
  }

  function classNames() {
    const configured = (state.live ? state.live.classes : []).map((c) => c.name);
    const seen = new Set([...namesIn("qps"), ...namesIn("miss"), ...namesIn("outcome_per_s")]);
    seen.delete("all");
    return [...configured, ...[...seen].filter((n) => !configured.includes(n)).sort()];
  }

  function outcomeRate(s, outcome, cls) {
    const per = s.outcome_per_s;
    if (!per) return null;
    let sum = 0;
    for (const [c, rates] of Object.entries(per)) {
      if (cls === undefined || c === cls) sum += rates[outcome] || 0;
    }
    return sum;
  }

  function totalRate(s) {
    if (!s.outcome_per_s) return null;
    let sum = 0;
    for (const rates of Object.values(s.outcome_per_s)) {
      for (const v of Object.values(rates)) sum += v;
    }
    return sum;
  }

  // An entry of the policy's decisions stands for a run of equal ones, `time` to `last_time`.
  function runOf(d, v) {
    const end = finite(d.last_time);
    return end !== null && end > d.time ? [[d.time, v], [end, v]] : [[d.time, v]];
  }

  function decisions() {
    const ps = state.scaler && state.scaler.policy_state;
    return ps && Array.isArray(ps.decisions) ? ps.decisions.filter((d) => finite(d.time) !== null) : [];
  }

  // -- panels --------------------------------------------------------------------------
  function render() {
    const live = state.live;
    if (!live) return;
    const { x, gapS, interval } = timeline();
    const classes = classNames();
    const th = live.thresholds;
    const scaling = live.autoscaler.enabled ? "" : " (autoscaling off)";
    const marks = live.autoscaler.actions.map((a) => ({
      x: a.t,
      color: a.to > a.from ? "#c53030" : "#2f855a",
      label: `${a.from}→${a.to}`,
    }));
    const slo = {};
    for (const c of live.classes) slo[c.name] = c;
    const series = (picks) => fromSamples(picks, gapS, interval);

    draw("latency", {
      x,
      log: true,
      yFmt: ms,
      series: classes.map((c) => ({
        label: `${c} p${slo[c] ? slo[c].percentile : 99}`,
        color: classColor(c),
        width: 2,
      })),
      data: series(classes.map((c) => (s) => positive(s.tail_ms ? s.tail_ms[c] : null))),
      hlines: live.classes.map((c) => ({
        y: c.latency_ms,
        color: classColor(c.name),
        label: `${c.name} SLO: p${c.percentile} ≤ ${ms(c.latency_ms)}`,
      })),
    });

    draw("outcomes", {
      x,
      stacked: true,
      yFmt: perS,
      series: OUTCOMES.slice().reverse().map(([, label, color]) => ({
        label, color, fill: color + "cc", width: 1,
      })),
      data: series(OUTCOMES.slice().reverse().map(([o]) => (s) => outcomeRate(s, o))),
    });

    draw("miss", {
      x,
      yFmt: pct,
      series: [
        { label: "all classes", color: "#1f2430", width: 2.4 },
        ...classes.map((c) => ({ label: c, color: classColor(c) })),
      ],
      data: series([
        (s) => (s.miss ? s.miss.all : null),
        ...classes.map((c) => (s) => (s.miss && c in s.miss ? s.miss[c] : null)),
      ]),
      hlines: [
        { y: th.admission, color: THRESHOLD_COLORS.admission, label: `admission R_cth ${th.admission === null ? "" : pct(th.admission)}` },
        { y: th.autoscale_upper, color: THRESHOLD_COLORS.upper, label: `scale-up R_sth^U ${pct(th.autoscale_upper)}${scaling}` },
        { y: th.autoscale_lower, color: THRESHOLD_COLORS.lower, label: `scale-down R_sth^L ${pct(th.autoscale_lower)}${scaling}` },
      ],
      vmarks: marks,
    });

    draw("errors", {
      x,
      yFmt: perS,
      series: [
        { label: "502 failed", color: "#d62728", width: 2 },
        { label: "503 rejected or dropped", color: "#7b61ff", width: 2 },
        { label: "504 timed out", color: "#8c2d04", width: 2 },
      ],
      data: series([
        (s) => outcomeRate(s, "failed"),
        (s) => (s.outcome_per_s ? outcomeRate(s, "rejected") + outcomeRate(s, "dropped") : null),
        (s) => outcomeRate(s, "timeout"),
      ]),
    });

    draw("rejections", {
      x,
      yFmt: perS,
      series: [
        ...classes.map((c) => ({ label: `${c} rejected`, color: classColor(c) })),
        ...classes.map((c) => ({ label: `${c} deferred`, color: classColor(c), dash: [4, 3] })),
      ],
      data: series([
        ...classes.map((c) => (s) => (s.rejected_per_s ? s.rejected_per_s[c] ?? 0 : null)),
        ...classes.map((c) => (s) => (s.deferred_per_s ? s.deferred_per_s[c] ?? 0 : null)),
      ]),
    });

    draw("throughput", {
      x,
      yFmt: perS,
      series: classes.map((c) => ({ label: c, color: classColor(c) })),
      data: series(classes.map((c) => (s) => (s.qps ? s.qps[c] ?? 0 : null))),
    });

    const servers = namesIn("server_queue");
    const pools = namesIn("queue");
    draw("queues", {
      x,
      yFmt: int,
      series: [
        ...servers.map((id) => ({ label: id, color: colorOf("server:" + id) })),
        ...pools.map((p) => ({ label: `${p} (pool)`, color: colorOf("pool:" + p), dash: [5, 3] })),
      ],
      data: series([
        ...servers.map((id) => (s) => (s.server_queue && id in s.server_queue ? s.server_queue[id] : null)),
        ...pools.map((p) => (s) => (s.queue ? s.queue[p] ?? 0 : null)),
      ]),
    });

    draw("cdf", {
      x: null,
      xFmt: ms,
      xLabel: "post-queuing",
      spanGaps: true,
      yFmt: (v) => v.toFixed(2),
      yMax: 1 / 1.08,
      series: live.cdfs.map((c) => ({
        label: c.servers.length > 1 ? `${c.servers[0]} +${c.servers.length - 1}` : c.servers[0],
        color: colorOf("server:" + c.servers[0]),
        fmt: (v) => "F = " + v.toFixed(3),
      })),
      data: align(live.cdfs.map((c) => c.points)),
      hlines: [{ y: 0.99, color: "#6b7280", label: "F = 0.99" }],
    });

    const pipelineServers = live.servers.filter((s) => s.executor === "pipeline").length;
    const goodput = namesIn("goodput_per_s");
    const modules = namesIn("drops_per_s");
    document.getElementById("pipeline-note").dataset.servers = String(pipelineServers);
    draw("pipeline", {
      x,
      yFmt: perS,
      series: [
        ...goodput.map((id) => ({ label: `${id} goodput`, color: colorOf("server:" + id), width: 2 })),
        ...modules.map((m) => ({ label: `dropped at ${m}`, color: colorOf("module:" + m), dash: [5, 3] })),
      ],
      data: series([
        ...goodput.map((id) => (s) => (s.goodput_per_s ? s.goodput_per_s[id] ?? null : null)),
        ...modules.map((m) => (s) => (s.drops_per_s ? s.drops_per_s[m] ?? 0 : null)),
      ]),
      empty: pipelineServers ? "no pipeline task done yet" : "no pipeline server registered",
    });

    const agents = live.servers.filter((s) => s.executor === "sensing").length;
    const clusters = [...new Set([...namesIn("edge_silent_s"), ...namesIn("edge_p99_ms")])].sort();
    const edgeEmpty = agents ? "no sample yet" : "no edge agent registered";
    draw("edge_latency", {
      x,
      log: true,
      yFmt: ms,
      series: clusters.map((c) => ({ label: c, color: colorOf("cluster:" + c), width: 2 })),
      data: series(clusters.map((c) => (s) => positive(s.edge_p99_ms ? s.edge_p99_ms[c] : null))),
      empty: edgeEmpty,
    });
    draw("edge_staleness", {
      x,
      yFmt: secs,
      series: clusters.map((c) => ({ label: c, color: colorOf("cluster:" + c), width: 2 })),
      data: series(clusters.map((c) => (s) => (s.edge_silent_s ? s.edge_silent_s[c] ?? null : null))),
      hlines: [{
        y: live.heartbeat.timeout_s,
        color: THRESHOLD_COLORS.admission,
        label: `heartbeat timeout ${secs(live.heartbeat.timeout_s)}: down`,
      }],
      empty: edgeEmpty,
    });

    renderScaler(x, marks, gapS, interval);
    renderSlo(live, classes, slo);
    renderTable(live);
    renderActions(live);
    renderSummary(live);
  }

  function renderScaler(x, marks, gapS, interval) {
    const pools = namesIn("replicas");
    const hist = fromSamples(
      [
        (s) => (s.servers ? s.servers.up || 0 : null),
        (s) => (s.servers ? Object.values(s.servers).reduce((a, b) => a + b, 0) : null),
        ...pools.map((p) => (s) => (s.replicas && p in s.replicas ? s.replicas[p] : null)),
        (s) => totalRate(s),
      ],
      gapS,
      interval,
    );
    const xs = hist[0];
    const points = (ys) => xs.map((t, i) => [t, ys[i]]);
    const ds = decisions().filter((d) => (finite(d.last_time) ?? d.time) >= x[0]);
    const serverLists = [points(hist[1]), points(hist[2]), ...pools.map((_, i) => points(hist[3 + i]))];
    const serverSeries = [
      { label: "up", color: "#2f855a", width: 2 },
      { label: "registered", color: "#4a5568", dash: [4, 3] },
      ...pools.map((p) => ({ label: `pool ${p} size`, color: "#dd6b20", width: 2 })),
    ];
    if (ds.length) {
      serverLists.push(ds.flatMap((d) => runOf(d, d.required)), ds.flatMap((d) => runOf(d, d.in_use)));
      serverSeries.push(
        { label: "n_B required", color: "#7c3aed", dash: [6, 3], width: 2 },
        { label: "in use", color: "#0891b2", width: 1.4 },
      );
    }
    draw("servers", {
      x, yFmt: int, spanGaps: true, series: serverSeries, data: align(serverLists), vmarks: marks,
    });
    const rateLists = [points(hist[hist.length - 1])];
    const rateSeries = [{ label: "arrived", color: "#1f2430", width: 2 }];
    if (ds.length) {
      // A run holds its latest prediction, made at its last decision.
      rateLists.push(ds.map((d) => [finite(d.last_time) ?? d.time, d.predicted_rate_per_s]));
      rateSeries.push({ label: "predicted", color: "#7c3aed", dash: [6, 3], width: 2 });
    }
    draw("rates", {
      x, yFmt: perS, spanGaps: true, series: rateSeries, data: align(rateLists), vmarks: marks,
    });
  }

  // SLO attainment over the range: each sample's rates times the time it stands for (the
  // gap to the one before, capped where the history has a hole).
  function renderSlo(live, classes, slo) {
    const { gapS, interval } = timeline();
    const box = document.getElementById("slo");
    const tiles = [];
    for (const c of classes) {
      const conf = slo[c];
      let good = 0;
      let all = 0;
      let counted = 0;
      let prev = null;
      for (const s of state.samples) {
        const w = prev === null ? interval : Math.min(s.t - prev, gapS);
        prev = s.t;
        const rates = s.outcome_per_s && s.outcome_per_s[c];
        if (!rates) continue;
        counted += 1;
        for (const [o, v] of Object.entries(rates)) {
          all += v * w;
          if (o === "met") good += v * w;
        }
      }
      const tile = document.createElement("div");
      tile.className = "slo-tile";
      tile.dataset.class = c;
      tile.style.borderLeftColor = classColor(c);
      const h = document.createElement("h3");
      h.textContent = `class ${c}`;
      const target = document.createElement("div");
      target.className = "target";
      target.textContent = conf
        ? `SLO: p${conf.percentile} ≤ ${ms(conf.latency_ms)} (target ${pct(conf.percentile / 100)} met)`
        : "custom SLOs (per query)";
      tile.append(h, target);
      const figures = document.createElement("div");
      figures.className = "figures";
      const figure = (cls, value, key) => {
        const f = document.createElement("div");
        f.className = "figure " + cls;
        const v = document.createElement("div");
        v.className = "v";
        v.textContent = value;
        const k = document.createElement("div");
        k.className = "k";
        k.textContent = key;
        f.append(v, k);
        figures.appendChild(f);
      };
      if (all > 0) {
        const attainment = good / all;
        tile.dataset.attainment = attainment.toFixed(6);
        figure("attainment", pct(attainment), "attainment");
        if (conf) {
          const budget = 1 - conf.percentile / 100;
          const left = budget > 0 ? 1 - (1 - attainment) / budget : attainment >= 1 ? 1 : -Infinity;
          tile.dataset.budgetLeft = Number.isFinite(left) ? left.toFixed(6) : "-inf";
          figure("left", Number.isFinite(left) ? (left <= 0 ? "exhausted" : pct(left)) : "exhausted",
            "error budget left");
          tile.classList.add(left > 0.25 ? "ok" : left > 0 ? "warn" : "bad");
          const bar = document.createElement("div");
          bar.className = "budget";
          const fill = document.createElement("div");
          fill.style.width = `${Math.max(0, Math.min(1, Number.isFinite(left) ? left : 0)) * 100}%`;
          bar.appendChild(fill);
          tile.append(figures, bar);
        } else {
          tile.append(figures);
        }
        const lastTail = [...state.samples].reverse().find((s) => s.tail_ms && c in s.tail_ms);
        const counts = document.createElement("div");
        counts.className = "counts";
        counts.textContent = `≈${Math.round(all)} queries in ${counted} samples` +
          (lastTail ? ` · latest tail ${ms(lastTail.tail_ms[c])}` : "");
        tile.appendChild(counts);
      } else {
        figure("attainment", "–", "no query in range");
        tile.append(figures);
      }
      tiles.push(tile);
    }
    box.replaceChildren(...tiles);
    const range = document.getElementById("range");
    const label = range.options[range.selectedIndex].textContent;
    document.getElementById("slo-note").dataset.window = `${state.rangeS}`;
    document.getElementById("slo-note").firstChild.textContent =
      `over the last ${label} (the dashboard's range, as far as the history reaches); a query ` +
      "counts as good only when it ended ";
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
    const limit = live.thresholds.admission;
    body.replaceChildren();
    let over = 0;
    for (const s of live.servers) {
      const tr = document.createElement("tr");
      tr.dataset.server = s.id;
      if (limit !== null && s.miss_ratio > limit) {
        tr.className = "over";
        over += 1;
      }
      cell(tr, s.id);
      cell(tr, s.pool);
      cell(tr, s.cluster || "");
      cell(tr, s.executor || "");
      const badge = document.createElement("span");
      badge.className = "state " + s.state;
      badge.textContent = s.state;
      cell(tr, "").appendChild(badge);
      cell(tr, String(s.outstanding), "num");
      cell(tr, pct(s.miss_ratio), "num miss");
      const q = s.post_queue_ms || {};
      for (const k of ["p50", "p99", "p99.9"]) cell(tr, k in q ? ms(q[k]) : "", "num");
      cell(tr, s.rtt_ms === null ? "" : ms(s.rtt_ms), "num");
      cell(tr, `${secs(s.silent_s)} ago`, "num");
      body.appendChild(tr);
    }
    if (!live.servers.length) {
      const tr = document.createElement("tr");
      cell(tr, "no server registered", "empty").colSpan = 12;
      body.appendChild(tr);
    }
    document.getElementById("servers-note").textContent = limit === null
      ? "admission control is off: no threshold to highlight against"
      : `highlighted: miss ratio over the last minute above the admission threshold ` +
        `${pct(limit)} (${over} of ${live.servers.length})`;
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
      for (const c of live.classes) classColor(c.name);
      const full = state.full || !state.samples.length;
      const last = state.samples.length ? state.samples[state.samples.length - 1].t : live.now;
      const since = full ? state.rangeS : Math.max(1, live.now - last + 1);
      const [h, scaler] = await Promise.all([
        getJSON(`v1/history?since_s=${since.toFixed(3)}`),
        live.autoscaler.enabled ? getJSON("v1/autoscaler") : Promise.resolve(null),
      ]);
      state.scaler = scaler;
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
  window.addEventListener("resize", () => {
    for (const [name, c] of Object.entries(state.charts)) {
      const el = document.querySelector(`.chart[data-chart="${name}"]`);
      c.u.setSize({ width: Math.max(el.clientWidth, 200), height: CHART_HEIGHT });
    }
  });
  poll();
})();
