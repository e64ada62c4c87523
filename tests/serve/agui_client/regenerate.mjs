// Regenerate and edit with the official @ag-ui/client: node regenerate.mjs URL KEY THREAD.
// Two turns; then the history minus the last answer (regenerate); then the last user message edited
// (the history up to it, a new message in its place). Prints each run's answers and the client's messages.
import { HttpAgent } from "@ag-ui/client";

const [url, key, threadId] = process.argv.slice(2);
const agent = new HttpAgent({ url: `${url}/v1/ag-ui`, headers: { "X-API-Key": key }, threadId });
const turns = [];

async function turn(runId) {
  const { newMessages } = await agent.runAgent({ runId });
  turns.push(newMessages.map((m) => m.content));
}

// The history up to the last user message (`keep`: with it), as a chat front end trims it.
function upToLastUser(keep) {
  const last = agent.messages.findLastIndex((m) => m.role === "user");
  return agent.messages.slice(0, keep ? last + 1 : last);
}

agent.addMessage({ id: "u1", role: "user", content: "one" });
await turn("r1");
agent.addMessage({ id: "u2", role: "user", content: "two" });
await turn("r2");
agent.setMessages(upToLastUser(true)); // regenerate the answer to "two"
await turn("r3");
agent.setMessages([...upToLastUser(false), { id: "u2-edited", role: "user", content: "two, edited" }]);
await turn("r4");
console.log(JSON.stringify({ turns, messages: agent.messages.map((m) => [m.role, m.content]) }));
