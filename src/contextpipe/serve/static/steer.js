// Steering a conversation from its transcript: rewind to a message, fork from it, regenerate the last reply.
// Each is a request to the /v1 API (POST .../rewind, POST .../fork, a rewind and a resumed run); nothing is
// deleted: the log keeps the rewound messages, and the transcript shows them struck through.
import { el, $ } from "./dom.js";
import { api, sessionPath } from "./api.js";
import { state } from "./state.js";

let hooks = { run: async () => null, open: async () => {}, refresh: async () => {}, sessions: async () => {}, done: () => {} };
/**
 * Set what the actions call back into: the app's streamed run, opening and refreshing a session, the list, and
 * what to do once an action ends (the chat's mode).
 */
export function whenSteering(given) { hooks = given; }

// Says `text` of `session`, prefixed "In `session`:" when another one is shown by then.
function say(text, session = state.current) {
  $("run-result").textContent = state.current === session ? text : `In ${session}: ${text}`;
  $("run-result").hidden = false;
}

let busy = false;  // an action is in flight (until its end, Regenerate's run included): a second click does nothing

/** Whether a steering action is in flight: the chat and the approvals start no run meanwhile (its rewind comes first). */
export function steering() {
  return busy;
}

/** Disable the buttons (the transcript's `steering` class) while an action is in flight or a run streams. */
export function markSteering() {
  $("transcript").classList.toggle("steering", busy || Boolean(state.streaming));
}

function act(what, action) {
  return async (event) => {
    event.stopPropagation();
    if (busy || state.streaming) return;
    const session = state.current;  // (named in an error shown while another session is)
    busy = true;
    markSteering();
    $("session-error").textContent = "";
    try {
      await action();
    } catch (error) {
      const said = `Could not ${what}: ${error.message}`;  // the server's own message
      $("session-error").textContent = state.current === session ? said : `In ${session}: ${said}`;
    } finally {
      busy = false;
      markSteering();
      hooks.done();
    }
  };
}

async function rewindTo(seq) {
  const session = state.current;
  const kept = await api(`${sessionPath(session)}/rewind`, { method: "POST", body: { to: seq } });
  if (state.current === session) await hooks.refresh();
  say(`Rewound: the messages after #${kept.to} are left out of what the model sees (they stay stored).`, session);
}

async function forkAt(seq) {
  const from = state.current;
  const forked = await api(`${sessionPath(from)}/fork`, { method: "POST", body: { at: seq } });
  await hooks.sessions();
  await hooks.open(forked.id);
  say(`Forked from ${from}.`, forked.id);  // the server may move the point back to before a tool exchange
}

async function regenerate(reply, userSeq) {
  const session = state.current;  // its run goes to this session, even if another is opened during the rewind
  await api(`${sessionPath(session)}/rewind`, { method: "POST", body: { to: userSeq } });
  if (state.current === session) await hooks.refresh();  // the old reply shows struck through while the new one streams
  await hooks.run("runs", { input: null, stream: true, wait: 5 }, `Regenerate the reply #${reply.seq}`, "regenerate", session);
}

/** Tell whether `message` is a tool's late result: a user message that is not the user's (`is_late_result`). */
const isLateResult = (message) => Boolean(message.metadata && "late_result" in message.metadata);

/** The messages the model sees: the view, without the rewound ones. */
export function viewOf(messages) { return messages.filter((m) => !m.rewound); }

/**
 * The buttons of a message of the view: Rewind to here (disabled on the view's last, so that the buttons keep
 * their places when a rewind makes a message the last), Fork from here, and Regenerate on the view's last
 * message when it is an assistant reply to a user message. None when read-only.
 */
export function messageActions(message, view) {
  if (state.info.read_only || message.rewound) return null;
  const last = view[view.length - 1];
  const buttons = [];
  const title = message === last ? "This is the view's last message" : `Leave the messages after #${message.seq} out of the view`;
  buttons.push(el("button", { type: "button", class: "plain rewind", title, disabled: message === last,
                              onclick: act("rewind", () => rewindTo(message.seq)), text: "Rewind to here" }));
  buttons.push(el("button", { type: "button", class: "plain fork", title: `Start a new session with the view up to #${message.seq}`,
                              onclick: act("fork", () => forkAt(message.seq)), text: "Fork from here" }));
  // The user message it answers, as the server's `last_user_seq` picks it (a late result is a tool's output).
  const user = view.filter((m) => m.role === "user" && !isLateResult(m) && m.seq < message.seq).pop();
  if (message === last && message.role === "assistant" && user) {
    buttons.push(el("button", { type: "button", class: "plain regenerate", title: `Rewind to #${user.seq} and run again`,
                                onclick: act("regenerate", () => regenerate(message, user.seq)), text: "Regenerate" }));
  }
  return el("span", { class: "steer" }, ...buttons);
}
