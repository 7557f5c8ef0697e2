"""The page of `analysis.report`: one HTML file with its style, script and data inlined.

Colours are colour-blind safe: the grid uses one sequential scale (viridis, read by lightness as
well as hue) or one Okabe-Ito blue against grey; sieves are marked in Okabe-Ito orange, attention
in blue. Every number is in a tooltip or a table cell, so nothing is read off a colour alone.
"""

from __future__ import annotations

import html
import json

STYLE = """
:root { --held: #0072B2; --sieve: #E69F00; --line: #0072B2; --muted: #666; --nodata: #d9d9d9; }
body { font: 14px/1.4 system-ui, sans-serif; margin: 1em 2em; color: #222; }
h1 { font-size: 1.3em; margin: 0 0 .2em; } h2 { font-size: 1.1em; margin: .6em 0 .3em; }
.meta { color: var(--muted); font-size: 12px; }
.controls { display: flex; gap: 1.2em; flex-wrap: wrap; align-items: center; margin: .8em 0; }
.layout { display: flex; gap: 2em; align-items: flex-start; flex-wrap: wrap; }
.grid { display: inline-grid; gap: 2px; }
.grid .label { font-size: 11px; color: var(--muted); text-align: center; align-self: center; }
.cell { width: 34px; height: 26px; border: 1px solid #fff; padding: 0; font-size: 11px; cursor: pointer;
        display: flex; align-items: stretch; justify-content: stretch; }
.cell span { flex: 1; display: flex; align-items: center; justify-content: center; }
.cell:focus { outline: 3px solid #000; outline-offset: 1px; }
.cell[aria-selected="true"] { outline: 3px solid var(--sieve); }
.nodata { background: repeating-linear-gradient(45deg, #eee, #eee 3px, var(--nodata) 3px, var(--nodata) 6px); }
#legend { font-size: 12px; margin-top: .5em; display: flex; gap: .6em; flex-wrap: wrap; align-items: center; }
#legend i { display: inline-block; width: 14px; height: 12px; vertical-align: middle; margin-right: 3px; border: 1px solid #ccc; }
#card { border: 1px solid #bbb; border-radius: 6px; padding: .6em 1em; flex: 1 1 560px; max-width: 1000px; }
#card[hidden] { display: none; }
table { border-collapse: collapse; font-size: 12px; }
td, th { padding: 2px 7px; text-align: right; border-bottom: 1px solid #eee; }
th:first-child, td:first-child { text-align: left; }
tr.held td:first-child { font-weight: bold; color: var(--held); }
.views { display: flex; gap: 1.5em; flex-wrap: wrap; }
.view h3 { font-size: 13px; margin: .3em 0; }
.tok { font: 11px monospace; cursor: pointer; }
.tok.scored { text-decoration: underline; }
.tok.query { font-weight: bold; fill: #000; }
.seqs button { margin: 0 .3em .3em 0; }
.seqs button[aria-pressed="true"] { background: var(--held); color: #fff; }
.note { color: #8a4b00; }
#card-stats td { white-space: nowrap; }
"""

SCRIPT = r"""
"use strict";
const D = JSON.parse(document.getElementById("report-data").textContent);
const $ = (id) => document.getElementById(id);
const VIRIDIS = ["#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725"];
const S = { task: D.tasks[0], colour: D.kind === "effect" ? D.roles[0] : "count", step: D.steps ? D.steps.length - 1 : 0,
            post: D.posts ? D.posts[0] : null, head: null, role: D.roles[0], seq: null, query: null };
const fmt = (v, d = 4) => v === null || v === undefined ? "–" : (typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toPrecision(d)) : String(v));
const fmtP = (v) => v === null || v === undefined ? "–" : (v < 1e-4 ? v.toExponential(2) : v.toPrecision(3));
const idx = (l, h) => l * D.heads + h;
function viridis(x) { const i = Math.max(0, Math.min(VIRIDIS.length - 1, Math.floor(x * VIRIDIS.length))); return VIRIDIS[i]; }
function ink(bg) { const r = parseInt(bg.slice(1, 3), 16), g = parseInt(bg.slice(3, 5), 16), b = parseInt(bg.slice(5, 7), 16);
  return 0.299 * r + 0.587 * g + 0.114 * b > 140 ? "#000" : "#fff"; }
function el(tag, attrs = {}, text = null) { const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); if (text !== null) e.textContent = text; return e; }
function svg(tag, attrs = {}, text = null) { const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); if (text !== null) e.textContent = text; return e; }
const hasSplit = (task) => (D.split_tasks || []).includes(task);
const source = (task) => hasSplit(task) ? `the ${task} ${D.settings.split} split` : task;
function taskRoles() { return D.kind === "effect" ? Object.keys(Object.values(D.stats[S.task])[0].roles) : Object.keys(D.stats[S.task]); }

// -- what a head holds -------------------------------------------------------------------------
function headStats(task, l, h, step) {
  const out = {};
  for (const role of Object.keys(D.stats[task])) {
    const s = D.stats[task][role], o = {};
    for (const f of Object.keys(s)) o[f] = s[f][step][idx(l, h)];
    out[role] = o;
  }
  return out;
}
function effectStats(task, post, l, h) {
  const e = D.stats[task][post]; if (!e) return null; const out = {};
  for (const role of Object.keys(e.roles)) out[role] = { n: e.roles[role].n[idx(l, h)], pre: e.roles[role].pre[idx(l, h)], post: e.roles[role].post[idx(l, h)] };
  return { roles: out, cosine: e.cosine ? e.cosine[idx(l, h)] : null };
}
function effectRange(task, role) {
  let lo = Infinity, hi = -Infinity;
  for (const post of Object.keys(D.stats[task])) for (const k of ["pre", "post"])
    for (const v of (D.stats[task][post].roles[role] || { [k]: [] })[k]) if (v !== null) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  return [lo, hi];
}

// -- the grid ----------------------------------------------------------------------------------
function buildGrid() {
  const grid = $("grid"); grid.innerHTML = "";
  grid.style.gridTemplateColumns = `3em repeat(${D.heads}, 36px)`;
  grid.appendChild(el("div", { class: "label" }, "layer"));
  for (let h = 0; h < D.heads; h++) grid.appendChild(el("div", { class: "label" }, `h${h}`));
  for (let l = 0; l < D.layers; l++) {
    grid.appendChild(el("div", { class: "label" }, String(l)));
    for (let h = 0; h < D.heads; h++) {
      const c = el("button", { class: "cell", "data-layer": l, "data-head": h, tabindex: -1, role: "gridcell", "aria-selected": "false" });
      c.addEventListener("click", () => openCard(l, h));
      c.addEventListener("keydown", onGridKey);
      grid.appendChild(c);
    }
  }
  grid.querySelector(".cell").tabIndex = 0;
  paintGrid();
}
function paintGrid() {
  const max = Math.max(1, taskRoles().length);
  for (const c of document.querySelectorAll("#grid .cell")) {
    const l = +c.dataset.layer, h = +c.dataset.head; c.innerHTML = ""; c.className = "cell";
    if (D.kind === "effect") {
      const e = effectStats(S.task, S.post, l, h), [lo, hi] = effectRange(S.task, S.colour), tips = [];
      for (const k of ["pre", "post"]) {
        const v = e && e.roles[S.colour] ? e.roles[S.colour][k] : null, sp = el("span", {}, "");
        if (v === null) sp.className = "nodata"; else { sp.style.background = viridis((v - lo) / Math.max(hi - lo, 1e-12)); }
        c.appendChild(sp); tips.push(`${k} mean β ${fmt(v)}`);
      }
      c.title = `layer ${l}, head ${h} — ${S.colour}: ${tips.join(", ")}` + (e && e.cosine !== null ? `; attention cosine pre/post ${fmt(e.cosine)}` : "");
      continue;
    }
    const st = headStats(S.task, l, h, S.step), held = Object.keys(st).filter((r) => st[r].assigned === true);
    const sp = el("span"); c.appendChild(sp);
    let bg;
    if (S.colour === "count") { bg = held.length ? viridis(1 - held.length / max) : "#f4f4f4"; sp.textContent = String(held.length); }
    else {
      const s = st[S.colour];
      if (!s || s.p_value === null) { sp.className = "nodata"; bg = null; }
      else { bg = s.assigned ? getComputedStyle(document.body).getPropertyValue("--held").trim() : "#f4f4f4"; sp.textContent = s.assigned ? "●" : ""; }
    }
    if (bg) { sp.style.background = bg; sp.style.color = ink(bg.length === 7 ? bg : "#0072B2"); }
    const lines = held.map((r) => `${r} (β ${fmt(st[r].mean)}, p ${fmtP(st[r].p_adjusted)})`);
    c.dataset.held = held.join(",");
    if (S.colour !== "count" && st[S.colour] && st[S.colour].mean !== null) c.dataset.mean = String(st[S.colour].mean); else delete c.dataset.mean;
    c.title = `layer ${l}, head ${h}` + (D.steps ? ` at step ${D.steps[S.step]}` : "") + ": " +
      (held.length ? `holds ${lines.join("; ")}` : "holds no role") +
      (S.colour !== "count" && st[S.colour] ? ` — ${S.colour}: mean β ${fmt(st[S.colour].mean)}, p ${fmtP(st[S.colour].p_value)}` : "");
    c.setAttribute("aria-label", c.title);
  }
  legend();
  if (S.head) { const sel = document.querySelector(`#grid .cell[data-layer="${S.head[0]}"][data-head="${S.head[1]}"]`); if (sel) sel.setAttribute("aria-selected", "true"); }
}
function legend() {
  const g = $("legend"); g.innerHTML = "";
  if (D.kind === "effect") {
    const [lo, hi] = effectRange(S.task, S.colour);
    g.append(`each cell: pre (left) | post (right) mean β of ${S.colour}, from ${fmt(lo, 3)} `);
    for (const c of VIRIDIS) { const i = el("i"); i.style.background = c; g.appendChild(i); }
    g.append(` to ${fmt(hi, 3)}`);
  } else if (S.colour === "count") {
    g.append("roles held (number in the cell): ");
    const max = Math.max(1, taskRoles().length);
    for (const n of [0, 1, Math.ceil(max / 2), max]) { const i = el("i"); i.style.background = n ? viridis(1 - n / max) : "#f4f4f4"; g.append(i, `${n}  `); }
  } else {
    const a = el("i"); a.style.background = "var(--held)"; const b = el("i"); b.style.background = "#f4f4f4"; const c = el("i", { class: "nodata" });
    g.append(a, `holds ${S.colour} (p < α = ${D.alpha})  `, b, "does not  ", c, "no test (n < 2 or zero variance)");
  }
  g.append(el("span", { class: "meta" }, " · arrow keys move between heads, Enter opens a head"));
}
function onGridKey(ev) {
  const l = +ev.target.dataset.layer, h = +ev.target.dataset.head;
  const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
  if (moves[ev.key]) {
    ev.preventDefault();
    const nl = Math.max(0, Math.min(D.layers - 1, l + moves[ev.key][0])), nh = Math.max(0, Math.min(D.heads - 1, h + moves[ev.key][1]));
    focusCell(nl, nh);
  } else if (ev.key === "Home" || ev.key === "End") { ev.preventDefault(); focusCell(l, ev.key === "Home" ? 0 : D.heads - 1); }
}
function focusCell(l, h) {
  for (const c of document.querySelectorAll("#grid .cell")) c.tabIndex = -1;
  const c = document.querySelector(`#grid .cell[data-layer="${l}"][data-head="${h}"]`); c.tabIndex = 0; c.focus();
}

// -- the head's card ---------------------------------------------------------------------------
function openCard(l, h) {
  S.head = [l, h]; S.seq = null; S.query = null;
  for (const c of document.querySelectorAll("#grid .cell")) c.setAttribute("aria-selected", "false");
  paintGrid();
  const card = $("card"); card.hidden = false; card.setAttribute("data-layer", l); card.setAttribute("data-head", h);
  $("card-title").textContent = `Layer ${l}, head ${h}` + (D.kind === "track" ? ` at step ${D.steps[S.step]}` : "") + ` — ${S.task}`;
  if (D.kind === "effect") effectTable(l, h); else statsTable(l, h);
  corefLine(l, h);
  trackChart(l, h);
  examples();
}
function cellTd(tr, field, value, text) { const td = el("td", { "data-field": field }, text); if (value !== null && value !== undefined) td.dataset.value = String(value); tr.appendChild(td); }
function statsTable(l, h) {
  const st = headStats(S.task, l, h, S.step), t = $("card-stats"); t.innerHTML = "";
  const head = el("tr"); for (const c of ["role", "mean β", "95% CI", `one-sided ${fmt(100 * (1 - D.alpha))}% bound`, "t", "p", `p adjusted (${D.settings.correction})`, "n", "held"]) head.appendChild(el("th", {}, c));
  t.appendChild(head);
  for (const role of Object.keys(st)) {
    const s = st[role], tr = el("tr", { "data-role": role }); if (s.assigned) tr.className = "held";
    cellTd(tr, "role", role, role);
    cellTd(tr, "mean", s.mean, fmt(s.mean));
    const ci = el("td", { "data-field": "ci" }, `${fmt(s.ci_low)} – ${fmt(s.ci_high)}`); ci.dataset.low = String(s.ci_low); ci.dataset.high = String(s.ci_high); tr.appendChild(ci);
    // The bound that matches the one-sided test: held (uncorrected) exactly when it exceeds τ.
    cellTd(tr, "lower_bound", s.lower_bound, s.lower_bound === undefined ? "–" : `> ${fmt(s.lower_bound)}`);
    cellTd(tr, "t", s.t, fmt(s.t));
    cellTd(tr, "p_value", s.p_value, fmtP(s.p_value));
    cellTd(tr, "p_adjusted", s.p_adjusted, fmtP(s.p_adjusted));
    cellTd(tr, "n", s.n, fmt(s.n));
    cellTd(tr, "assigned", s.assigned, s.assigned ? "yes" : "no");
    tr.title = `${role}: mean β ${s.mean} (95% CI ${s.ci_low} to ${s.ci_high}), sd ${s.std}, t ${s.t}, p ${s.p_value}, adjusted p ${s.p_adjusted}, n ${s.n}`;
    t.appendChild(tr);
  }
  const tau = D.steps ? (D.tau || {})[String(D.steps[S.step])] : D.tau;
  $("card-note").textContent = `H0: mean β ≤ τ = ${fmt(tau)}; a role is held when p < α = ${D.alpha}. Hover a row for every digit.`;
}
function corefLine(l, h) {
  const box = $("card-coref"), c = D.coref && D.coref.heads[`${l}-${h}`]; box.hidden = !c; if (!c) return;
  const pct = (v) => v === null ? "–" : (100 * v).toFixed(1);
  box.textContent = `GAP coreference: ${pct(c.test_accuracy)}% on test (95% CI ${pct(c.test_ci_low)} – ${pct(c.test_ci_high)}%, n ${fmt(c.test_n)}), ${pct(c.dev_accuracy)}% on dev; chance 50%.`;
  box.title = `from ${D.coref.source}/coref_heads.csv`;
}
function effectTable(l, h) {
  const t = $("card-stats"); t.innerHTML = ""; const head = el("tr");
  for (const c of ["role", "pre mean β", "post mean β", "change", "n"]) head.appendChild(el("th", {}, c));
  t.appendChild(head);
  const e = effectStats(S.task, S.post, l, h); if (!e) return;
  for (const role of Object.keys(e.roles)) {
    const s = e.roles[role], tr = el("tr", { "data-role": role });
    cellTd(tr, "role", role, role); cellTd(tr, "pre", s.pre, fmt(s.pre)); cellTd(tr, "post", s.post, fmt(s.post));
    const ch = s.pre === null || s.post === null ? null : s.post - s.pre; cellTd(tr, "change", ch, fmt(ch)); cellTd(tr, "n", s.n, fmt(s.n));
    tr.title = `${role}: pre ${s.pre}, post ${s.post}, n ${s.n}`; t.appendChild(tr);
  }
  $("card-note").textContent = `${S.post} against the pre-trained checkpoint on ${S.task}` + (e.cosine !== null ? `; cosine similarity of this head's attention pre vs post: ${fmt(e.cosine)}` : "") + ".";
}
function trackChart(l, h) {
  const box = $("card-chart"); box.innerHTML = ""; if (!D.steps) return;
  const role = S.role, s = D.stats[S.task][role]; if (!s) return;
  const W = 460, H = 180, P = 40, xs = D.steps.map((_, i) => P + (W - 2 * P) * (D.steps.length > 1 ? i / (D.steps.length - 1) : 0.5));
  const vals = []; D.steps.forEach((_, i) => { for (const f of ["ci_low", "ci_high", "mean"]) { const v = s[f][i][idx(l, h)]; if (v !== null) vals.push(v); } });
  const taus = D.steps.map((st) => (D.tau || {})[String(st)]).filter((v) => v !== undefined); vals.push(...taus);
  if (!vals.length) return;
  const lo = Math.min(...vals), hi = Math.max(...vals), y = (v) => H - P / 2 - (H - P) * (v - lo) / Math.max(hi - lo, 1e-12);
  const g = svg("svg", { width: W, height: H, role: "img", "aria-label": `mean β of ${role} against step` });
  g.appendChild(svg("text", { x: 4, y: 12, class: "meta", "font-size": 11 }, `${role}: mean β (95% CI) against step; dashed: τ`));
  let path = "", band = [];
  D.steps.forEach((st, i) => {
    const m = s.mean[i][idx(l, h)]; if (m === null) return;
    path += (path ? "L" : "M") + `${xs[i]},${y(m)}`;
    const lo_ = s.ci_low[i][idx(l, h)], hi_ = s.ci_high[i][idx(l, h)];
    if (lo_ !== null && hi_ !== null) g.appendChild(svg("line", { x1: xs[i], x2: xs[i], y1: y(lo_), y2: y(hi_), stroke: "#999" }));
    const dot = svg("circle", { cx: xs[i], cy: y(m), r: i === S.step ? 5 : 3, fill: s.assigned[i][idx(l, h)] ? "#0072B2" : "#fff", stroke: "#0072B2" });
    dot.appendChild(svg("title", {}, `step ${st}: mean β ${m}, 95% CI ${lo_} – ${hi_}, p ${s.p_value[i][idx(l, h)]}${s.assigned[i][idx(l, h)] ? " (held)" : ""}`));
    g.appendChild(dot);
    g.appendChild(svg("text", { x: xs[i], y: H - 2, "font-size": 10, "text-anchor": "middle" }, String(st)));
  });
  g.insertBefore(svg("path", { d: path, fill: "none", stroke: "#0072B2" }), g.children[1]);
  if (taus.length) { const t = taus[taus.length - 1]; g.appendChild(svg("line", { x1: P, x2: W - P, y1: y(t), y2: y(t), stroke: "#E69F00", "stroke-dasharray": "4 3" })); }
  g.appendChild(svg("text", { x: 2, y: y(hi) + 4, "font-size": 10 }, fmt(hi, 3))); g.appendChild(svg("text", { x: 2, y: y(lo), "font-size": 10 }, fmt(lo, 3)));
  box.appendChild(g);
}

// -- example sequences ---------------------------------------------------------------------------
const decoded = new Map();
function bytes(b64) { if (!decoded.has(b64)) { const s = atob(b64), a = new Uint8Array(s.length); for (let i = 0; i < s.length; i++) a[i] = s.charCodeAt(i); decoded.set(b64, a); } return decoded.get(b64); }
function bit(a, i) { return (a[i >> 3] & (0x80 >> (i & 7))) !== 0; }
function examples() {
  const box = $("card-examples"); box.innerHTML = "";
  if (D.examples_missing) { box.appendChild(el("p", { class: "note", id: "examples-missing" }, D.examples_missing)); return; }
  const ex = D.examples[S.task]; if (!ex || !ex.sequences.length) { box.appendChild(el("p", { class: "note" }, "No example sequences for this task.")); return; }
  const [l, h] = S.head, names = shownModels(ex), first = names[0];
  const score = (q) => { const b = (q.beta[first] || {})[S.role]; return b ? b[idx(l, h)] : null; };
  const order = ex.sequences.map((q, i) => i).sort((a, b) => (score(ex.sequences[b]) ?? -Infinity) - (score(ex.sequences[a]) ?? -Infinity));
  // Until a sequence is picked, the one this head scores highest on the role.
  if (S.seq === null) S.seq = order[0];
  // A sequence without a row of the role has no score for it: it is not offered as "β –".
  const scored = order.filter((i) => score(ex.sequences[i]) !== null);
  const bar = el("div", { class: "seqs" });
  bar.append(scored.length ? `Sequences, by this head's ${S.role} score: ` : `No example sequence has a row scored for ${S.role}.`);
  scored.forEach((i, rank) => {
    const q = ex.sequences[i], label = rank === 0 ? "highest" : rank === Math.floor((scored.length - 1) / 2) ? "median" : "";
    const b = el("button", { "aria-pressed": String(i === S.seq), "data-seq": i }, `#${q.index} β ${fmt(score(q), 3)}${label ? " (" + label + ")" : ""}`);
    b.title = `example ${q.index} of ${source(S.task)}; mean ${S.role} β of head ${l}-${h}: ${score(q)}`;
    b.addEventListener("click", () => { S.seq = i; S.query = null; examples(); });
    bar.appendChild(b);
  });
  box.appendChild(bar);
  const q = ex.sequences[S.seq], n = q.tokens.length;
  box.appendChild(el("p", { class: "meta" }, `Click (or Tab + Enter) a token on the left to see its attention; its ${S.role} sieve is marked orange on the right. Underlined: rows scored for ${S.role}. Lines grow with the attention; hover one for its value.` +
    (q.rows[S.role] ? "" : ` ${S.role} is not defined for this sequence.`)));
  const views = el("div", { class: "views" });
  for (const name of names) views.appendChild(q.attention[name] ? lineView(q, name, l, h, n) :
    el("p", { class: "note" }, `No example attention was recorded at ${name}: its scores came from a scores-cache entry written before the track recorded it.`));
  box.appendChild(views);
}
// A track's examples recorded at each step: the step the slider shows.
function shownModels(ex) { return ex.per_step ? [`step ${D.steps[S.step]}`] : ex.models; }
function lineView(q, name, l, h, n) {
  const att = bytes(q.attention[name]), base = ((l * D.heads + h) * n) * n, rowH = 15, W = 340, xl = 110, xr = 230;
  const sieve = q.sieves[S.role] ? bytes(q.sieves[S.role]) : null, scored = new Set(q.rows[S.role] || []);
  const box = el("div", { class: "view" });
  const b = q.beta[name][S.role];
  box.appendChild(el("h3", {}, `${name}: ${S.role} β of this sequence ${b ? fmt(b[idx(l, h)]) : "–"}`));
  const g = svg("svg", { width: W, height: n * rowH + 10, role: "img", "aria-label": `attention of layer ${l} head ${h}, ${name}` });
  const queries = S.query === null ? [...Array(n).keys()] : [S.query];
  if (S.query !== null && sieve) for (let s = 0; s < n; s++) if (bit(sieve, S.query * n + s))
    g.appendChild(svg("rect", { x: xr - 3, y: s * rowH + 1, width: 105, height: rowH - 1, fill: "#E69F00", opacity: 0.45 }));
  for (const t of queries) for (let s = 0; s < n; s++) {
    const a = att[base + t * n + s] / 255; if (a < 0.01) continue;
    const line = svg("line", { x1: xl, y1: t * rowH + 10, x2: xr, y2: s * rowH + 10, stroke: "#0072B2", "stroke-width": S.query === null ? 1 : 1 + 5 * a, opacity: S.query === null ? a * 0.6 : Math.sqrt(a) });
    if (S.query !== null) line.appendChild(svg("title", {}, `${q.tokens[t]} → ${q.tokens[s]}: attention ≈ ${a.toFixed(3)}`));
    g.appendChild(line);
  }
  for (let t = 0; t < n; t++) {
    const left = svg("text", { x: xl - 5, y: t * rowH + 13, "text-anchor": "end", class: "tok" + (scored.has(t) ? " scored" : "") + (t === S.query ? " query" : ""), tabindex: 0, "data-token": t }, q.tokens[t]);
    left.appendChild(svg("title", {}, `token ${t} (segment ${q.segments[t] ? "B" : "A"})` + (scored.has(t) ? `, scored for ${S.role}` : "")));
    const pick = () => { S.query = S.query === t ? null : t; examples(); const f = document.querySelector(`#card-examples .tok[data-token="${t}"]`); if (f) f.focus(); };
    left.addEventListener("click", pick); left.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); pick(); } });
    g.appendChild(left);
    const right = svg("text", { x: xr + 5, y: t * rowH + 13, class: "tok" }, q.tokens[t]);
    if (S.query !== null) right.appendChild(svg("title", {}, `${q.tokens[S.query]} → ${q.tokens[t]}: attention ≈ ${(att[base + S.query * n + t] / 255).toFixed(3)}` +
      (sieve && bit(sieve, S.query * n + t) ? ` (in the ${S.role} sieve)` : "")));
    g.appendChild(right);
  }
  box.appendChild(g);
  return box;
}

// -- controls ----------------------------------------------------------------------------------
function options(select, values, current) { select.innerHTML = ""; for (const [v, text] of values) { const o = el("option", { value: v }, text); if (v === current) o.selected = true; select.appendChild(o); } }
function setup() {
  document.title = D.title; $("title").textContent = D.title;
  $("meta").textContent = `${D.run_dir} · checkpoint ${D.checkpoint} · ${D.layers} layers × ${D.heads} heads · ` +
    (D.tasks.some(hasSplit) ? `split ${D.settings.split}, ` : "") + `n ${D.settings.n}, max length ${D.settings.max_length}, window ${D.settings.window}, ${D.settings.test}-test, correction ${D.settings.correction}, parser ${D.settings.parser}` +
    (D.settings.attention === "norms" ? ", β on the norm-weighted attention (Kobayashi et al. 2020)" : "");
  options($("task"), D.tasks.map((t) => [t, t]), S.task);
  $("task").addEventListener("change", (e) => { S.task = e.target.value; refreshRoles(); paintGrid(); if (S.head) openCard(...S.head); });
  refreshRoles();
  $("colour-by").addEventListener("change", (e) => { S.colour = e.target.value; paintGrid(); });
  $("card-role").addEventListener("change", (e) => { S.role = e.target.value; S.seq = null; S.query = null; if (S.head) { trackChart(...S.head); examples(); } });
  if (D.steps) {
    const r = $("step"); r.max = D.steps.length - 1; r.value = S.step; $("step-box").hidden = false;
    const show = () => { $("step-label").textContent = `step ${D.steps[S.step]}`; r.setAttribute("aria-valuetext", `step ${D.steps[S.step]}`); };
    r.addEventListener("input", () => { S.step = +r.value; show(); paintGrid(); if (S.head) openCard(...S.head); }); show();
  }
  if (D.posts) { $("post-box").hidden = false; options($("post"), D.posts.map((p) => [p, p]), S.post);
    $("post").addEventListener("change", (e) => { S.post = e.target.value; paintGrid(); if (S.head) openCard(...S.head); }); }
  if (D.kind === "track") $("examples-note").textContent = Object.values(D.examples).some((e) => e.per_step) ?
    "The example attention is that of the checkpoint the slider shows." : `The example attention is that of the last checkpoint (step ${D.steps[D.steps.length - 1]}).`;
  if (!D.open && D.kind !== "effect") { S.colour = splittingRole(); $("colour-by").value = S.colour; }
  buildGrid();
  // A head view (analysis.api.head_view) opens its head on its role, the sieve of the role's first
  // scored token marked; a report opens the head holding the most roles.
  if (D.open) {
    S.role = D.open.role; $("card-role").value = S.role; openCard(D.open.layer, D.open.head);
    const q = D.examples[S.task].sequences[S.seq];
    if (q.rows[S.role] && q.rows[S.role].length) { S.query = q.rows[S.role][0]; examples(); }
  } else openCard(...firstHead());
}
// The role whose held/not-held split of the heads is the most even: the role-count colouring is
// mostly one number when nearly every head holds the same roles (a [CLS] sink and its delimiter).
function splittingRole() {
  let best = "count", gap = Infinity;
  for (const role of taskRoles()) {
    const s = D.stats[S.task][role], tested = s.assigned[S.step].filter((_, i) => s.p_value[S.step][i] !== null);
    if (!tested.length) continue;
    const g = Math.abs(tested.filter((a) => a === true).length / tested.length - 0.5);
    if (g < gap) { gap = g; best = role; }
  }
  return best;
}
function firstHead() {
  if (D.kind === "effect") return [0, 0];
  let best = [0, 0], most = -1;
  for (let l = 0; l < D.layers; l++) for (let h = 0; h < D.heads; h++) {
    const st = headStats(S.task, l, h, S.step), held = Object.keys(st).filter((r) => st[r].assigned === true).length;
    if (held > most) { most = held; best = [l, h]; }
  }
  return best;
}
function refreshRoles() {
  const rs = taskRoles();
  const colour = D.kind === "effect" ? rs.map((r) => [r, `mean β of ${r}`]) : [["count", "number of roles held"], ...rs.map((r) => [r, `holds ${r}`])];
  if (!colour.some(([v]) => v === S.colour)) S.colour = colour[0][0];
  options($("colour-by"), colour, S.colour);
  if (!rs.includes(S.role)) S.role = rs[0];
  options($("card-role"), rs.map((r) => [r, `${r} (${D.coarse[r] || ""})`]), S.role);
}
setup();
readingSwitch();

// A `--attention both` run: the grid and the cards switch between the weights' tables and the
// norm-weighted attention's (Kobayashi et al. 2020); the examples draw the weights under either.
function readingSwitch() {
  if (!D.readings) return;
  const tables = { weights: D.stats, ...D.readings };
  const names = { weights: "the attention weights", norms: "the norm-weighted attention (examples: the weights)" };
  const select = el("select", { id: "reading" });
  options(select, Object.keys(tables).map((r) => [r, names[r] || r]), "weights");
  const label = el("label", {}, "β on "); label.appendChild(select);
  document.querySelector(".controls").appendChild(label);
  select.addEventListener("change", (e) => {
    D.stats = tables[e.target.value]; refreshRoles(); paintGrid(); if (S.head) openCard(...S.head);
  });
}
"""

BODY = """
<header><h1 id="title"></h1><div class="meta" id="meta"></div></header>
<div class="controls">
  <label>task <select id="task"></select></label>
  <label>colour <select id="colour-by"></select></label>
  <span id="step-box" hidden><label>checkpoint <input type="range" id="step" min="0" step="1"></label> <output id="step-label"></output></span>
  <span id="post-box" hidden><label>fine-tuned checkpoint <select id="post"></select></label></span>
</div>
<div class="layout">
  <div><div id="grid" class="grid" role="grid" aria-label="attention heads: layers by heads"></div><div id="legend"></div>
    <p class="meta" id="hint">Click a head (or Tab to the grid, move with the arrow keys, press Enter) to open its card.</p></div>
  <section id="card" hidden aria-live="polite">
    <h2 id="card-title"></h2>
    <table id="card-stats"></table>
    <p class="meta" id="card-note"></p>
    <p id="card-coref" hidden></p>
    <label>role <select id="card-role"></select></label>
    <div id="card-chart"></div>
    <p class="meta" id="examples-note"></p>
    <div id="card-examples"></div>
  </section>
</div>
"""


# In the page's head: what tells a report analysis.report may replace from any other file.
GENERATOR = '<meta name="generator" content="bertjax analysis.report">'


def render(data: dict) -> str:
    """The page for `data` (what `analysis.report.report_data` returns)."""
    # Inside a script element "</script" ends it early and "<!--<script" makes the parser skip
    # the real end tag (a blank page); U+2028/9 end a line in older JavaScript. JSON strings allow
    # each of these characters as a \u escape, and "<", ">", "&" occur nowhere else in JSON.
    payload = json.dumps(data, allow_nan=False, separators=(",", ":"))
    for char in "<>&\u2028\u2029":
        payload = payload.replace(char, f"\\u{ord(char):04x}")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        + GENERATOR
        + f"<title>{html.escape(data['title'])}</title>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>{STYLE}</style></head><body>{BODY}"
        f'<script type="application/json" id="report-data">{payload}</script>'
        f"<script>{SCRIPT}</script></body></html>\n"
    )
