// contextpipe inspector: plain JavaScript modules over the /v1 API (no build step, no libraries).
import { $, el, fmtTime, prettyArgs } from "./dom.js";
import { API, ApiError, api, sessionPath, sseEvents, whenUnauthorized } from "./api.js";
import { state, TRACE_LIMIT } from "./state.js";
import { renderTranscript } from "./transcript.js";
import { renderChart } from "./chart.js";
import { renderCallDetail, selectCall } from "./calls.js";
import { applyFind, jump } from "./find.js";
import { delivered, enqueue, pollQueue, renderQueue } from "./queue.js";
import { markSteering, steering, whenSteering } from "./steer.js";

const KEY_STORE = "contextpipe.key";

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
  state.extra = new Map();
  state.loadedFor = null;
  state.diffBase = null;
  const url = new URL(location.href);
  url.searchParams.set("session", id);
  history.replaceState(null, "", url);
  renderSessions();
  $("placeholder").hidden = true;
  $("session").hidden = false;
  $("chat").hidden = state.info.read_only;
  $("chat-error").textContent = "";
  $("session-error").textContent = "";
  $("run-result").hidden = true;
  $("delete-session").hidden = state.info.read_only;
  chatMode();
  await refreshSession();
}

async function refreshSession() {
  const id = state.current;
  if (!id) return;
  let session, page, traces, approvals, queue;
  try {
    [session, page, traces, approvals, queue] = await Promise.all([
      api(sessionPath(id)), api(`${sessionPath(id)}/messages?limit=200`), api(`${sessionPath(id)}/traces?limit=${TRACE_LIMIT}`),
      api(`${sessionPath(id)}/approvals`), api(`${sessionPath(id)}/queue`),
    ]);
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) {
      $("session-title").textContent = id;
      $("session-meta").textContent = "This session does not exist (any more).";
      $("transcript").replaceChildren();
      state.approvals = [];
      state.queued = [];
      renderApprovals();
      renderQueue();
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
  state.queued = queue.queued;
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
  applyFind();
  renderApprovals();
  renderQueue();
  renderChart(selectCall);
  renderCallDetail();
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
  if (state.streaming || steering()) return;
  const id = state.current;
  for (const button of $("pending").querySelectorAll("button")) button.disabled = true;
  const verb = decision.decision === "approve" ? "Approved" : "Rejected";
  const result = await streamRun("approvals", { decisions: { [pending.call_id]: decision }, stream: true, wait: 5 },
                                 `${verb} ${pending.tool_name} (${pending.call_id})`, "decision", id);
  if (result) showResult(result, id);
}

// Says how the run in session `id` ended, prefixed "In `id`:" when another session is shown by then.
function showResult(result, id) {
  const waiting = result.pending_approvals.length;
  const said = result.stop_reason === "approval_required"
    ? `The run stopped again: ${waiting} call${waiting === 1 ? "" : "s"} await approval.`
    : `The run ${result.stop_reason === "completed" ? "completed" : `stopped (${result.stop_reason})`}: ${result.text}`;
  $("run-result").textContent = state.current === id ? said : `In ${id}: ${said}`;
  $("run-result").hidden = false;
}

// --- chat (streamed run) -------------------------------------------------------------------------

function send(text) {
  return streamRun("runs", { input: text, stream: true, wait: 5 }, text, "input");
}

// While a run streams in the session shown, a message sent is queued (`queue.js`): Send becomes Queue. While it streams
// in another session, Send waits (one streamed run at a time), so nothing goes to a session other than the one meant.
// Stop names the session whose run it cancels when another one is shown.
function chatMode() {
  const queueing = state.streaming !== null && state.streaming === state.current;
  const elsewhere = state.streaming !== null && !queueing;
  $("chat-send").textContent = queueing ? "Queue" : "Send";
  $("chat-send").disabled = elsewhere;
  $("chat-queue").hidden = !queueing;
  $("stop").textContent = elsewhere ? `Stop the run in ${state.streaming}` : "Stop";
  const why = waitReason();
  if (why === null) clearNotice();
  else if (showsNotice()) notSent(why);  // (its reason changed: Regenerate's rewind became its run, say)
}

// Why the chat sends nothing now, or null: a steering action while no run of it streams (e.g. Regenerate's rewind:
// no run of the chat's own meanwhile), or a run streaming in another session.
function waitReason() {
  if (steering() && !state.streaming) return "a rewind, fork or regenerate is in progress";
  if (state.streaming && state.streaming !== state.current) return `a run streams in ${state.streaming}`;
  return null;
}

// The chat's "Not sent" notice (the text stays in the box). It is cleared once its reason ends, but only while it is
// what the box shows: `dataset.notice` holds its text, so an error shown since stays.
function notSent(reason) {
  const box = $("chat-error");
  box.textContent = `Not sent: ${reason}. Your message stays here; send it once that ends.`;
  box.dataset.notice = box.textContent;
}

function showsNotice() {
  const box = $("chat-error");
  return box.dataset.notice !== undefined && box.textContent === box.dataset.notice;
}

function clearNotice() {
  if (showsNotice()) $("chat-error").textContent = "";
  delete $("chat-error").dataset.notice;
}

// Streams a run (POST sessions/`id`/`route` with `body`), showing `shown` as its first line; returns its result.
// The live lines go to the transcript only while it shows `id` (Regenerate's session may no longer be the one shown);
// an error is said in the chat of whichever session is shown, prefixed "In `id`:" when that is another one.
async function streamRun(route, body, shown, badge = "decision", id = state.current) {
  let result = null;
  const fail = (text) => { $("chat-error").textContent = state.current === id ? text : `In ${id}: ${text}`; };
  if (!showsNotice()) $("chat-error").textContent = "";  // (a notice stays while its reason does: chatMode says)
  state.streaming = id;
  markSteering();
  chatMode();
  $("live").hidden = false;
  $("stop").hidden = state.info.read_only;
  $("run-result").hidden = true;
  const list = state.current === id ? $("transcript") : el("ol");  // (a detached list: another session is shown)
  const role = badge === "input" ? "user" : "decision";
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
      } else if (event.name === "message_delivered") {
        delivered(event.data.message.id);
      } else if (event.name === "done") {
        result = event.data;
      } else if (event.name === "error") {
        fail(`The run failed: ${event.data.error.message}`);
      }
      list.scrollTop = list.scrollHeight;
    }
  } catch (error) {
    const kind = error.body && error.body.error ? error.body.error.type : null;
    fail(kind === "SessionBusy" ? "The session is busy with another run; try again in a moment." : `Could not run: ${error.message}`);
  } finally {
    state.streaming = null;
    markSteering();
    chatMode();
    $("live").hidden = true;
    $("stop").hidden = true;
  }
  if (state.current === id) await refreshSession();
  loadSessions(true);
  return result;
}

// --- export, delete, stop ----------------------------------------------------------------------

function showError(error) { $("session-error").textContent = error.message; }

async function exportSession(format) {
  const id = state.current;
  const response = await fetch(new URL(`${sessionPath(id)}/export?format=${format}`, API),
                               { headers: { Authorization: `Bearer ${state.key}` } });
  if (!response.ok) {
    let body = null;
    try { body = await response.json(); } catch (_) { body = null; }
    throw new ApiError(response.status, body);
  }
  const named = /filename="?([^";]+)"?/.exec(response.headers.get("Content-Disposition") || "");
  const name = named ? named[1] : `${id.replaceAll("/", "_")}.${format === "json" ? "json" : "md"}`;
  const link = el("a", { href: URL.createObjectURL(await response.blob()), download: name, hidden: true });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 60_000);
  $("session-error").textContent = "";
}

async function deleteSession() {
  const id = state.current;
  if (!confirm(`Delete the session “${id}” and all its messages? This cannot be undone.`)) return;
  await api(sessionPath(id), { method: "DELETE" });
  state.current = null;
  const url = new URL(location.href);
  url.searchParams.delete("session");
  history.replaceState(null, "", url);
  $("session").hidden = true;
  $("placeholder").hidden = false;
  await loadSessions(true);
}

async function stopRun() {
  const id = state.streaming || state.current;  // the run streaming
  $("stop").disabled = true;
  try {
    await api(`${sessionPath(id)}/cancel`, { method: "POST" });
    $("run-result").textContent = state.current === id ? "Stopping the run…" : `Stopping the run in ${id}…`;
    $("run-result").hidden = false;
  } catch (error) {
    $("session-error").textContent = state.current === id ? error.message : `In ${id}: ${error.message}`;
  } finally {
    $("stop").disabled = false;
  }
}

// --- live updates from other clients -------------------------------------------------------------

async function poll() {
  if (!state.current || document.visibilityState !== "visible" || !state.key) return;
  try {
    await pollQueue(state.current);  // (what other clients queued, during any run)
    if (state.streaming) return;
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
$("export-json").addEventListener("click", () => exportSession("json").catch(showError));
$("export-markdown").addEventListener("click", () => exportSession("markdown").catch(showError));
$("delete-session").addEventListener("click", () => deleteSession().catch(showError));
$("stop").addEventListener("click", () => stopRun());  // (it shows its own errors)
$("find").addEventListener("input", () => applyFind(true));
$("find-only").addEventListener("change", () => applyFind(true));
$("find-next").addEventListener("click", () => jump(1));
$("find-prev").addEventListener("click", () => jump(-1));
$("find").addEventListener("keydown", (event) => {
  if (event.key === "Enter") { event.preventDefault(); jump(event.shiftKey ? -1 : 1); }
});
$("chat").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("chat-input").value.trim();
  if (!text) return;
  const wait = waitReason();
  if (wait) { notSent(wait); return; }
  $("chat-input").value = "";
  if (!state.streaming) { send(text); return; }
  const session = state.streaming;
  // (only the enqueue's failure puts the text back: a refresh failing after the server took it must not invite a resend)
  enqueue(session, text, $("chat-queue").value).then((queued) => queued || state.current !== session || refreshSession(),
    (error) => {
      if (state.current !== session) {  // (the box now sends to the session shown: the text is said, not put back)
        $("chat-error").textContent = `In ${session}: Could not queue “${text}”: ${error.message}`;
        return;
      }
      $("chat-error").textContent = `Could not queue: ${error.message}`;
      if (!$("chat-input").value) $("chat-input").value = text;  // the text is not lost: send it again
    });
});
$("chat-input").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); $("chat").requestSubmit(); }
});
whenUnauthorized(askForKey);
whenSteering({ run: streamRun, open: openSession, refresh: refreshSession, sessions: () => loadSessions(true), done: chatMode });
setInterval(poll, 3000);
start();
