// The prompt-cache check of a model call: a badge when the call threw away most of the cached prompt prefix.
// The trace's `cache` is the check (cause, detail, tokens); a `cache_collapsed` change is the run's warning.
import { el, fmtInt } from "./dom.js";

const CAUSES = {
  tools_changed: "tools changed", instructions_changed: "instructions changed", compaction: "compaction",
  history_changed: "history changed",
};

const cause = (check) => CAUSES[check.cause] || check.cause;

function warning(trace) {
  const change = (trace.changes || []).find((c) => c.action === "cache_collapsed");
  return change ? change.items.join("\n") : null;
}

/** What the call lost, in words; null when its prompt cache did not collapse. */
export function cacheLoss(trace) {
  const check = trace.cache;
  if (!(check && check.collapsed)) return warning(trace);
  const cached = check.previous_cached_tokens
    ? `; the ${check.against.replace("_", " ")} had ${fmtInt(check.previous_cached_tokens)} cached tokens (read + written)` : "";
  return `${cause(check)}: ${check.detail}. ${fmtInt(check.lost_tokens)} of ` +
    `${fmtInt(check.previous_tokens)} prefix tokens no longer match${cached}.`;
}

/**
 * A badge naming the cause and the prefix tokens lost (`lost_tokens`: tokens of the previous call's prefix that
 * no longer match, cached or not), for a call whose prompt cache collapsed; else null.
 */
export function cacheBadge(trace) {
  const loss = cacheLoss(trace);
  if (!loss) return null;
  const check = trace.cache && trace.cache.collapsed ? trace.cache : null;
  const text = check ? `cache collapsed: ${cause(check)}, ${fmtInt(check.lost_tokens)} prefix tokens lost`
    : "cache collapsed";
  return el("span", { class: "badge cache", title: warning(trace) || loss, text });
}
