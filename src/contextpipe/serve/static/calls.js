// One model call in detail: what it sent, where its tokens came from, what compaction did.
import { el, fmtInt, $ } from "./dom.js";
import { state } from "./state.js";
import { colorFor, describeKey, renderChart } from "./chart.js";

export function selectCall(i) {
  state.selectedCall = i;
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
  const messages = trace.messages.map((m) => el("tr", {},
    el("td", { class: "num", text: m.index }), el("td", { text: m.run ? `${m.count} messages` : m.role }),
    el("td", { text: m.source_id ? `${m.source_kind}:${m.source_id}` : m.source_kind }),
    el("td", { class: "num", text: fmtInt(m.tokens) }), el("td", { class: "muted", text: m.preview || "" })));
  box.replaceChildren(
    el("h3", { text: `Model call ${i + 1}` }), el("div", { class: "stats" }, ...stats.map((s) => el("span", { text: s }))),
    el("h3", { text: "Tokens by source" }),
    el("table", { class: "sources" }, el("tbody", {}, ...rows)),
    el("h3", { text: "Compaction" }),
    decisions.length ? el("div", {}, ...decisions) : el("p", { class: "muted", text: "Nothing was dropped or summarised for this call." }),
    timings.length ? el("h3", { text: "Provider hooks" }) : null,
    timings.length ? el("table", {}, el("tbody", {}, ...timings)) : null,
    el("h3", { text: "Request" }),
    el("table", {}, el("thead", {}, el("tr", {}, el("th", { class: "num", text: "#" }), el("th", { text: "role" }),
      el("th", { text: "source" }), el("th", { class: "num", text: "tokens" }), el("th", { text: "content" }))),
    el("tbody", {}, ...messages)),
    trace.tools.length ? el("p", { class: "muted", text: `tools offered: ${trace.tools.map((t) => `${t.name} (${t.source_id}, ${t.tokens})`).join(", ")}` }) : null);
}
