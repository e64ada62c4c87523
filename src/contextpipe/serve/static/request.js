// The full request of one model call, rebuilt from its stored trace and the session's stored messages.
//
// A stored trace keeps each instruction block whole, but of each message only its id, source, tokens and
// a preview (history runs folded to first and last id): the log holds the messages. Messages a context
// provider added for one call only are not in the log, so of those the preview is all there is.
import { el, fmtInt, prettyArgs } from "./dom.js";
import { api, sessionPath } from "./api.js";
import { state } from "./state.js";

const sourceOf = (kind, id) => (id ? `${kind}:${id}` : kind);

function known() {
  const byId = new Map();
  for (const m of [...state.extra.values(), ...state.messages]) byId.set(m.id, m);
  const summary = state.session && state.session.checkpoint && state.session.checkpoint.summary;
  if (summary) byId.set(summary.id, summary);
  return byId;
}

function neededIds(traces) {
  const ids = [];
  for (const trace of traces) for (const m of trace.messages) ids.push(m.message_id, m.last_message_id);
  return ids.filter(Boolean);
}

/** Fetch older pages of the log until every message `traces` name is known, or the log's start. */
export async function loadMessagesFor(traces) {
  const id = state.current;
  let before = Math.min(state.firstSeq, ...[...state.extra.values()].map((m) => m.seq));
  for (let pages = 0; pages < 50 && before > 1; pages++) {
    const byId = known();
    if (neededIds(traces).every((mid) => byId.has(mid))) return;
    const page = await api(`${sessionPath(id)}/messages?limit=500&before=${before}`);
    if (id !== state.current) return;
    for (const m of page.messages) state.extra.set(m.id, m);
    if (!page.messages.length || !page.has_more) return;
    before = page.first_seq;
  }
}

function partLines(part) {
  if (part.kind === "text") return part.text;
  if (part.kind === "reasoning") return `(reasoning) ${part.text}`;
  if (part.kind === "function_call") return `call ${part.name} (${part.call_id})\n${prettyArgs(part.arguments)}`;
  if (part.kind === "function_result") return `result of ${part.call_id}${part.is_error ? " (error)" : ""}\n${part.result}`;
  if (part.kind === "uri") return `${part.media_type}: ${part.uri}`;
  return `(${part.media_type || part.kind} data)`;
}

function messageItem(entry, message, tokens) {
  const source = sourceOf(entry.source_kind, entry.source_id);
  const head = `${message ? message.role : entry.role} · ${source}`;
  if (!message) {
    const why = entry.source_kind === "context" ? "added for this call only, not stored in the log"
      : "not found in the stored log";
    return { key: `message:${entry.message_id}`, kind: "message", head, tokens, missing: why, role: entry.role,
             source, text: `${entry.preview || ""} …` };
  }
  return { key: `message:${message.id}`, kind: "message", head, tokens, role: message.role, source,
           seq: message.seq, text: message.parts.map(partLines).join("\n") };
}

/** Every instruction block, message and tool of the request `trace` sent, in order, each with a key and its text. */
export function requestItems(trace) {
  const byId = known();
  const items = trace.instructions.map((b, i) => ({
    key: `instructions:${b.source_id}:${i}`, kind: "instructions", head: `instructions · ${b.source_id}`,
    tokens: b.tokens, text: b.text }));
  const ordered = [...byId.values()].filter((m) => m.seq !== undefined).sort((a, b) => a.seq - b.seq);
  for (const entry of trace.messages) {
    if (!entry.run) { items.push(messageItem(entry, byId.get(entry.message_id), entry.tokens)); continue; }
    const first = byId.get(entry.message_id), last = byId.get(entry.last_message_id);
    if (!first || !last) {
      items.push(messageItem({ ...entry, preview: `${entry.count} history messages, not loaded` }, null, entry.tokens));
      continue;
    }
    for (const m of ordered) if (m.seq >= first.seq && m.seq <= last.seq) items.push(messageItem(entry, m, null));
  }
  const definitions = new Map(((state.info.agent || {}).tool_definitions || []).map((t) => [t.name, t]));
  for (const t of trace.tools) {
    const d = t.source_id === "agent" ? definitions.get(t.name) : undefined;
    items.push({ key: `tool:${t.name}`, kind: "tool", head: `tool ${t.name} · ${t.source_id}`, tokens: t.tokens,
                 missing: d ? null : `offered by ${t.source_id}: the trace keeps its name and token count only`,
                 text: d ? `${d.description}\n${JSON.stringify(d.parameters, null, 2)}` : t.name });
  }
  return items;
}

function renderItem(item, i) {
  return el("li", { class: `req ${item.kind}${item.missing ? " missing" : ""}`, "data-key": item.key },
    el("div", { class: "req-head" }, el("span", { class: "muted", text: `${i}` }), el("strong", { text: item.head }),
       item.tokens !== null ? el("span", { class: "muted", text: `${fmtInt(item.tokens)} tokens` }) : null),
    el("pre", { class: "args", text: item.text }),
    item.missing ? el("div", { class: "muted note", text: item.missing }) : null);
}

/** The request section of the call detail: instructions, every message with all its parts, the tools. */
export function renderRequest(trace) {
  const items = requestItems(trace);
  const count = (kind) => items.filter((x) => x.kind === kind).length;
  return [
    el("h3", { text: "Request as sent" }),
    el("p", { class: "muted", text: `${count("instructions")} instruction block(s), ${count("message")} message(s), ` +
      `${count("tool")} tool definition(s)` }),
    el("ol", { class: "request", id: "request" }, ...items.map(renderItem)),
  ];
}
