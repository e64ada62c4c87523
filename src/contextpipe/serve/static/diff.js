// What changed between the requests of two model calls: items added and removed, changed text line by line.
import { el } from "./dom.js";
import { requestItems } from "./request.js";

/** Longest-common-subsequence alignment of `a` and `b` by `same`: a list of ["same"|"del"|"add", x, y]. */
export function align(a, b, same) {
  const n = a.length, m = b.length;
  const table = Array.from({ length: n + 1 }, () => new Int32Array(m + 1));
  for (let i = n - 1; i >= 0; i--) {
    for (let j = m - 1; j >= 0; j--) {
      table[i][j] = same(a[i], b[j]) ? table[i + 1][j + 1] + 1 : Math.max(table[i + 1][j], table[i][j + 1]);
    }
  }
  const out = [];
  let i = 0, j = 0;
  while (i < n && j < m) {
    if (same(a[i], b[j])) { out.push(["same", a[i], b[j]]); i++; j++; }
    else if (table[i + 1][j] >= table[i][j + 1]) out.push(["del", a[i++], null]);
    else out.push(["add", null, b[j++]]);
  }
  while (i < n) out.push(["del", a[i++], null]);
  while (j < m) out.push(["add", null, b[j++]]);
  return out;
}

/** Past this many line pairs the LCS table would cost too much memory: the text is shown removed, then added. */
const MAX_CELLS = 4_000_000;

function lineDiff(before, after) {
  const a = before.split("\n"), b = after.split("\n");
  const ops = a.length * b.length > MAX_CELLS
    ? [...a.map((x) => ["del", x, null]), ...b.map((y) => ["add", null, y])]
    : align(a, b, (x, y) => x === y);
  return ops.map(([op, x, y]) =>
    el("div", { class: `line ${op}`, text: `${op === "add" ? "+" : op === "del" ? "-" : " "} ${op === "add" ? y : x}` }));
}

/** The diff of call `from`'s request to call `to`'s, as list items (unchanged runs folded to a count). */
export function renderDiff(from, to) {
  const rows = [];
  let unchanged = 0;
  const flush = () => {
    if (unchanged) rows.push(el("li", { class: "diff same", text: `${unchanged} unchanged` }));
    unchanged = 0;
  };
  for (const [op, a, b] of align(requestItems(from), requestItems(to), (x, y) => x.key === y.key)) {
    if (op === "same" && a.text === b.text) { unchanged++; continue; }
    flush();
    const item = b || a;
    const kind = op === "same" ? "changed" : op === "add" ? "added" : "removed";
    const body = op === "same" ? el("div", { class: "lines" }, ...lineDiff(a.text, b.text))
      : el("pre", { class: "args", text: item.text });
    rows.push(el("li", { class: `diff ${kind}`, "data-key": item.key },
      el("div", { class: "req-head" }, el("span", { class: "badge", text: kind }), el("strong", { text: item.head })), body));
  }
  flush();
  return rows;
}
