// Find in the transcript: highlight every match (case-insensitive) in text, tool arguments and results.
import { $ } from "./dom.js";

const found = { query: "", marks: [], current: -1 };

function clear(root) {
  for (const mark of root.querySelectorAll("mark.hit")) mark.replaceWith(document.createTextNode(mark.textContent));
  root.normalize();
  for (const li of root.querySelectorAll("li.msg.nohit")) li.classList.remove("nohit");
}

function highlight(node, needle) {
  const walker = document.createTreeWalker(node, NodeFilter.SHOW_TEXT);
  const texts = [];
  while (walker.nextNode()) texts.push(walker.currentNode);
  for (const text of texts) {
    const value = text.nodeValue, lower = value.toLowerCase();
    let at = lower.indexOf(needle);
    if (at < 0) continue;
    const pieces = [];
    let from = 0;
    while (at >= 0) {
      pieces.push(document.createTextNode(value.slice(from, at)));
      const mark = document.createElement("mark");
      mark.className = "hit";
      mark.textContent = value.slice(at, at + needle.length);
      pieces.push(mark);
      from = at + needle.length;
      at = lower.indexOf(needle, from);
    }
    pieces.push(document.createTextNode(value.slice(from)));
    text.replaceWith(...pieces);
  }
}

/** Mark the matches of the find box in the transcript (again after every render); `toFirst` jumps to the first. */
export function applyFind(toFirst = false) {
  const root = $("transcript");
  clear(root);
  found.query = $("find").value.trim().toLowerCase();
  found.marks = [];
  found.current = -1;
  if (found.query) {
    for (const li of root.querySelectorAll("li.msg")) {
      for (const part of li.querySelectorAll(".text, pre.args, .name")) highlight(part, found.query);
      if (!li.querySelector("mark.hit") && $("find-only").checked) li.classList.add("nohit");
    }
    found.marks = [...root.querySelectorAll("mark.hit")];
  }
  const n = found.marks.length;
  $("find-count").textContent = found.query ? `${n} match${n === 1 ? "" : "es"}` : "";
  $("find-prev").disabled = $("find-next").disabled = n === 0;
  if (n && toFirst) jump(0);
}

/** Make match `step` away from the current one the current one (wrapping) and scroll to it. */
export function jump(step) {
  const n = found.marks.length;
  if (!n) return;
  if (found.current >= 0) found.marks[found.current].classList.remove("current");
  found.current = found.current < 0 ? 0 : (found.current + step + n) % n;
  const mark = found.marks[found.current];
  mark.classList.add("current");
  mark.scrollIntoView({ block: "center" });
  $("find-count").textContent = `${found.current + 1} of ${n} match${n === 1 ? "" : "es"}`;
}
