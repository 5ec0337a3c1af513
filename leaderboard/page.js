"use strict";
// Draws the leaderboard from the JSON block inlined by leaderboard/page.py. Every string from a
// result reaches the page through textContent, setAttribute or new Option(): never parsed as markup.
(function () {
  const DATA = JSON.parse(document.getElementById("leaderboard-data").textContent);
  const ROWS = DATA.rows;
  const SVG_NS = "http://www.w3.org/2000/svg";
  const MAX_PANELS = 6;
  const PALETTE = ["#0b62a3", "#d1495b", "#2e7d4f", "#8a5cb8", "#e08e0b", "#00798c", "#6b4226", "#c2549d",
    "#4d6d9a", "#7a828b"];
  const ENGINE_NAMES = DATA.engines; // suite.labels.ENGINES
  // What the page knows of each metric it lists: label, unit, format, meaning (suite/metric_table.py).
  const METRICS = DATA.metrics;
  const METRIC = Object.fromEntries(METRICS.map((m) => [m.name, m]));
  const FAILED_NOTE = "out of memory, timed out, crashed, invalid or unsupported on this budget";

  const state = { sort: null, dir: 1, open: new Set() };

  // ---- small DOM helpers -------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") e.textContent = v;
      else e.setAttribute(k, v);
    }
    e.append(...children);
    return e;
  }

  function sv(tag, attrs, text) {
    const e = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  const has = (v) => v !== null && v !== undefined;
  const na = "n/a";
  const grouped = (x, digits) => x.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits });
  const FMT = {
    s: (x) => x.toFixed(3),
    int: (x) => grouped(x, 0),
    pct: (x) => (100 * x).toFixed(1) + "%",
    gib: (x) => x.toFixed(2),
    days: (x) => (x < 0.1 ? x.toPrecision(2) : x < 10 ? x.toFixed(2) : x < 100 ? x.toFixed(1) : grouped(x, 0)),
    usd: (x) => "$" + grouped(x, 0),
    sci: (x) => x.toPrecision(3),
    yesno: (x) => (x ? "yes" : "no"),
    text: (x) => String(x),
  };
  const fmt = (x, kind) => (has(x) ? FMT[kind](x) : na);
  // A metric's name and value as the table gives them; a token is an image for an image model.
  const inUnits = (text, r) => (r && r.unit === "image" ? text.replace(/token/g, "image") : text);
  // A unit is said after the figure unless the label says it already ("tokens/s"); a fraction shows as a percentage.
  const unitShown = (m) => m.unit && m.unit !== "fraction" &&
    !new RegExp(`\\b${m.unit.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}s?\\b`).test(m.label);
  const metricLabel = (name, r) => inUnits(METRIC[name].label, r);
  const withUnit = (name) => METRIC[name].label + (unitShown(METRIC[name]) ? ` (${METRIC[name].unit})` : "");
  const metricHead = (name) => withUnit(name).charAt(0).toUpperCase() + withUnit(name).slice(1);
  const metricText = (name, x, r) => {
    const m = METRIC[name];
    return fmt(x, m.format) + (has(x) && unitShown(m) ? ` ${inUnits(m.unit, r)}` : "");
  };
  // A figure with the interval of the median it comes from, "[lo, hi]", unless a single run made it (no interval).
  const hasInterval = (x, lo, hi) => has(x) && has(lo) && has(hi) && lo !== hi;
  const intervalText = (lo, hi, kind) => `[${fmt(lo, kind)}, ${fmt(hi, kind)}]`;
  const figureText = (x, lo, hi, kind) => fmt(x, kind) + (hasInterval(x, lo, hi) ? ` ${intervalText(lo, hi, kind)}` : "");
  const withInterval = (x, lo, hi, kind) => (hasInterval(x, lo, hi) ? [fmt(x, kind), el("span", { class: "ci",
    title: "at the ends of the interval of the median step time", text: intervalText(lo, hi, kind) })] : [fmt(x, kind)]);
  const runsText = (r) => (r.runs === 1 ? "single run" : `${r.runs} runs, ${fmt(r.step_time_ci_level, "pct")} interval`);
  const starTitle = (r) => (r.best ? (r.n_tied ? `Fastest median of its budget, tied with ${r.n_tied} other ` +
    `configuration${r.n_tied > 1 ? "s" : ""}: their intervals overlap, so the runs cannot tell them apart` :
    "Fastest configuration of its budget") : r.tied ? "Tied with the fastest of its budget: their intervals overlap" : "");
  const failed = (r) => r.outcome !== "ok";
  // One series per device type; CPU budgets differ by their per-worker memory limit instead.
  const gpuLabel = (r) =>
    r.device === "cpu" ? `CPU workers${r.mem_budget_gib ? `, ${r.mem_budget_gib} GiB each` : ""}` : r.gpu_name || r.hardware;
  const budgetLabel = (r) => `${r.model} \u00b7 ${r.hardware}`;
  // Throughput counts the task's unit: text tokens, or whole images for an image model.
  const units = (r) => (r.unit === "image" ? "images" : "tokens");

  // ---- the table ---------------------------------------------------------------------------

  // A column of one metric of the frame, its header, meaning and format the metric table's.
  function metricColumn(name) {
    const m = METRIC[name];
    return { key: name, label: metricHead(name), num: true, title: m.description, cell: (r) => fmt(r[name], m.format) };
  }

  const COLUMNS = [
    { key: "best", label: "", title: "Fastest configuration of its budget (\u2606: tied with it)", cls: "star",
      cell: (r) => {
        const mark = r.best ? (r.n_tied ? "\u2605 tied" : "\u2605") : r.tied ? "\u2606 tied" : "";
        return mark ? el("span", { title: starTitle(r), text: mark }) : "";
      },
      value: (r) => (r.best ? 0 : r.tied ? 1 : 2) },
    { key: "model", label: "Model", cls: "model", cell: (r) => el("span", { title: r.model, text: r.model }) },
    { key: "hardware", label: "Hardware", cell: (r) => r.hardware },
    { key: "engine", label: "Engine", title: "sharding engine", cell: (r) => ENGINE_NAMES[r.engine] || r.engine },
    { key: "config", label: "Methods", cls: "methods", cell: (r) => r.config },
    { key: "micro_batch", label: "Micro-batch", num: true, title: "micro-batch per device \u00d7 accumulation steps",
      cell: (r) => (has(r.gas) ? `${r.micro_batch} \u00d7 ${r.gas}` : String(r.micro_batch)) },
    { key: "outcome", label: "Status", cell: (r) => el("span", { class: `status ${r.outcome}`, text: r.outcome }) },
    { key: "step_time_s", label: metricHead("step_time_s"), num: true,
      title: "median optimizer step of the trial's runs at the recipe's global batch, [its interval], runs",
      cell: (r) => {
        if (!has(r.step_time_s)) return na;
        const out = withInterval(r.step_time_s, r.step_time_ci_lo_s, r.step_time_ci_hi_s, "s");
        out.push(el("span", { class: "ci runs", text: runsText(r), title: r.runs === 1 ?
          "one run has no interval: its spread between runs is unknown" : "the interval holds the median with this probability" }));
        if (r.noisy) out.push(el("span", { class: "noisy", title: "spread within a run above the noise threshold",
          text: "noisy" }));
        return out;
      } },
    { key: "tokens_per_s", label: metricHead("tokens_per_s"), num: true,
      title: `${METRIC.tokens_per_s.description}: text tokens, or images for an image model`,
      cell: (r) => (r.unit === "image" && has(r.tokens_per_s) ? `${fmt(r.tokens_per_s, "int")} img` : fmt(r.tokens_per_s, "int")) },
    metricColumn("mfu"),
    metricColumn("peak_mem_gib"),
    { key: "days", label: "Days", num: true, title: "days to train the full recipe [at the interval's ends]",
      cell: (r) => withInterval(r.days, r.days_lo, r.days_hi, "days") },
    { key: "cloud_cost_usd", label: "Cloud cost", num: true,
      cell: (r) => withInterval(r.cloud_cost_usd, r.cloud_cost_lo_usd, r.cloud_cost_hi_usd, "usd") },
    { key: "owned_cost_usd", label: "Owned cost", num: true, title: "hardware bought and amortized (see below)",
      cell: (r) => withInterval(r.owned_cost_usd, r.owned_cost_lo_usd, r.owned_cost_hi_usd, "usd") },
  ];

  function compareValues(a, b) {
    if (!has(a) && !has(b)) return 0;
    if (!has(a)) return 1; // missing values last, whatever the direction
    if (!has(b)) return -1;
    if (typeof a === "number" && typeof b === "number") return a - b;
    return String(a).localeCompare(String(b), "en", { numeric: true });
  }

  function defaultOrder(a, b) {
    for (const k of ["model", "recipe", "n_gpus", "hardware", "days", "step_time_s", "config"]) {
      const c = compareValues(a[k], b[k]);
      if (c) return c;
    }
    return 0;
  }

  function sorted(rows) {
    const col = COLUMNS.find((c) => c.key === state.sort);
    const value = col ? col.value || ((r) => r[col.key]) : null;
    return rows.slice().sort((a, b) => {
      if (value) {
        const va = value(a), vb = value(b);
        if (has(va) !== has(vb)) return has(va) ? -1 : 1;
        const c = compareValues(va, vb) * state.dir;
        if (c) return c;
      }
      return defaultOrder(a, b);
    });
  }

  function buildHead() {
    const head = document.getElementById("head");
    for (const col of COLUMNS) {
      const th = el("th", { scope: "col", "data-key": col.key, class: col.num ? "num" : "" });
      if (col.title) th.title = col.title;
      const button = el("button", { type: "button", "aria-label": `Sort by ${col.title || col.label}` },
        el("span", { text: col.label || "\u2605" }), el("span", { class: "arrow" }));
      button.addEventListener("click", () => {
        state.dir = state.sort === col.key ? -state.dir : 1;
        state.sort = col.key;
        for (const h of head.children) h.removeAttribute("aria-sort");
        th.setAttribute("aria-sort", state.dir > 0 ? "ascending" : "descending");
        renderTable();
      });
      th.append(button);
      head.append(th);
    }
  }

  function cellElement(col, r) {
    const content = col.cell(r);
    const td = el("td", { class: [col.cls, col.num ? "num" : ""].filter(Boolean).join(" ") });
    if (Array.isArray(content)) td.append(...content);
    else td.append(content);
    return td;
  }

  function rowElement(r) {
    const tr = el("tr", { class: `row${r.best ? " best" : ""}${r.tied ? " tied" : ""}${failed(r) ? " failed" : ""}`, tabindex: "0",
      "data-id": r.trial_id, "aria-expanded": String(state.open.has(r.trial_id)) });
    for (const col of COLUMNS) tr.append(cellElement(col, r));
    tr.addEventListener("click", () => toggle(r.trial_id));
    tr.addEventListener("keydown", (e) => {
      if (e.key === "Enter" || e.key === " ") {
        e.preventDefault();
        toggle(r.trial_id);
      }
    });
    return tr;
  }

  function toggle(id, forceOpen) {
    if (state.open.has(id) && !forceOpen) state.open.delete(id);
    else state.open.add(id);
    renderTable();
  }

  function renderTable() {
    const rows = sorted(visibleRows());
    const okBody = document.getElementById("rows-ok");
    const failedBody = document.getElementById("rows-failed");
    okBody.replaceChildren();
    failedBody.replaceChildren();
    const bad = rows.filter(failed);
    if (bad.length) {
      failedBody.append(el("tr", { class: "group" }, el("th", { colspan: String(COLUMNS.length),
        text: `Did not fit or failed (${bad.length}): ${FAILED_NOTE}` })));
    }
    for (const r of rows) {
      const body = failed(r) ? failedBody : okBody;
      body.append(rowElement(r));
      if (state.open.has(r.trial_id)) body.append(detailRow(r));
    }
    const ran = rows.length - bad.length;
    document.getElementById("count").textContent =
      `Showing ${rows.length} of ${ROWS.length} results (${ran} ran, ${bad.length} did not fit or failed).`;
  }

  // ---- one row's details: configuration, measurement, provenance, export --------------------

  function dl(pairs) {
    const list = el("dl");
    for (const [k, v] of pairs) {
      if (!has(v) || v === "") continue;
      list.append(el("dt", { text: k }), el("dd", { text: String(v) }));
    }
    return list;
  }

  function section(title, pairs) {
    return el("div", {}, el("h3", { text: title }), dl(pairs));
  }

  function block(summary, text, open) {
    const d = el("details", {}, el("summary", { text: summary }), el("pre", { text }));
    if (open) d.open = true;
    return d;
  }

  function detailRow(r) {
    const rec = r.record;
    const m = rec.metrics || {};
    const p = rec.provenance || {};
    const box = el("div", { class: "detail" });
    if (r.message) box.append(el("p", { class: "message", text: `${r.outcome}: ${r.message}` }));
    const runs = rec.runs || [];
    const versions = Object.entries(p.versions || {}).filter(([, v]) => has(v)).map(([k, v]) => `${k} ${v}`);
    const wall = has(rec.wall_s) ? `${rec.wall_s.toFixed(1)} s` : null;
    box.append(el("div", { class: "detail-grid" },
      section("Trial", [
        ["trial id", r.trial_id], ["sweep", rec.sweep], ["model", r.model], ["recipe", r.recipe],
        ["hardware", `${r.hardware}: ${r.n_gpus} \u00d7 ${gpuLabel(r)}`],
        ["memory per device", r.mem_budget_gib ? `${r.mem_budget_gib} GiB` : null],
        ["methods", r.config], ["precision", r.precision], ["attention", r.attention],
        ["compile", r.compile ? "on" : "off"], ["result file", rec.file],
      ]),
      section("Measurement", failed(r) ? [["outcome", r.outcome], ["wall time", wall]] : [
        ["step time", r.runs > 1 ? `${fmt(m.step_time_s, "s")} s, the median of ${r.runs} runs` :
          `${fmt(m.step_time_s, "s")} s, a single run`],
        ["interval of the median", r.runs > 1 ? `${fmt(m.step_time_ci_lo_s, "s")} \u2013 ` +
          `${fmt(m.step_time_ci_hi_s, "s")} s, holds the median with ${fmt(m.step_time_ci_level, "pct")}` :
          "none: a single run has no interval"],
        ["spread between runs", has(m.step_time_between_std_s) ? `\u00b1 ${fmt(m.step_time_between_std_s, "s")} s` : null],
        ["spread within a run", has(m.step_time_within_std_s) ? `\u00b1 ${fmt(m.step_time_within_std_s, "s")} s` : null],
        ...listedMetrics(m, r),
        [r.runs > 1 ? `wall time of ${r.runs} runs` : "wall time", wall],
      ]),
      section("Time to train and cost", failed(r) ? [["estimate", "none: this configuration did not run"]] : [
        ["days", figureText(r.days, r.days_lo, r.days_hi, "days")], ["GPU-hours", fmt(r.gpu_hours, "int")],
        ["cloud cost", figureText(r.cloud_cost_usd, r.cloud_cost_lo_usd, r.cloud_cost_hi_usd, "usd")],
        ["cloud price", r.cloud_price_source],
        ["owned cost", figureText(r.owned_cost_usd, r.owned_cost_lo_usd, r.owned_cost_hi_usd, "usd")],
        ["owned hardware", fmt(r.owned_hardware_usd, "usd")],
        ["FLOPs-only estimate", has(r.analytic_days) ?
          `${fmt(r.analytic_days, "days")} days at ${fmt(r.analytic_mfu, "pct")} MFU (predicted, not measured)` : null],
        ["original run", r.original_gpus ? `${r.original_gpus} GPUs \u00d7 ${r.original_days} days` : null],
      ]),
      section("Provenance", [
        ["date", p.date], ["git revision", has(p.git_revision) ? p.git_revision + (p.git_dirty ? " (dirty)" : "") : null],
        ["versions", versions.join(", ")], ["python", p.python], ["devices", (p.devices || []).join(", ")],
        ["CUDA / driver", p.cuda ? `${p.cuda} / ${p.driver}` : null], ["host", p.hostname], ["platform", p.platform],
        ["CPU", has(p.cpu) ? `${p.cpu}, ${p.cpu_count} cores` : null],
      ]),
    ));
    if (runs.length) box.append(runTable(runs));
    box.append(block("Resolved trial configuration (JSON)", JSON.stringify(rec.trial, null, 2), false));
    for (const ex of r.exports || []) box.append(block(ex.label, ex.text, false));
    box.append(block("Stored record: metrics and provenance (JSON)",
      JSON.stringify({ metrics: rec.metrics, provenance: rec.provenance }, null, 2), false));
    return el("tr", { class: "detail" }, el("td", { colspan: String(COLUMNS.length) }, box));
  }

  // Every labelled metric of a record that is not of the step-time lines above it (the median and
  // what the runs together make of it) nor of each run alone (the runs' table), in the table's order.
  function listedMetrics(m, r) {
    return METRICS.filter((x) => x.name !== "step_time_s" && x.over_runs !== "of the runs" && x.over_runs !== "per run"
      && m[x.name] !== undefined).map((x) => [metricLabel(x.name, r), metricText(x.name, m[x.name], r)]);
  }

  // Every run of the trial, each in fresh processes: what the median and its interval come from.
  const RUN_METRICS = ["step_time_s", "step_time_std_s", "peak_mem_gib"];
  function runTable(runs) {
    const heads = ["run", "outcome", ...RUN_METRICS.map(withUnit), "wall (s)", "date"];
    const head = el("tr", {}, ...heads.map((h) => el("th", { scope: "col", text: h })));
    const body = runs.map((run, i) => {
      const m = run.metrics || {};
      const p = run.provenance || {};
      return el("tr", {}, ...[String(i + 1), run.outcome, ...RUN_METRICS.map((k) => fmt(m[k], METRIC[k].format)),
        has(run.wall_s) ? run.wall_s.toFixed(1) : na, p.date || na].map((v) => el("td", { text: v })));
    });
    return el("div", { class: "runs" }, el("h3", { text: `Runs (${runs.length})` }),
      el("table", { class: "run-table" }, el("thead", {}, head), el("tbody", {}, ...body)));
  }

  // ---- filters -----------------------------------------------------------------------------

  const F = {
    search: document.getElementById("f-search"),
    model: document.getElementById("f-model"),
    hardware: document.getElementById("f-hardware"),
    status: document.getElementById("f-status"),
    best: document.getElementById("f-best"),
  };

  function fillSelect(select, values) {
    for (const v of values) select.append(new Option(v, v));
  }

  function visibleRows() {
    const terms = F.search.value.toLowerCase().split(/\s+/).filter(Boolean);
    return ROWS.filter((r) => {
      if (F.model.value && r.model !== F.model.value) return false;
      if (F.hardware.value && r.hardware !== F.hardware.value) return false;
      if (F.status.value === "ok" && failed(r)) return false;
      if (F.status.value === "failed" && !failed(r)) return false;
      if (F.best.checked && !r.best && !r.tied) return false;
      const hay = [r.model, r.hardware, gpuLabel(r), r.config, r.outcome, r.message, r.recipe].join(" ").toLowerCase();
      return terms.every((t) => hay.includes(t));
    });
  }

  // ---- plots -------------------------------------------------------------------------------

  const COLOR = new Map();
  [...new Set(ROWS.map(gpuLabel))].sort().forEach((g, i) => COLOR.set(g, PALETTE[i % PALETTE.length]));

  function groupBy(rows, key) {
    const groups = new Map();
    for (const r of rows) {
      const k = key(r);
      if (!groups.has(k)) groups.set(k, []);
      groups.get(k).push(r);
    }
    return groups;
  }

  function niceStep(span, n) {
    const raw = span / Math.max(1, n);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const f = raw / mag;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
  }

  function linearScale(lo, hi, r0, r1) {
    const step = niceStep(hi - lo || 1, 4);
    const top = Math.ceil(hi / step) * step || step;
    const s = (v) => r0 + ((v - lo) / (top - lo)) * (r1 - r0);
    s.ticks = () => {
      const out = [];
      for (let v = lo; v <= top + step / 2; v += step) out.push(v);
      return out;
    };
    return s;
  }

  function logScale(lo, hi, r0, r1) {
    const l0 = Math.floor(Math.log10(lo)), l1 = Math.ceil(Math.log10(hi));
    const s = (v) => r0 + ((Math.log10(v) - l0) / (l1 - l0 || 1)) * (r1 - r0);
    s.ticks = () => {
      const out = [];
      for (let e = l0; e <= l1; e++) out.push(Math.pow(10, e));
      return out;
    };
    return s;
  }

  function tickLabel(v) {
    if (v === 0) return "0";
    if (Math.abs(v) >= 1e6 || Math.abs(v) < 1e-2) return v.toExponential(0);
    return v.toLocaleString("en-US", { maximumFractionDigits: 2 });
  }

  // Axes, grid, tick labels and axis titles of a plot box.
  function frame(svg, box, x, y, xTicks, yTicks, xTitle, yTitle) {
    const g = sv("g", { class: "axis" });
    for (const t of yTicks) {
      const yy = y(t);
      g.append(sv("line", { class: "grid", x1: box.l, x2: box.r, y1: yy, y2: yy }));
      g.append(sv("text", { class: "tick", x: box.l - 5, y: yy + 3.5, "text-anchor": "end" }, tickLabel(t)));
    }
    for (const [v, label] of xTicks) {
      const xx = x(v);
      g.append(sv("line", { class: "grid", x1: xx, x2: xx, y1: box.t, y2: box.b }));
      g.append(sv("text", { class: "tick", x: xx, y: box.b + 14, "text-anchor": "middle" }, label));
    }
    g.append(sv("path", { d: `M${box.l},${box.t}V${box.b}H${box.r}`, fill: "none" }));
    g.append(sv("text", { x: (box.l + box.r) / 2, y: box.b + 30, "text-anchor": "middle" }, xTitle));
    g.append(sv("text", { x: 12, y: (box.t + box.b) / 2, "text-anchor": "middle",
      transform: `rotate(-90 12 ${(box.t + box.b) / 2})` }, yTitle));
    svg.append(g);
  }

  function panel(container, title, subtitle) {
    const div = el("div", { class: "panel" }, el("h4", { text: title }));
    if (subtitle) div.append(el("div", { class: "sub", text: subtitle }));
    container.append(div);
    return div;
  }

  function newSvg(w, h, label) {
    return sv("svg", { viewBox: `0 0 ${w} ${h}`, role: "img", "aria-label": label });
  }

  function point(cx, cy, r, fill, tip, onClick) {
    const c = sv("circle", { class: "point", cx, cy, r, fill, stroke: "#fff", "stroke-width": 1.5 });
    c.append(sv("title", {}, tip));
    c.addEventListener("click", onClick);
    return c;
  }

  function legend(labels) {
    const ul = el("ul", { class: "legend" });
    for (const l of labels) {
      const swatch = el("span", { class: "swatch" });
      swatch.style.borderTopColor = COLOR.get(l);
      ul.append(el("li", {}, swatch, el("span", { text: l })));
    }
    return ul;
  }

  function showRow(id) {
    toggle(id, true);
    const tr = document.querySelector(`tr.row[data-id="${CSS.escape(id)}"]`);
    if (tr) {
      tr.scrollIntoView({ block: "center" });
      tr.focus({ preventScroll: true });
    }
  }

  function limited(container, groups, draw, what) {
    const keys = [...groups.keys()].sort((a, b) => a.localeCompare(b, "en", { numeric: true }));
    if (!keys.length) {
      container.append(el("p", { class: "empty", text: `No ${what} in the current filter.` }));
      return;
    }
    for (const k of keys.slice(0, MAX_PANELS)) draw(groups.get(k));
    if (keys.length > MAX_PANELS) {
      container.append(el("p", { class: "empty",
        text: `${keys.length - MAX_PANELS} more not drawn: narrow the filters (model, hardware) to see them.` }));
    }
  }

  // Days to train against GPU count: one panel per model and recipe, one line per GPU type.
  function drawDays(container, rows) {
    const best = rows.filter((r) => r.best && has(r.days) && r.days > 0);
    limited(container, groupBy(best, (r) => `${r.model}\u0000${r.recipe}`), (rs) => {
      const W = 420, H = 250, box = { l: 58, r: 405, t: 12, b: 205 };
      const counts = [...new Set(rs.map((r) => r.n_gpus))].sort((a, b) => a - b);
      const lc = counts.map(Math.log2);
      const pad = lc.length > 1 ? 0.3 : 1;
      // GPU counts are powers of two: equally spaced on a log2 axis, padded so no point sits on an edge.
      const xs = (n) => box.l + ((Math.log2(n) - (lc[0] - pad)) / (lc[lc.length - 1] - lc[0] + 2 * pad)) * (box.r - box.l);
      const days = rs.map((r) => r.days);
      const lo = Math.min(...days), hi = Math.max(...days);
      const useLog = hi / lo > 20;
      const y = useLog ? logScale(lo, hi, box.b, box.t) : linearScale(0, hi, box.b, box.t);
      const svg = newSvg(W, H, `Days to train ${rs[0].model} against GPU count`);
      frame(svg, box, xs, y, counts.map((n) => [n, String(n)]), y.ticks(), "GPUs (or CPU workers)",
        useLog ? "days (log scale)" : "days");
      const series = groupBy(rs, gpuLabel);
      for (const [label, pts] of series) {
        pts.sort((a, b) => a.n_gpus - b.n_gpus);
        const color = COLOR.get(label);
        if (pts.length > 1) {
          svg.append(sv("polyline", { fill: "none", stroke: color, "stroke-width": 2,
            points: pts.map((r) => `${xs(r.n_gpus)},${y(r.days)}`).join(" ") }));
        }
        for (const r of pts) {
          if (has(r.days_lo) && has(r.days_hi) && r.days_lo !== r.days_hi) {
            svg.append(sv("line", { class: "ci-bar", x1: xs(r.n_gpus), x2: xs(r.n_gpus), y1: y(r.days_lo),
              y2: y(r.days_hi), stroke: color, "stroke-width": 1.5 }));
          }
          svg.append(point(xs(r.n_gpus), y(r.days), 5, color,
            `${r.hardware}: ${figureText(r.days, r.days_lo, r.days_hi, "days")} days, ` +
            `${runsText(r)}, ${fmt(r.cloud_cost_usd, "usd")} cloud${r.n_tied ? `; tied with ${r.n_tied}` : ""}\n${r.config}`,
            () => showRow(r.trial_id)));
        }
      }
      const p = panel(container, rs[0].model, rs[0].recipe);
      p.append(svg, legend([...series.keys()].sort()));
    }, "budget with a measured time to train");
  }

  // Throughput against peak memory per budget, with the front: the fastest configuration within each memory.
  function drawFront(container, rows) {
    const ran = rows.filter((r) => !failed(r) && has(r.peak_mem_gib) && has(r.tokens_per_s));
    limited(container, groupBy(ran, (r) => `${r.model}\u0000${r.recipe}\u0000${r.hardware}`), (rs) => {
      const W = 420, H = 250, box = { l: 58, r: 405, t: 12, b: 205 };
      // The device's memory is drawn when it is near the measured peaks; far above them it would squash the points.
      const budget = rs[0].mem_budget_gib || 0;
      const peakMax = Math.max(...rs.map((r) => r.peak_mem_gib));
      const showBudget = budget > 0 && budget <= 2 * peakMax;
      const x = linearScale(0, Math.max(showBudget ? budget : 0, peakMax) * 1.05, box.l, box.r);
      const y = linearScale(0, Math.max(...rs.map((r) => r.tokens_per_s)) * 1.05, box.b, box.t);
      const svg = newSvg(W, H, `Throughput against peak memory for ${budgetLabel(rs[0])}`);
      frame(svg, box, x, y, x.ticks().map((v) => [v, tickLabel(v)]), y.ticks(), "peak memory per device (GiB)",
        "tokens/s");
      const byMem = rs.slice().sort((a, b) => a.peak_mem_gib - b.peak_mem_gib || b.tokens_per_s - a.tokens_per_s);
      const front = [];
      for (const r of byMem) if (!front.length || r.tokens_per_s > front[front.length - 1].tokens_per_s) front.push(r);
      let d = `M${x(front[0].peak_mem_gib)},${y(front[0].tokens_per_s)}`;
      for (const r of front.slice(1)) d += `H${x(r.peak_mem_gib)}V${y(r.tokens_per_s)}`;
      d += `H${box.r}`;
      svg.append(sv("path", { d, fill: "none", stroke: "#0b62a3", "stroke-width": 1.5 }));
      if (showBudget) {
        svg.append(sv("line", { x1: x(budget), x2: x(budget), y1: box.t, y2: box.b, stroke: "#b3261e",
          "stroke-dasharray": "4 3" }));
        svg.append(sv("text", { x: x(budget) - 4, y: box.b - 8, "text-anchor": "end", fill: "#b3261e" },
          `device memory ${budget} GiB`));
      } else if (budget > 0) {
        svg.append(sv("text", { x: box.r - 4, y: box.b - 8, "text-anchor": "end", fill: "#b3261e" },
          `device memory ${budget} GiB, off the axis \u2192`));
      }
      const onFront = new Set(front);
      for (const r of byMem.slice().reverse()) {
        if (r.best) svg.append(sv("circle", { cx: x(r.peak_mem_gib), cy: y(r.tokens_per_s), r: 8.5, fill: "none",
          stroke: "#b88a00", "stroke-width": 2 }));
        svg.append(point(x(r.peak_mem_gib), y(r.tokens_per_s), 4.5, onFront.has(r) ? "#0b62a3" : "#9aa5b1",
          `${r.config}\n${fmt(r.tokens_per_s, "int")} ${units(r)}/s at ${fmt(r.peak_mem_gib, "gib")} GiB` +
          `${onFront.has(r) ? " (on the front)" : ""}${r.best ? " \u2605 fastest" : ""}${r.tied ? " \u2606 tied with the fastest" : ""}`,
          () => showRow(r.trial_id)));
      }
      panel(container, budgetLabel(rs[0]), `${rs[0].recipe}; ${rs.length} configuration${rs.length > 1 ? "s" : ""} ran`).append(svg);
    }, "configuration that ran");
  }

  const SHARDING_ORDER = DATA.shardings.map((s) => s.label); // suite.labels.SHARDINGS, least sharded first
  const SHARDING_SHORT = Object.fromEntries(DATA.shardings.map((s) => [s.label, s.short])); // fits a column
  const OFFLOAD_ORDER = ["none", "optimizer", "optimizer+params"];
  const RECOMPUTE_ORDER = ["none", "selective", "full"];
  const FIT_CLASS = [
    ["ok", "fits", "#d8efe0"], ["oom", "OOM", "#f6d5d2"], ["timeout", "timeout", "#f5ebc8"],
    ["crashed", "crashed", "#f5ebc8"], ["nan", "NaN loss", "#f5ebc8"], ["unsupported", "unsupported", "#eceef0"],
    ["invalid", "invalid", "#eceef0"],
  ];

  // Which methods made a configuration fit: a grid of outcomes per budget.
  function drawFit(container, rows) {
    limited(container, groupBy(rows, (r) => `${r.model}\u0000${r.recipe}\u0000${r.hardware}`), (rs) => {
      const colKey = (r) => `${r.sharding}|${r.offload}`;
      const rowKey = (r) => `${r.micro_batch}|${r.recompute}`;
      const cols = [...new Map(rs.map((r) => [colKey(r), r])).values()]
        .sort((a, b) => SHARDING_ORDER.indexOf(a.sharding) - SHARDING_ORDER.indexOf(b.sharding) ||
          OFFLOAD_ORDER.indexOf(a.offload) - OFFLOAD_ORDER.indexOf(b.offload));
      const lines = [...new Map(rs.map((r) => [rowKey(r), r])).values()]
        .sort((a, b) => b.micro_batch - a.micro_batch || RECOMPUTE_ORDER.indexOf(a.recompute) - RECOMPUTE_ORDER.indexOf(b.recompute));
      const cw = 88, ch = 34, left = 112, top = 34;
      const W = Math.max(300, left + cols.length * cw + 4), H = top + lines.length * ch + 6;
      const svg = newSvg(W, H, `Outcome per method for ${budgetLabel(rs[0])}`);
      svg.setAttribute("class", "natural"); // drawn at its own size: text stays the size of the table's
      svg.setAttribute("width", W);
      svg.setAttribute("height", H);
      cols.forEach((c, i) => {
        const cx = left + i * cw + cw / 2;
        svg.append(sv("text", { x: cx, y: 13, "text-anchor": "middle" }, SHARDING_SHORT[c.sharding] || c.sharding));
        if (c.offload !== "none") {
          svg.append(sv("text", { class: "tick", x: cx, y: 27, "text-anchor": "middle" },
            c.offload === "optimizer" ? "+ opt. offload" : "+ opt.+param off."));
        }
      });
      const cells = groupBy(rs, (r) => `${rowKey(r)}#${colKey(r)}`);
      lines.forEach((l, j) => {
        const cy = top + j * ch;
        svg.append(sv("text", { x: left - 6, y: cy + ch / 2 + 4, "text-anchor": "end" },
          `mb ${l.micro_batch}${l.recompute === "none" ? "" : l.recompute === "full" ? " + recompute" : ` + ${l.recompute} recompute`}`));
        cols.forEach((c, i) => {
          const here = cells.get(`${rowKey(l)}#${colKey(c)}`);
          if (!here) return;
          const [outcome, word, fill] = FIT_CLASS.find(([o]) => here.some((r) => r.outcome === o));
          const winner = here.find((r) => r.outcome === outcome);
          const g = sv("g", { class: "point" });
          g.append(sv("rect", { x: left + i * cw + 2, y: cy + 2, width: cw - 4, height: ch - 4, rx: 4, fill,
            stroke: winner.best ? "#b88a00" : "#ffffff", "stroke-width": winner.best ? 2.5 : 1 }));
          const tx = left + i * cw + cw / 2;
          const label = outcome === "ok" ? `${word} ${fmt(winner.peak_mem_gib, "gib")} GiB` : word;
          g.append(sv("text", { class: "cell-text", x: tx, y: cy + ch / 2 + 4, "text-anchor": "middle" }, label));
          g.append(sv("title", {}, here.map((r) => `${r.outcome}: ${r.config}${r.message ? " \u2014 " + r.message : ""}`)
            .join("\n")));
          g.addEventListener("click", () => showRow(winner.trial_id));
          svg.append(g);
        });
      });
      panel(container, budgetLabel(rs[0]), rs[0].recipe).append(svg);
    }, "configuration");
  }

  function renderPlots() {
    const rows = visibleRows();
    for (const [id, draw] of [["plot-days", drawDays], ["plot-front", drawFront], ["plot-fit", drawFit]]) {
      const container = document.querySelector(`#${id} .panels`);
      container.replaceChildren();
      draw(container, rows);
    }
  }

  // The figures for a paper, drawn once by analysis/figures.py: each PNG inlined (a data: URI, the only
  // images the page's policy loads), links to its files beside the page, and the figures not drawn.
  function renderPaperFigures() {
    const { drawn, skipped } = DATA.figures;
    if (!drawn.length && !skipped.length) return;
    const section = document.getElementById("plot-paper");
    section.hidden = false;
    const box = section.querySelector(".paper-figures");
    for (const f of drawn) {
      const files = el("p", { class: "files" }, ...f.files.map((x) => el("a", { href: x.href, text: x.label })));
      box.append(el("div", { class: "paper-figure" }, el("h4", { text: f.title }),
        el("img", { src: f.png, alt: f.caption }), files, el("p", { class: "caption", text: f.caption })));
    }
    for (const f of skipped) box.append(el("p", { class: "empty", text: `${f.title}: not drawn: ${f.why}` }));
  }

  // ---- predicted rows: a section and table of their own, never in ROWS ------------------------

  const PREDICTED = DATA.predicted;
  // Each figure's error is its regime's (GPU class, engine, offload, GPU count, size band), with its n;
  // the regime and every label in full are in the row's title and the sources under the table.
  const errorLine = (text) => el("span", { class: "ci err", text: `error in its regime: ${text}` });
  const PREDICTED_COLUMNS = [
    { key: "model", label: "Model", cell: (r) => r.model },
    { key: "budget", label: "Hardware", cell: (r) => r.budget },
    { key: "config", label: "Best configuration (predicted)", cls: "methods", cell: (r) => r.config },
    { key: "fits", label: "Fits (predicted)", cls: "methods",
      cell: (r) => [r.fits, el("span", { class: "ci err", text: `fit so far: ${r.fit_error}` })] },
    { key: "predicted_device_gib", label: "Predicted GiB/GPU", num: true,
      cell: (r) => [has(r.predicted_device_gib) ? `${fmt(r.predicted_device_gib, "gib")} of ${fmt(r.mem_budget_gib, "gib")}`
        : na, errorLine(r.memory_error)] },
    { key: "predicted_step_time_s", label: "Predicted step (s)", num: true,
      cell: (r) => [fmt(r.predicted_step_time_s, "s"), errorLine(r.time_error)] },
    { key: "regime", label: "Error regime", cls: "methods", cell: (r) => r.regime },
    { key: "predicted_tokens_per_s", label: "Predicted tokens/s", num: true,
      cell: (r) => fmt(r.predicted_tokens_per_s, "int") + (r.unit === "image" && has(r.predicted_tokens_per_s) ? " img" : "") },
    { key: "predicted_mfu", label: "Predicted MFU", num: true, cell: (r) => fmt(r.predicted_mfu, "pct") },
    { key: "predicted_days", label: "Predicted days", num: true, cell: (r) => fmt(r.predicted_days, "days") },
    { key: "predicted_gpu_hours", label: "Predicted GPU-hours", num: true, cell: (r) => fmt(r.predicted_gpu_hours, "int") },
    { key: "predicted_cloud_cost_usd", label: "Predicted cloud cost", num: true,
      cell: (r) => fmt(r.predicted_cloud_cost_usd, "usd") },
    { key: "predicted_owned_cost_usd", label: "Predicted owned cost", num: true,
      cell: (r) => fmt(r.predicted_owned_cost_usd, "usd") },
  ];

  function renderPredicted() {
    if (!PREDICTED.length) return;
    document.getElementById("predicted").hidden = false;
    const head = document.getElementById("predicted-head");
    for (const col of PREDICTED_COLUMNS) {
      head.append(el("th", { scope: "col", "data-key": col.key, class: col.num ? "num" : "", text: col.label }));
    }
    const body = document.getElementById("predicted-rows");
    for (const r of PREDICTED) {
      const tr = el("tr", { class: `predicted-row${r.config === "does not fit" ? " nofit" : ""}`,
        title: `Predicted, not measured. ${r.recipe}; ${r.configs_fit} of ${r.configs_valid} configurations ` +
          `predicted to fit. Error in its regime (${r.regime}): ${r.error_detail}. Constants: ${r.constants}` });
      for (const col of PREDICTED_COLUMNS) tr.append(cellElement(col, r));
      body.append(tr);
    }
    const sources = [...new Set(PREDICTED.flatMap((r) => [`Error of ${r.model} on ${r.budget} (${r.regime}): ${r.error_detail}.`,
      `Constants of ${r.budget}: ${r.constants}.`]))];
    document.getElementById("predicted-sources").textContent = sources.join(" ");
  }

  // ---- plans: a section of their own, each figure in a measured or a predicted column ---------

  const PLANS = DATA.plan;
  const planFigure = (source, q, kind) => (r) => (r.source === source ?
    withInterval(r[`${source}_${q}`], r[`${source}_${q}_lo`], r[`${source}_${q}_hi`], kind) : "");
  const PLAN_COLUMNS = [
    { key: "option", label: "Option", cell: (r) => r.option },
    { key: "answer", label: "Answers", cls: "methods", cell: (r) => r.answer },
    { key: "config", label: "Best configuration", cls: "methods",
      cell: (r) => r.config + (r.trial_id ? ` (trial ${r.trial_id})` : "") },
    ...["measured", "predicted"].flatMap((source) => [
      { key: `${source}_days`, label: `${source === "measured" ? "Measured" : "Predicted"} days`, num: true,
        cls: source === "predicted" ? "pred" : "", cell: planFigure(source, "days", "days") },
      { key: `${source}_usd`, label: `${source === "measured" ? "Measured" : "Predicted"} $ up front`, num: true,
        cls: source === "predicted" ? "pred" : "", cell: planFigure(source, "usd", "usd") },
      { key: `${source}_run_usd`, label: `${source === "measured" ? "Measured" : "Predicted"} $ of the run`,
        num: true, cls: source === "predicted" ? "pred" : "", cell: planFigure(source, "run_usd", "usd") },
      { key: `${source}_co2e_kg`, label: `${source === "measured" ? "Measured" : "Predicted"} kg CO2e`, num: true,
        cls: source === "predicted" ? "pred" : "", cell: planFigure(source, "co2e_kg", "int") },
    ]),
    { key: "hardware_usd", label: "Purchase price", num: true, cell: (r) => (has(r.hardware_usd) ? fmt(r.hardware_usd, "usd") : "") },
  ];

  function renderPlans() {
    if (!PLANS.length) return;
    document.getElementById("plan").hidden = false;
    const box = document.getElementById("plan-models");
    for (const p of PLANS) {
      const head = el("tr", {});
      for (const col of PLAN_COLUMNS) {
        head.append(el("th", { scope: "col", "data-key": col.key, class: col.num ? "num" : "", text: col.label }));
      }
      const body = el("tbody", {});
      for (const r of p.rows) {
        const tr = el("tr", { class: `plan-row ${r.source}`, title: `${r.source === "measured" ? "Measured" :
          "Predicted, not measured"}: ${r.option}` });
        for (const col of PLAN_COLUMNS) tr.append(cellElement(col, r));
        body.append(tr);
      }
      box.append(el("div", { class: "plan-model", "data-model": p.model },
        el("h3", { text: p.question }),
        el("ul", { class: "answer" }, ...p.answer.map((a) => el("li", { text: a }))),
        el("p", { class: "note", text: `${p.rows.length} of ${p.n_options} options shown: the answer, the front and `
          + "each GPU type's cheapest within the limits (else its nearest)." }),
        el("div", { class: "table-wrap" }, el("table", { class: "plan-table" }, el("thead", {}, head), body)),
        ...p.notes.map((n) => el("p", { class: "note", text: n }))));
    }
  }

  // ---- page --------------------------------------------------------------------------------

  function renderHeader() {
    const ran = ROWS.filter((r) => !failed(r)).length;
    document.getElementById("meta").textContent =
      `${ROWS.length} trial results from ${DATA.source} (${ran} ran, ${ROWS.length - ran} did not fit or failed); ` +
      `generated ${DATA.generated}.`;
    const skipped = document.getElementById("skipped");
    for (const s of DATA.skipped) skipped.append(el("li", { text: s }));
    skipped.hidden = !DATA.skipped.length;
    document.getElementById("price-note").textContent = DATA.price_note;
  }

  function update() {
    renderTable();
    renderPlots();
  }

  renderHeader();
  renderPredicted();
  renderPlans();
  renderPaperFigures();
  buildHead();
  fillSelect(F.model, [...new Set(ROWS.map((r) => r.model))].sort());
  fillSelect(F.hardware, [...new Set(ROWS.map((r) => r.hardware))].sort((a, b) => a.localeCompare(b, "en", { numeric: true })));
  F.search.addEventListener("input", update);
  for (const control of [F.model, F.hardware, F.status, F.best]) control.addEventListener("change", update);
  document.getElementById("filters").addEventListener("submit", (e) => e.preventDefault());
  update();
})();
