// Shared state with the official @ag-ui/client: node state.mjs URL KEY THREAD.
// The client starts with a state, a tool of the agent changes it; prints the state events the client
// applied in each run and its state after it, as JSON.
import { HttpAgent } from "@ag-ui/client";

const [url, key, threadId] = process.argv.slice(2);
const agent = new HttpAgent({ url: `${url}/v1/ag-ui`, headers: { "X-API-Key": key }, threadId,
                              initialState: { items: ["milk"], theme: "dark" } });
const runs = [];

async function turn(runId, text) {
  const applied = [];
  agent.addMessage({ id: `u-${runId}`, role: "user", content: text });
  await agent.runAgent({ runId }, {
    onStateSnapshotEvent: ({ event }) => { applied.push(["STATE_SNAPSHOT", event.snapshot]); },
    onStateDeltaEvent: ({ event }) => { applied.push(["STATE_DELTA", event.delta]); },
  });
  runs.push({ applied, state: agent.state });
}

await turn("r1", "add eggs");
await turn("r2", "how many?"); // the client sends the state it holds now
console.log(JSON.stringify(runs));
