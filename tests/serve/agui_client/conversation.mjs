// Drives a contextpipe AG-UI endpoint with the official @ag-ui/client: node conversation.mjs URL KEY THREAD.
// Two turns, then the same history again; prints the client's messages as JSON.
import { HttpAgent } from "@ag-ui/client";

const [url, key, threadId] = process.argv.slice(2);
const agent = new HttpAgent({ url: `${url}/v1/ag-ui`, headers: { "X-API-Key": key }, threadId });
const turns = [];

async function turn(runId) {
  const { newMessages } = await agent.runAgent({ runId });
  turns.push(newMessages.map((m) => m.content));
}

agent.addMessage({ id: "u1", role: "user", content: "one" });
await turn("r1");
agent.addMessage({ id: "u2", role: "user", content: "two" });
await turn("r2");
await turn("r3"); // the same history again: answered from the log
console.log(JSON.stringify({ turns, messages: agent.messages.map((m) => [m.role, m.content]) }));
