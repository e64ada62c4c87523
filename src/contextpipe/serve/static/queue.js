// The session's queue: user messages waiting for a run (GET .../queue). An `asap` message goes in at the next
// step of the run holding the session (its stream says `message_delivered`); a `next` one gets a run of its own.
import { el, fmtTime, $ } from "./dom.js";
import { api, sessionPath } from "./api.js";
import { state } from "./state.js";

const MODES = {
  asap: "at the next step of the run in flight", next: "in a run of its own once the session is free",
};

export function renderQueue() {
  $("queue").hidden = state.queued.length === 0;
  $("queued").replaceChildren(...state.queued.map((q) => el("li", { "data-id": q.id, "data-when": q.when },
    el("span", { class: `badge when ${q.when}`, title: MODES[q.when] || q.when, text: q.when }),
    el("span", { class: "text", text: q.text }),
    el("span", { class: "muted", text: ` queued ${fmtTime(q.created_at)}` }))));
}

const deliveredIds = new Set();  // so that a 202 answering after the stream said `message_delivered` adds nothing
let changes = 0;  // this page's own changes to the list: a poll answered from before one of them is dropped

/** Take a message the stream says a run delivered off the list (it is in the log now). */
export function delivered(id) {
  deliveredIds.add(id);
  changes += 1;
  state.queued = state.queued.filter((q) => q.id !== id);
  renderQueue();
}

/**
 * Send `text` to `session` while a run holds it: queued `when` ("asap" or "next"), listed at once (if the session is
 * still the one shown). Returns false when the session was free by then and the server ran the input at once
 * instead (the caller refreshes).
 */
export async function enqueue(session, text, when) {
  const answer = await api(`${sessionPath(session)}/runs`, { method: "POST", body: { input: text, queue: when } });
  if (answer.when === undefined) return false;
  if (state.current === session && !deliveredIds.has(answer.id)) {
    changes += 1;
    state.queued = [...state.queued.filter((q) => q.id !== answer.id), answer];
    renderQueue();
  }
  return true;
}

/** Show what is queued for `session` now (the inspector's poll: messages other clients queue, whoever runs). */
export async function pollQueue(session) {
  const before = changes;
  const { queued } = await api(`${sessionPath(session)}/queue`);
  if (state.current !== session || changes !== before) return;
  const shown = queued.filter((q) => !deliveredIds.has(q.id));
  if (shown.map((q) => q.id).join() === state.queued.map((q) => q.id).join()) return;
  state.queued = shown;
  renderQueue();
}
