// The chart: tokens by source, one bar per model call.
import { el, fmtInt, svg, $ } from "./dom.js";
import { state } from "./state.js";

const CATEGORY_ORDER = ["instructions", "tools", "context", "history", "model", "tool", "input", "format"];
const PALETTE = {
  instructions: ["#4f46e5", "#818cf8", "#3730a3"],
  tools: ["#ca8a04", "#fde047", "#a16207"],
  context: ["#059669", "#34d399", "#0d9488", "#65a30d", "#6ee7b7"],
  history: ["#0284c7", "#7dd3fc", "#0369a1"],
  model: ["#7c3aed", "#c4b5fd"],
  tool: ["#ea580c", "#fdba74", "#c2410c"],
  input: ["#dc2626", "#f87171"],
  format: ["#9ca3af"],
};
const CATEGORY_LABEL = {
  instructions: "instructions", tools: "tool definitions", context: "context provider", history: "history",
  model: "model output (this run)", tool: "tool results (this run)", input: "input", format: "chat format",
};


export function category(key) { return key.split(":")[0]; }

export function colorFor(key) {
  if (!state.colors.has(key)) {
    const cat = category(key);
    const shades = PALETTE[cat] || ["#64748b"];
    const used = [...state.colors.keys()].filter((k) => category(k) === cat).length;
    state.colors.set(key, shades[used % shades.length]);
  }
  return state.colors.get(key);
}

function orderedKeys(traces) {
  const keys = new Set();
  for (const t of traces) for (const k of Object.keys(t.tokens_by_source || {})) keys.add(k);
  const rank = (k) => { const i = CATEGORY_ORDER.indexOf(category(k)); return i < 0 ? 99 : i; };
  return [...keys].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
}

export function describeKey(key) {
  const [cat, ...rest] = key.split(":");
  const id = rest.join(":");
  return id ? `${CATEGORY_LABEL[cat] || cat}: ${id}` : (CATEGORY_LABEL[cat] || cat);
}

export function renderChart(onSelect) {
  const box = $("chart");
  const traces = state.traces;
  if (!traces.length) {
    box.replaceChildren(el("p", { class: "muted", text: "No stored traces for this session. Traces are stored by agents made with Agent(store_traces=True) and by contextpipe chat." }));
    $("legend").replaceChildren();
    return;
  }
  const keys = orderedKeys(traces);
  const max = Math.max(...traces.map((t) => t.total_tokens || 0), 1);
  const W = 560, left = 58, right = 64, rowH = 22, top = 18;
  const H = top + traces.length * rowH + 8;
  const scale = (W - left - right) / max;
  const ticks = niceTicks(max);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "tokens by source per model call" });
  for (const t of ticks) {
    const x = left + t * scale;
    root.append(svg("line", { class: "axis", x1: x, x2: x, y1: top - 4, y2: H - 6 }),
      svg("text", { class: "tick", x, y: top - 7, "text-anchor": "middle", text: fmtInt(t) }));
  }
  traces.forEach((trace, i) => {
    const y = top + i * rowH;
    const g = svg("g", { class: `call${state.selectedCall === i ? " selected" : ""}`, "data-call": i + 1, onclick: () => onSelect(i) },
      svg("rect", { class: "bg", x: 0, y: y - 2, width: W, height: rowH, fill: "transparent", rx: 3 }),
      svg("text", { class: "bar-label", x: left - 6, y: y + 12, "text-anchor": "end", text: `call ${i + 1}` }));
    let x = left;
    for (const key of keys) {
      const tokens = (trace.tokens_by_source || {})[key] || 0;
      if (!tokens) continue;
      const w = Math.max(tokens * scale, 1);
      g.append(svg("rect", { class: "seg", x, y: y + 1, width: w, height: rowH - 6, fill: colorFor(key), "data-source": key, "data-tokens": tokens },
        svg("title", { text: `call ${i + 1} · ${describeKey(key)}: ${fmtInt(tokens)} tokens (${(100 * tokens / Math.max(trace.total_tokens, 1)).toFixed(1)}%)` })));
      x += w;
    }
    g.append(svg("text", { class: "bar-total", x: x + 5, y: y + 12, text: fmtInt(trace.total_tokens) }));
    root.append(g);
  });
  box.replaceChildren(root);
  const totals = {};
  for (const t of traces) for (const [k, v] of Object.entries(t.tokens_by_source || {})) totals[k] = (totals[k] || 0) + v;
  $("legend").replaceChildren(...keys.map((k) => el("span", { title: `${fmtInt(totals[k])} tokens over all calls` },
    el("span", { class: "swatch", style: `background:${colorFor(k)}` }), describeKey(k))));
}

function niceTicks(max) {
  const rough = max / 4;
  const power = 10 ** Math.floor(Math.log10(rough));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * power).find((s) => s >= rough) || rough;
  const ticks = [];
  for (let t = 0; t <= max + 1e-9; t += step) ticks.push(Math.round(t));
  return ticks;
}
