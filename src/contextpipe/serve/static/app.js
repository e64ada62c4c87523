// contextpipe inspector: plain JavaScript over the /v1 API (no build step, no libraries).
"use strict";

const API = new URL("../v1/", document.baseURI);
const KEY_STORE = "contextpipe.key";
const TRACE_LIMIT = 200;
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

const state = {
  key: null, info: null, sessions: [], cursor: null, query: "", current: null, messages: [], hasOlder: false,
  firstSeq: 0, lastSeq: 0, traces: [], selectedCall: null, streaming: false, colors: new Map(), approvals: [],
};

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const SVG_NS = "http://www.w3.org/2000/svg";
function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, String(value));
  }
  for (const child of children.flat()) if (child) node.append(child);
  return node;
}

function fmtTime(seconds) {
  const d = new Date(seconds * 1000);
  const today = new Date();
  return d.toDateString() === today.toDateString() ? d.toLocaleTimeString() : d.toLocaleString();
}
const fmtInt = (n) => Number(n || 0).toLocaleString("en-US");

// --- API -----------------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error && body.error.message) || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

async function api(path, options = {}) {
  const headers = { Authorization: `Bearer ${state.key}`, ...(options.headers || {}) };
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(new URL(path, API), {
    method: options.method || "GET", headers,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
  });
  if (response.status === 401) { askForKey("That key was not accepted."); throw new ApiError(401, null); }
  if (response.status === 204) return null;
  let body = null;
  try { body = await response.json(); } catch (_) { body = null; }
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}

const sessionPath = (id) => `sessions/${encodeURIComponent(id)}`;

// --- key -----------------------------------------------------------------------------------------

function askForKey(message) {
  localStorage.removeItem(KEY_STORE);
  state.key = null;
  $("main").hidden = true;
  $("keybox").hidden = false;
  $("keyerror").textContent = message || "";
  $("keyinput").focus();
}

async function start() {
  const fromHash = new URLSearchParams(location.hash.slice(1)).get("key");
  if (fromHash) {
    localStorage.setItem(KEY_STORE, fromHash);
    history.replaceState(null, "", location.pathname + location.search);
  }
  state.key = localStorage.getItem(KEY_STORE);
  if (!state.key) { askForKey(); return; }
  try {
    state.info = await api("info");
  } catch (error) {
    if (!(error instanceof ApiError && error.status === 401)) $("keyerror").textContent = String(error.message);
    return;
  }
  $("keybox").hidden = true;
  $("main").hidden = false;
  const agent = state.info.agent;
  $("about").textContent = [
    `tenant ${state.info.tenant}`,
    agent ? `agent ${agent.name || "(unnamed)"} on ${agent.model}` : "read-only",
    `${state.info.store} store`,
  ].join(" · ");
  $("new-session").hidden = state.info.read_only;
  await loadSessions(true);
  const wanted = new URLSearchParams(location.search).get("session");
  if (wanted) await openSession(wanted);
}

// --- sessions ------------------------------------------------------------------------------------

async function loadSessions(reset) {
  if (reset) { state.sessions = []; state.cursor = null; }
  const params = new URLSearchParams({ limit: "50" });
  if (state.cursor) params.set("cursor", state.cursor);
  if (state.query) params.set("q", state.query);
  const page = await api(`sessions?${params}`);
  state.sessions.push(...page.sessions);
  state.cursor = page.next_cursor;
  renderSessions();
}

function renderSessions() {
  const list = $("sessions");
  list.replaceChildren(...state.sessions.map((s) => el("li", {
    class: state.current === s.id ? "selected" : "", "data-session": s.id, onclick: () => openSession(s.id),
  }, el("div", { class: "sid", text: s.id }),
     el("div", { class: "sub", text: `${s.message_count} messages · ${fmtTime(s.updated_at)}` }))));
  $("more-sessions").hidden = !state.cursor;
  $("sessions-empty").hidden = state.sessions.length > 0;
  $("sessions-empty").textContent = state.query ? `No session matches “${state.query}”.` : "No sessions yet.";
}

async function newSession() {
  const created = await api("sessions", { method: "POST", body: {} });
  await loadSessions(true);
  await openSession(created.id);
  $("chat-input").focus();
}

// --- one session ---------------------------------------------------------------------------------

async function openSession(id) {
  state.current = id;
  state.selectedCall = null;
  const url = new URL(location.href);
  url.searchParams.set("session", id);
  history.replaceState(null, "", url);
  renderSessions();
  $("placeholder").hidden = true;
  $("session").hidden = false;
  $("chat").hidden = state.info.read_only;
  $("chat-error").textContent = "";
  $("run-result").hidden = true;
  await refreshSession();
}

async function refreshSession() {
  const id = state.current;
  if (!id) return;
  let session, page, traces, approvals;
  try {
    [session, page, traces, approvals] = await Promise.all([
      api(sessionPath(id)), api(`${sessionPath(id)}/messages?limit=200`), api(`${sessionPath(id)}/traces?limit=${TRACE_LIMIT}`),
      api(`${sessionPath(id)}/approvals`),
    ]);
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) {
      $("session-title").textContent = id;
      $("session-meta").textContent = "This session does not exist (any more).";
      $("transcript").replaceChildren();
      state.approvals = [];
      renderApprovals();
      return;
    }
    throw error;
  }
  if (id !== state.current) return;
  state.session = session;
  state.messages = page.messages;
  state.firstSeq = page.first_seq;
  state.hasOlder = page.has_more;
  state.lastSeq = page.messages.length ? page.messages[page.messages.length - 1].seq : 0;
  const followLatest = state.selectedCall === null || state.selectedCall === state.traces.length - 1;
  state.traces = traces.traces;
  state.approvals = approvals.pending_approvals;
  if (followLatest || state.selectedCall >= state.traces.length) {
    state.selectedCall = state.traces.length ? state.traces.length - 1 : null;
  }
  render();
}

async function loadOlder() {
  const page = await api(`${sessionPath(state.current)}/messages?limit=200&before=${state.firstSeq}`);
  state.messages = [...page.messages, ...state.messages];
  state.firstSeq = page.first_seq;
  state.hasOlder = page.has_more;
  render(false);
}

function render(scroll = true) {
  const s = state.session;
  $("session-title").textContent = s.id;
  const calls = state.traces.length;
  $("session-meta").textContent = `${state.lastSeq} messages · version ${s.version} · ${calls} model call` +
    `${calls === 1 ? "" : "s"} traced${calls >= TRACE_LIMIT ? " (the newest)" : ""} · created ${fmtTime(s.created_at)}`;
  $("older").hidden = !state.hasOlder;
  renderTranscript(scroll);
  renderApprovals();
  renderChart();
  renderCallDetail();
}

// --- transcript ----------------------------------------------------------------------------------

function traceEnd(trace) {
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

function prettyArgs(text) {
  try { return JSON.stringify(JSON.parse(text), null, 2); } catch (_) { return text; }
}

function renderMessage(message, marks, repaired) {
  const source = message.source ? message.source.kind + (message.source.source_id ? `:${message.source.source_id}` : "") : "";
  const badges = [];
  if (source) badges.push(el("span", { class: "badge src", title: "where this message came from", text: source }));
  if (isRepair(message, repaired)) badges.push(el("span", { class: "badge repair", title: "recorded by the repair of an interrupted run", text: "repair" }));
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
  return el("li", { class: `msg ${message.role}${compacted.length ? " dropped" : ""}`, "data-seq": message.seq, "data-id": message.id },
    el("div", { class: "msg-head" }, el("span", { class: "role", text: message.role }), ...badges,
       el("span", { class: "seq", text: `#${message.seq}` })), ...body);
}

function renderTranscript(scroll) {
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
  for (const message of state.messages) {
    items.push(renderMessage(message, marks, repaired));
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
      }, `▸ model call ${i + 1} to ${trace.model}: ${fmtInt(trace.total_tokens)} tokens · ${(trace.latency_s * 1000).toFixed(0)} ms${usage}${compaction}`));
    }
  }
  list.replaceChildren(...items);
  if (scroll) list.scrollTop = list.scrollHeight;
}

// --- approvals ----------------------------------------------------------------------------------

function renderApprovals() {
  const box = $("approvals");
  box.hidden = state.approvals.length === 0;
  $("pending").replaceChildren(...state.approvals.map((pending) => {
    const reason = el("input", { type: "text", class: "reason", placeholder: "Reason for a rejection (optional)",
                                 "aria-label": `Reason for rejecting ${pending.call_id}` });
    const decide = (decision) => () => {
      const body = { decision, digest: pending.digest };
      if (decision === "reject" && reason.value.trim()) body.reason = reason.value.trim();
      return resume(pending, body);
    };
    return el("li", { "data-call-id": pending.call_id },
      el("div", {}, el("span", { class: "name mono", text: pending.tool_name }),
         el("span", { class: "muted mono", text: ` ${pending.call_id}` })),
      el("pre", { class: "args", text: prettyArgs(pending.arguments) }),
      el("div", { class: "why", text: pending.why }),
      state.info.read_only ? el("div", { class: "muted", text: "Read-only: decide on the agent's server." }) :
        el("div", { class: "decide" }, reason,
           el("button", { type: "button", class: "approve", onclick: decide("approve"), text: "Approve" }),
           el("button", { type: "button", class: "reject", onclick: decide("reject"), text: "Reject" })));
  }));
}

async function resume(pending, decision) {
  if (state.streaming) return;
  for (const button of $("pending").querySelectorAll("button")) button.disabled = true;
  const verb = decision.decision === "approve" ? "Approved" : "Rejected";
  const result = await streamRun("approvals", { decisions: { [pending.call_id]: decision }, stream: true, wait: 5 },
                                 `${verb} ${pending.tool_name} (${pending.call_id})`);
  if (result) showResult(result);
}

function showResult(result) {
  const waiting = result.pending_approvals.length;
  $("run-result").textContent = result.stop_reason === "approval_required"
    ? `The run stopped again: ${waiting} call${waiting === 1 ? "" : "s"} await approval.`
    : `The run ${result.stop_reason === "completed" ? "completed" : `stopped (${result.stop_reason})`}: ${result.text}`;
  $("run-result").hidden = false;
}

// --- chart ---------------------------------------------------------------------------------------

function category(key) { return key.split(":")[0]; }

function colorFor(key) {
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

function describeKey(key) {
  const [cat, ...rest] = key.split(":");
  const id = rest.join(":");
  return id ? `${CATEGORY_LABEL[cat] || cat}: ${id}` : (CATEGORY_LABEL[cat] || cat);
}

function renderChart() {
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
    const g = svg("g", { class: `call${state.selectedCall === i ? " selected" : ""}`, "data-call": i + 1, onclick: () => selectCall(i) },
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

function selectCall(i) {
  state.selectedCall = i;
  renderChart();
  renderCallDetail();
  for (const node of document.querySelectorAll(".marker.callmark")) {
    node.classList.toggle("selected", Number(node.dataset.call) === i + 1);
  }
}

function renderCallDetail() {
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

// --- chat (streamed run) -------------------------------------------------------------------------

async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let name = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) name = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      if (data) yield { name, data: JSON.parse(data) };
    }
  }
}

function send(text) {
  return streamRun("runs", { input: text, stream: true, wait: 5 }, text, "input");
}

// Streams a run (POST sessions/{id}/`route` with `body`), showing `shown` as its first line; returns its result.
async function streamRun(route, body, shown, badge = "decision") {
  const id = state.current;
  let result = null;
  state.streaming = true;
  $("live").hidden = false;
  $("chat-send").disabled = true;
  $("chat-error").textContent = "";
  $("run-result").hidden = true;
  const list = $("transcript");
  const role = route === "runs" ? "user" : "decision";
  list.append(el("li", { class: `msg ${role} streaming` }, el("div", { class: "msg-head" }, el("span", { class: "role", text: role }),
    el("span", { class: "badge src", text: badge })), el("div", { class: "text", text: shown })));
  const live = el("li", { class: "msg assistant streaming", id: "streaming" },
    el("div", { class: "msg-head" }, el("span", { class: "role", text: "assistant" }), el("span", { class: "badge src", text: "streaming…" })));
  let textNode = null;
  list.append(live);
  list.scrollTop = list.scrollHeight;
  try {
    const response = await fetch(new URL(`${sessionPath(id)}/${route}`, API), {
      method: "POST",
      headers: { Authorization: `Bearer ${state.key}`, "Content-Type": "application/json", Accept: "text/event-stream" },
      body: JSON.stringify(body),
    });
    if (!response.ok) {
      let body = null;
      try { body = await response.json(); } catch (_) { body = null; }
      throw new ApiError(response.status, body);
    }
    for await (const event of sseEvents(response)) {
      if (event.name === "text_delta") {
        if (!textNode) { textNode = el("div", { class: "text" }); live.append(textNode); }
        textNode.textContent += event.data.text;
      } else if (event.name === "tool_call_started") {
        textNode = null;
        live.append(el("div", { class: "call" }, el("span", { class: "muted", text: "calls " }),
          el("span", { class: "name mono", text: event.data.name }), el("pre", { class: "args", text: prettyArgs(event.data.arguments) })));
      } else if (event.name === "tool_call_finished") {
        live.append(el("div", { class: `result${event.data.is_error ? " is-error" : ""}` },
          el("span", { class: "muted", text: `${event.data.name} returned` }), el("pre", { class: "args", text: event.data.result })));
      } else if (event.name === "done") {
        result = event.data;
      } else if (event.name === "error") {
        $("chat-error").textContent = `The run failed: ${event.data.error.message}`;
      }
      list.scrollTop = list.scrollHeight;
    }
  } catch (error) {
    const kind = error.body && error.body.error ? error.body.error.type : null;
    $("chat-error").textContent = kind === "SessionBusy" ? "This session is busy with another run; try again in a moment." : `Could not run: ${error.message}`;
  } finally {
    state.streaming = false;
    $("live").hidden = true;
    $("chat-send").disabled = false;
  }
  if (state.current === id) await refreshSession();
  loadSessions(true);
  return result;
}

// --- live updates from other clients -------------------------------------------------------------

async function poll() {
  if (!state.current || state.streaming || document.visibilityState !== "visible" || !state.key) return;
  try {
    const page = await api(`${sessionPath(state.current)}/messages?limit=1&after=${state.lastSeq}`);
    if (page.messages.length) {
      $("live").hidden = false;
      await refreshSession();
      setTimeout(() => { if (!state.streaming) $("live").hidden = true; }, 1500);
    }
  } catch (_) { /* the next poll tries again */ }
}

// --- wiring --------------------------------------------------------------------------------------

$("keyform").addEventListener("submit", (event) => {
  event.preventDefault();
  const key = $("keyinput").value.trim();
  if (!key) return;
  localStorage.setItem(KEY_STORE, key);
  $("keyinput").value = "";
  start();
});
let searchTimer = null;
$("search").addEventListener("input", () => {
  clearTimeout(searchTimer);
  searchTimer = setTimeout(() => { state.query = $("search").value.trim(); loadSessions(true); }, 200);
});
$("more-sessions").addEventListener("click", () => loadSessions(false));
$("new-session").addEventListener("click", () => newSession().catch((e) => { $("chat-error").textContent = e.message; }));
$("older").addEventListener("click", () => loadOlder());
$("chat").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("chat-input").value.trim();
  if (!text || state.streaming) return;
  $("chat-input").value = "";
  send(text);
});
$("chat-input").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); $("chat").requestSubmit(); }
});
setInterval(poll, 3000);
start();
