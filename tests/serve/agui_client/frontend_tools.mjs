// A front-end tool with the official @ag-ui/client: node frontend_tools.mjs URL KEY THREAD.
// Run 1 ends with the model's call to the page's tool; the script runs it, adds its result as a tool
// message and runs again: run 2 continues the same exchange. Prints what the client parsed, as JSON.
import { HttpAgent } from "@ag-ui/client";

const [url, key, threadId] = process.argv.slice(2);
const agent = new HttpAgent({ url: `${url}/v1/ag-ui`, headers: { "X-API-Key": key }, threadId });
const tools = [{ name: "user_location", description: "Where the user is, from the browser.",
                 parameters: { type: "object", properties: { precise: { type: "boolean" } } } }];
const page = { user_location: ({ precise }) => (precise ? "Suzhou, 31.3N 120.6E" : "Suzhou") };
const runs = [];

async function run(runId) {
  const events = [];
  let finished = null;
  const { newMessages } = await agent.runAgent({ runId, tools }, {
    onEvent: ({ event }) => { events.push(event.type); },
    onRunFinishedEvent: ({ result, outcome, pendingToolCallIds }) => {
      finished = { result, outcome, pendingToolCallIds };
    },
  });
  runs.push({ events, finished, newMessages });
  return newMessages;
}

agent.addMessage({ id: "u1", role: "user", content: "Where am I?" });
const first = await run("r1");
for (const message of first) {
  for (const call of message.toolCalls ?? []) {  // the page runs the calls it got, and answers each
    const content = page[call.function.name](JSON.parse(call.function.arguments || "{}"));
    agent.addMessage({ id: `result-${call.id}`, role: "tool", toolCallId: call.id, content });
  }
}
await run("r2");
console.log(JSON.stringify({ runs, messages: agent.messages.map((m) => [m.role, m.content ?? null,
  (m.toolCalls ?? []).map((c) => [c.function.name, c.function.arguments])]) }));
