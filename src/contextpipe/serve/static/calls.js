// One model call in detail: what it sent, where its tokens came from, what compaction did.
import { el, fmtInt, $ } from "./dom.js";
import { state } from "./state.js";
import { colorFor, describeKey, renderChart } from "./chart.js";
import { renderDiff } from "./diff.js";
import { loadMessagesFor, renderRequest } from "./request.js";
import { cacheBadge, cacheLoss } from "./cache.js";

export function selectCall(i) {
  state.selectedCall = i;
  state.diffBase = null;
  renderChart(selectCall);
  renderCallDetail();
  for (const node of document.querySelectorAll(".marker.callmark")) {
    node.classList.toggle("selected", Number(node.dataset.call) === i + 1);
  }
}

export function renderCallDetail() {
  const box = $("call-detail");
  const i = state.selectedCall;
  const trace = i === null ? null : state.traces[i];
  if (!trace) { box.replaceChildren(); return; }
  const stats = [
    `model ${trace.model}`, `${fmtInt(trace.total_tokens)} tokens (${trace.tokenizer} count)`,
    `${(trace.latency_s * 1000).toFixed(1)} ms`,
    trace.usage ? `reported ${fmtInt(trace.usage.input_tokens)} in / ${fmtInt(trace.usage.output_tokens)} out` : "no usage reported",
    trace.finish_reason ? `finished: ${trace.finish_reason}` : null,
  ].filter(Boolean);
  const total = Math.max(trace.total_tokens, 1);
  const rows = Object.entries(trace.tokens_by_source).sort((a, b) => b[1] - a[1]).map(([k, v]) => el("tr", {},
    el("td", {}, el("span", { class: "swatch", style: `background:${colorFor(k)};display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:6px` }), describeKey(k)),
    el("td", { class: "num", text: fmtInt(v) }), el("td", { class: "num", text: `${(100 * v / total).toFixed(1)}%` })));
  const decisions = (trace.compaction || []).map((d) => el("div", { class: "decision" },
    el("strong", { text: `${d.strategy}: ${d.action} ${d.message_ids.length} message(s)` }),
    ` — ${d.reason} (${fmtInt(d.tokens_before)} → ${fmtInt(d.tokens_after)} tokens)`));
  const timings = (trace.provider_timings || []).map((t) => el("tr", {},
    el("td", { text: `${t.source_id}.${t.hook}` }), el("td", { class: "num", text: `${(t.seconds * 1000).toFixed(2)} ms` })));
  const loss = cacheLoss(trace);
  box.replaceChildren(
    el("h3", { text: `Model call ${i + 1}` }), el("div", { class: "stats" }, ...stats.map((s) => el("span", { text: s }))),
    ...(loss ? [el("p", { class: "cache-note", id: "cache-note" }, cacheBadge(trace), ` ${loss}`)] : []),
    el("h3", { text: "Tokens by source" }),
    el("table", { class: "sources" }, el("tbody", {}, ...rows)),
    el("h3", { text: "Compaction" }),
    decisions.length ? el("div", {}, ...decisions) : el("p", { class: "muted", text: "Nothing was dropped or summarised for this call." }),
    timings.length ? el("h3", { text: "Provider hooks" }) : null,
    timings.length ? el("table", {}, el("tbody", {}, ...timings)) : null,
    ...renderRequest(trace),
    ...compare(i));
  if (state.loadedFor !== state.current) {  // once per session: the older messages the requests name
    state.loadedFor = state.current;
    const before = state.extra.size;
    loadMessagesFor(state.traces).then(() => { if (state.extra.size > before) renderCallDetail(); });
  }
}

/** The diff section: the request of a call picked in a list (the previous one at first) against call `i`'s. */
function compare(i) {
  if (state.traces.length < 2) return [];
  if (state.diffBase === null || state.diffBase === i || state.diffBase >= state.traces.length) {
    state.diffBase = i > 0 ? i - 1 : 1;
  }
  const base = state.diffBase;
  const pick = el("select", { id: "diff-base", "aria-label": "Compare with model call",
    onchange: (event) => { state.diffBase = Number(event.target.value); renderCallDetail(); } },
    ...state.traces.map((_, j) => (j === i ? null : el("option", { value: j, selected: j === base, text: `call ${j + 1}` }))));
  return [
    el("h3", {}, `Changes from `, pick, ` to call ${i + 1}`),
    el("ol", { class: "diff-list", id: "diff" }, ...renderDiff(state.traces[base], state.traces[i])),
  ];
}
