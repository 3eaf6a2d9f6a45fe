// agl-bridge view: live updates, the run's curves (hand-written SVG), and the token view's colours and hover.
// No library and nothing fetched from elsewhere: the page's Content-Security-Policy allows only this server.
"use strict";

const POLL_MS = 1500;
const COLOURS = ["#3155d4", "#e0793b", "#1a9e5c", "#9c6ade", "#c0392b"];
const SVG = "http://www.w3.org/2000/svg";

const tip = () => document.getElementById("tip");

function showTip(text, x, y) {
  const el = tip();
  if (!el) return;
  el.textContent = text;
  el.hidden = false;
  const width = el.offsetWidth, height = el.offsetHeight;
  el.style.left = Math.min(x + 14, window.innerWidth - width - 8) + "px";
  el.style.top = (y + 16 + height > window.innerHeight ? y - height - 10 : y + 16) + "px";
}

function hideTip() {
  const el = tip();
  if (el) el.hidden = true;
}

function fmt(value) {
  if (value === null || value === undefined) return "—";
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e5)) return value.toExponential(2);
  return Number.isInteger(value) ? String(value) : value.toFixed(abs < 1 ? 4 : 3);
}

// --- charts ---------------------------------------------------------------------------------------

let charts = [];
let zoom = null; // [first step, last step] shown by every chart, or null for all

function niceTicks(lo, hi, count, integer) {
  const span = hi - lo;
  if (!(span > 0)) return { ticks: [lo], step: 1 };
  const raw = span / count;
  const power = Math.pow(10, Math.floor(Math.log10(raw)));
  let step = [1, 2, 2.5, 5, 10].map((m) => m * power).find((s) => span / s <= count) || raw;
  if (integer) step = Math.max(1, Math.round(step));
  const ticks = [];
  for (let i = Math.ceil(lo / step - 1e-9); i * step <= hi + step * 1e-9; i++) ticks.push(Number((i * step).toPrecision(12)));
  return { ticks, step };
}

function tickLabel(value, step) {
  if (value === 0) return "0";
  if (step < 1e-3 || Math.abs(value) >= 1e5) return value.toExponential(1);
  const decimals = Math.max(0, Math.ceil(-Math.log10(step) - 1e-9) + (String(step).includes("25") ? 1 : 0));
  return value.toFixed(decimals);
}

function el(name, attributes, parent) {
  const node = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
  if (parent) parent.appendChild(node);
  return node;
}

function drawChart(box, chart) {
  box.replaceChildren();
  const title = document.createElement("h3");
  title.textContent = chart.title;
  box.appendChild(title);
  const keys = document.createElement("div");
  keys.className = "keys";
  chart.series.forEach((series, index) => {
    const key = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = COLOURS[index % COLOURS.length];
    key.append(swatch, series.label);
    keys.appendChild(key);
  });
  box.appendChild(keys);
  const inRange = (step) => !zoom || (step >= zoom[0] && step <= zoom[1]);
  const points = chart.series.flatMap((s) => s.points.filter((p) => inRange(p[0])));
  const values = points.map((p) => p[1]).filter((v) => v !== null);
  if (!values.length) {
    const empty = document.createElement("div");
    empty.className = "empty";
    empty.textContent = points.length ? "no values in these steps (nothing was trained)" : "no values yet";
    box.appendChild(empty);
    return;
  }
  const width = Math.max(box.clientWidth - 20, 200), height = 190;
  const pad = { left: 50, right: 10, top: 8, bottom: 22 };
  const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": chart.title }, box);
  const steps = points.map((p) => p[0]);
  let x0 = zoom ? zoom[0] : Math.min(...steps), x1 = zoom ? zoom[1] : Math.max(...steps);
  if (x0 === x1) { x0 -= 0.5; x1 += 0.5; }
  let y0 = Math.min(...values), y1 = Math.max(...values);
  if (y0 === y1) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
  const margin = (y1 - y0) * 0.06;
  y0 -= margin; y1 += margin;
  const X = (step) => pad.left + ((step - x0) / (x1 - x0)) * (width - pad.left - pad.right);
  const Y = (v) => height - pad.bottom - ((v - y0) / (y1 - y0)) * (height - pad.top - pad.bottom);
  const axis = el("g", { class: "axis" }, svg);
  const yTicks = niceTicks(y0, y1, 4, false);
  for (const t of yTicks.ticks) {
    el("line", { class: "gridline", x1: pad.left, x2: width - pad.right, y1: Y(t), y2: Y(t) }, axis);
    el("text", { x: pad.left - 6, y: Y(t) + 3.5, "text-anchor": "end" }, axis).textContent = tickLabel(t, yTicks.step);
  }
  for (const t of niceTicks(Math.ceil(x0), Math.floor(x1), 6, true).ticks) {
    el("text", { x: X(t), y: height - 6, "text-anchor": "middle" }, axis).textContent = String(t);
  }
  chart.series.forEach((series, index) => {
    const colour = COLOURS[index % COLOURS.length];
    const shown = series.points.filter((p) => inRange(p[0]));
    let d = "", pen = false;
    for (const [step, value] of shown) {
      if (value === null) { pen = false; continue; }
      d += `${pen ? "L" : "M"}${X(step).toFixed(1)},${Y(value).toFixed(1)}`;
      pen = true;
    }
    el("path", { d, fill: "none", stroke: colour, "stroke-width": 1.8, "stroke-linejoin": "round" }, svg);
    if (shown.length <= 80) {
      for (const [step, value] of shown) {
        if (value !== null) el("circle", { cx: X(step), cy: Y(value), r: 2.6, fill: colour }, svg);
      }
    }
  });
  const cursor = el("line", { class: "cursor", y1: pad.top, y2: height - pad.bottom, visibility: "hidden" }, svg);
  const brush = el("rect", { class: "brush", y: pad.top, height: height - pad.top - pad.bottom, visibility: "hidden" }, svg);
  const allSteps = [...new Set(steps)].sort((a, b) => a - b);
  const toSvgX = (event) => ((event.clientX - svg.getBoundingClientRect().left) / svg.getBoundingClientRect().width) * width;
  const stepAt = (x) => x0 + ((x - pad.left) / (width - pad.left - pad.right)) * (x1 - x0);
  const nearest = (x) => allSteps.reduce((best, s) => (Math.abs(X(s) - x) < Math.abs(X(best) - x) ? s : best), allSteps[0]);
  let dragFrom = null;
  svg.addEventListener("mousedown", (event) => { dragFrom = toSvgX(event); event.preventDefault(); });
  svg.addEventListener("mousemove", (event) => {
    const x = toSvgX(event);
    const step = nearest(x);
    cursor.setAttribute("x1", X(step));
    cursor.setAttribute("x2", X(step));
    cursor.setAttribute("visibility", "visible");
    if (dragFrom !== null) {
      brush.setAttribute("x", Math.min(dragFrom, x));
      brush.setAttribute("width", Math.abs(x - dragFrom));
      brush.setAttribute("visibility", "visible");
    }
    const lines = [`step ${step}`];
    for (const series of chart.series) {
      const point = series.points.find((p) => p[0] === step);
      if (point) lines.push(`${series.label}: ${fmt(point[1])}`);
    }
    showTip(lines.join("\n"), event.clientX, event.clientY);
  });
  svg.addEventListener("mouseleave", () => { cursor.setAttribute("visibility", "hidden"); brush.setAttribute("visibility", "hidden"); dragFrom = null; hideTip(); });
  svg.addEventListener("mouseup", (event) => {
    const x = toSvgX(event);
    if (dragFrom !== null && Math.abs(x - dragFrom) > 6) {
      const a = stepAt(Math.min(dragFrom, x)), b = stepAt(Math.max(dragFrom, x));
      const inside = allSteps.filter((s) => s >= a && s <= b);
      if (inside.length) { zoom = [inside[0], inside[inside.length - 1]]; drawCharts(); }
    }
    dragFrom = null;
    brush.setAttribute("visibility", "hidden");
  });
  svg.addEventListener("dblclick", () => { zoom = null; drawCharts(); });
}

function drawCharts() {
  const grid = document.querySelector("[data-charts]");
  if (!grid) return;
  hideTip();
  grid.replaceChildren();
  for (const chart of charts) {
    const box = document.createElement("div");
    box.className = "chart";
    box.dataset.chart = chart.id;
    grid.appendChild(box);
    drawChart(box, chart);
  }
  const hint = grid.parentElement.querySelector(".hint");
  if (hint) {
    let note = hint.querySelector(".zoomnote");
    if (!note) { note = document.createElement("span"); note.className = "zoomnote"; hint.appendChild(note); }
    note.textContent = zoom ? `showing steps ${zoom[0]}–${zoom[1]} (double-click a chart for all)` : "";
  }
}

async function loadCharts() {
  const grid = document.querySelector("[data-charts]");
  if (!grid) return;
  const response = await fetch(grid.dataset.charts, { cache: "no-store" });
  if (!response.ok) return;
  charts = (await response.json()).charts;
  drawCharts();
}

// --- the token view ---------------------------------------------------------------------------------

let colourMode = "mask";

function tokenColour(token, mode, advantage) {
  if (token.dataset.m !== "1" || mode === "mask") return "";
  if (mode === "logprob") {
    const p = Math.exp(parseFloat(token.dataset.lp));
    return `hsl(${Math.round(120 * p)} 72% 80%)`;
  }
  if (mode === "advantage") return advantage > 0 ? "#bfeccd" : advantage < 0 ? "#f7c6c0" : "#e4e6eb";
  const version = parseInt(token.dataset.v, 10);
  return version < 0 ? "#e4e6eb" : `hsl(${Math.round((version * 137.5) % 360)} 65% 82%)`;
}

function applyColours() {
  for (const select of document.querySelectorAll("select.colour-mode")) select.value = colourMode;
  for (const legend of document.querySelectorAll("[data-legend]")) legend.hidden = legend.dataset.legend !== colourMode;
  for (const box of document.querySelectorAll(".tokens")) {
    const advantage = parseFloat(box.dataset.adv);
    for (const token of box.querySelectorAll(".tok")) {
      const colour = tokenColour(token, colourMode, advantage);
      token.style.background = colour;
      token.style.boxShadow = colour ? "none" : "";
    }
  }
}

function tokenTip(token) {
  const text = token.textContent.replace(/↵\n/g, "\n").replace(/⇥/g, "\t");
  const lines = [`token id ${token.dataset.id}   position ${token.dataset.i}`, `text ${JSON.stringify(text)}`];
  if (token.dataset.m === "1") {
    const logprob = parseFloat(token.dataset.lp);
    lines.push("trained (loss mask 1)", `sampler logprob ${logprob.toFixed(5)}  (p ${Math.exp(logprob).toFixed(4)})`);
    const version = parseInt(token.dataset.v, 10);
    lines.push(version < 0 ? "policy version unknown" : `policy version ${version}`);
    const advantage = parseFloat(token.closest(".tokens").dataset.adv);
    if (!Number.isNaN(advantage)) lines.push(`advantage ${advantage >= 0 ? "+" : ""}${advantage.toFixed(4)}`);
  } else {
    lines.push("context (loss mask 0): prompt or observation, not trained");
  }
  return lines.join("\n");
}

// Show only the calls and sequences of one class of the rollout graph ("" shows every class).
function applyClassFilter(chosen) {
  for (const select of document.querySelectorAll("select.class-filter")) select.value = chosen;
  for (const item of document.querySelectorAll("[data-call-class]")) {
    item.classList.toggle("filtered-out", chosen !== "" && item.dataset.callClass !== chosen);
  }
}

document.addEventListener("change", (event) => {
  if (event.target.matches("select.colour-mode")) {
    colourMode = event.target.value;
    applyColours();
  }
  if (event.target.matches("select.class-filter")) applyClassFilter(event.target.value);
});

document.addEventListener("mouseover", (event) => {
  const token = event.target.closest ? event.target.closest(".tok[data-id]") : null;
  if (token) showTip(tokenTip(token), event.clientX, event.clientY);
});

document.addEventListener("mouseout", (event) => {
  if (event.target.closest && event.target.closest(".tok[data-id]")) hideTip();
});

// --- live updates -----------------------------------------------------------------------------------

let lastVersion = null;
let lastRefresh = { at: 0, took: 0 };

async function refreshLive() {
  hideTip();
  for (const region of document.querySelectorAll("[data-live]")) {
    const response = await fetch(region.dataset.live, { cache: "no-store" });
    if (!response.ok) continue;
    const html = await response.text();
    if (html !== region.dataset.lastHtml) {
      const open = [...region.querySelectorAll("details[open]")].map((d) => d.closest("[id]")?.id).filter(Boolean);
      region.innerHTML = html;
      region.dataset.lastHtml = html;
      for (const id of open) document.getElementById(id)?.querySelector("details")?.setAttribute("open", "");
    }
  }
  applyColours();
  await loadCharts();
}

async function poll() {
  const badge = document.getElementById("live");
  try {
    const response = await fetch("/api/version", { cache: "no-store" });
    if (!response.ok) throw new Error(String(response.status));
    const version = JSON.stringify(await response.json());
    // A busy store changes every moment: re-fetch at most once per five times a re-fetch takes.
    const rested = performance.now() - lastRefresh.at >= 5 * lastRefresh.took;
    if (lastVersion !== null && version !== lastVersion && rested) {
      const started = performance.now();
      await refreshLive();
      lastRefresh = { at: performance.now(), took: performance.now() - started };
      if (badge) {
        badge.textContent = "updated " + new Date().toLocaleTimeString();
        badge.className = "live on flash";
        setTimeout(() => { badge.className = "live on"; }, 800);
      }
    } else if (badge && badge.classList.contains("off")) {
      badge.className = "live on";
      badge.textContent = "live";
    }
    if (lastVersion === null || rested) lastVersion = version;
    if (badge && !badge.classList.contains("on")) badge.classList.add("on");
  } catch (error) {
    if (badge) { badge.className = "live off"; badge.textContent = "viewer unreachable"; }
  }
  setTimeout(poll, POLL_MS);
}

window.addEventListener("resize", () => drawCharts());
document.addEventListener("DOMContentLoaded", () => {
  loadCharts();
  applyColours();
  poll();
});
