// The transcript: every stored message with its source, model-call markers, compaction and repairs.
import { el, fmtInt, prettyArgs, $ } from "./dom.js";
import { state } from "./state.js";
import { selectCall } from "./calls.js";
import { cacheBadge } from "./cache.js";
import { messageActions, viewOf } from "./steer.js";

export function traceEnd(trace) {
  const last = trace.messages[trace.messages.length - 1];
  return last ? (last.last_message_id || last.message_id) : null;
}

function compactedIn() {
  const marks = new Map();
  state.traces.forEach((trace, i) => {
    for (const d of trace.compaction || []) {
      for (const mid of d.message_ids || []) {
        if (!marks.has(mid)) marks.set(mid, []);
        marks.get(mid).push({ call: i + 1, action: d.action, strategy: d.strategy });
      }
    }
  });
  return marks;
}

function repairedIds() {
  // The run that repairs an interrupted session sends the repair under the source "tool:repair".
  const ids = new Set();
  for (const trace of state.traces) {
    for (const m of trace.messages) if (m.source_kind === "tool" && m.source_id === "repair") ids.add(m.message_id);
  }
  return ids;
}

function isRepair(message, repaired) {
  if (repaired.has(message.id) || (message.source && message.source.source_id === "repair")) return true;
  return message.parts.some((p) => p.kind === "function_result" && /^Error: the call to .* was interrupted/.test(p.result));
}


function renderMessage(message, marks, repaired, view) {
  if (message.rewind_to !== undefined) {  // a rewind marker of the log: shown as the rewind, not as text
    return el("li", { class: "marker rewind", "data-seq": message.seq, "data-id": message.id },
      el("strong", { text: "rewind" }), ` — the messages after #${message.rewind_to} were left out of the view here (#${message.seq}); they stay stored`);
  }
  const source = message.source ? message.source.kind + (message.source.source_id ? `:${message.source.source_id}` : "") : "";
  const badges = [];
  if (source) badges.push(el("span", { class: "badge src", title: "where this message came from", text: source }));
  if (isRepair(message, repaired)) badges.push(el("span", { class: "badge repair", title: "recorded by the repair of an interrupted run", text: "repair" }));
  if (message.rewound) badges.push(el("span", { class: "badge rewound", title: "left out of the view by a rewind: the model no longer sees it", text: "rewound" }));
  const compacted = marks.get(message.id) || [];
  if (compacted.length) {
    const calls = compacted.map((c) => `call ${c.call}`).join(", ");
    badges.push(el("span", { class: "badge compacted", title: compacted.map((c) => `${c.strategy} ${c.action} it before call ${c.call}`).join("\n"),
                             text: `${compacted[0].action} (${calls})` }));
  }
  const body = [];
  for (const part of message.parts) {
    if (part.kind === "text" && part.text) body.push(el("div", { class: "text", text: part.text }));
    else if (part.kind === "reasoning") body.push(el("div", { class: "text muted", text: `(reasoning) ${part.text}` }));
    else if (part.kind === "function_call") {
      const waits = state.approvals.some((p) => p.call_id === part.call_id && p.message_id === message.id);
      body.push(el("div", { class: "call" }, el("span", { class: "muted", text: "calls " }),
        el("span", { class: "name mono", text: part.name }), el("span", { class: "muted mono", text: ` ${part.call_id} ` }),
        waits ? el("span", { class: "badge awaiting", text: "awaiting approval" }) : null,
        el("pre", { class: "args", text: prettyArgs(part.arguments) })));
    } else if (part.kind === "function_result") {
      body.push(el("div", { class: `result${part.is_error ? " is-error" : ""}` },
        el("span", { class: "muted", text: `result of ${part.call_id}` }),
        part.is_error ? el("span", { class: "badge error", text: "error" }) : null,
        el("pre", { class: "args", text: part.result })));
    } else if (part.kind === "uri") body.push(el("div", { class: "text mono", text: `${part.media_type}: ${part.uri}` }));
    else if (part.kind === "data") body.push(el("div", { class: "text muted", text: `(${part.media_type} data)` }));
  }
  const kind = `${compacted.length ? " dropped" : ""}${message.rewound ? " rewound" : ""}`;
  return el("li", { class: `msg ${message.role}${kind}`, "data-seq": message.seq, "data-id": message.id },
    el("div", { class: "msg-head" }, el("span", { class: "role", text: message.role }), ...badges,
       el("span", { class: "seq", text: `#${message.seq}` })), ...body, messageActions(message, view));
}

export function renderTranscript(scroll) {
  const list = $("transcript");
  const marks = compactedIn();
  const repaired = repairedIds();
  const after = new Map();
  state.traces.forEach((trace, i) => {
    const end = traceEnd(trace);
    if (!end) return;
    if (!after.has(end)) after.set(end, []);
    after.get(end).push(i);
  });
  const checkpoint = state.session.checkpoint;
  const items = [];
  const view = viewOf(state.messages);
  for (const message of state.messages) {
    items.push(renderMessage(message, marks, repaired, view));
    if (checkpoint && checkpoint.seq === message.seq) {
      const summary = checkpoint.summary.parts.filter((p) => p.kind === "text").map((p) => p.text).join("\n");
      items.push(el("li", { class: "marker checkpoint" },
        el("strong", { text: "summary checkpoint" }),
        ` — messages up to #${checkpoint.seq} reach the model as this summary (they stay stored):`,
        el("div", { class: "summary", text: summary })));
    }
    for (const i of after.get(message.id) || []) {
      const trace = state.traces[i];
      const usage = trace.usage ? ` · model reported ${fmtInt(trace.usage.input_tokens)} in / ${fmtInt(trace.usage.output_tokens)} out` : "";
      const compaction = (trace.compaction || []).length ? ` · compaction: ${trace.compaction.length} decision(s)` : "";
      items.push(el("li", {
        class: `marker callmark${state.selectedCall === i ? " selected" : ""}`, "data-call": i + 1,
        onclick: () => selectCall(i),
      }, `▸ model call ${i + 1} to ${trace.model}: ${fmtInt(trace.total_tokens)} tokens · ${(trace.latency_s * 1000).toFixed(0)} ms${usage}${compaction} `,
         cacheBadge(trace)));
    }
  }
  list.replaceChildren(...items);
  if (scroll) list.scrollTop = list.scrollHeight;
}
