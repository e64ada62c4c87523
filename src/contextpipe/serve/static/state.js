// The inspector's one mutable state, shared by its modules.

export const TRACE_LIMIT = 200;

export const state = {
  key: null, info: null, sessions: [], cursor: null, query: "", current: null, messages: [], hasOlder: false,
  firstSeq: 0, lastSeq: 0, traces: [], selectedCall: null, streaming: null, colors: new Map(), approvals: [],
  extra: new Map(), loadedFor: null, diffBase: null, queued: [],
};
