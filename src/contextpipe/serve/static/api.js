// The /v1 API: authenticated JSON requests and server-sent events.
import { state } from "./state.js";

export const API = new URL("../v1/", document.baseURI);

export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error && body.error.message) || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

let onUnauthorized = () => {};
/** Set what a 401 answer does (the app asks for a key again). */
export function whenUnauthorized(handler) { onUnauthorized = handler; }

export async function api(path, options = {}) {
  const headers = { Authorization: `Bearer ${state.key}`, ...(options.headers || {}) };
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(new URL(path, API), {
    method: options.method || "GET", headers,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
  });
  if (response.status === 401) { onUnauthorized("That key was not accepted."); throw new ApiError(401, null); }
  if (response.status === 204) return null;
  let body = null;
  try { body = await response.json(); } catch (_) { body = null; }
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}

export const sessionPath = (id) => `sessions/${encodeURIComponent(id)}`;

export async function* sseEvents(response) {
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
