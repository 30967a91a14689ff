// The task page's transcript: "show all" for folded outputs, and live updates. Each live event
// (the task's SSE stream) asks the server for the rendered items after the last one shown, so the
// page has one renderer (the server's). New items are appended without moving the reader: when
// the reader is not at the bottom, a "n new events" button offers the jump instead.
(function () {
  "use strict";
  document.addEventListener("click", function (ev) {
    const btn = ev.target.closest("button.show-all");
    if (!btn) return;
    const fold = btn.closest(".fold");
    const open = fold.classList.toggle("expanded");
    btn.setAttribute("aria-expanded", open ? "true" : "false");
    btn.textContent = open ? "Show less" : btn.dataset.label || btn.textContent;
  });
  document.querySelectorAll("button.show-all").forEach(function (b) { b.dataset.label = b.textContent; });

  const box = document.getElementById("transcript");
  if (!box || box.dataset.live !== "yes" || !window.EventSource || !window.fetch) return;
  const pill = document.getElementById("new-events");
  let lastSeq = Number(box.dataset.after || "0");
  let unseen = 0;
  let busy = false;
  let again = false;

  function atBottom() {
    const doc = document.documentElement;
    return window.innerHeight + window.scrollY >= doc.scrollHeight - 48;
  }
  function showPill() {
    if (!pill) return;
    pill.hidden = unseen === 0;
    pill.textContent = unseen + (unseen === 1 ? " new event" : " new events");
  }
  if (pill) {
    pill.addEventListener("click", function () {
      unseen = 0; showPill();
      window.scrollTo(0, document.documentElement.scrollHeight);
      const last = box.lastElementChild;
      if (last) { last.setAttribute("tabindex", "-1"); last.focus({ preventScroll: true }); }
    });
  }
  window.addEventListener("scroll", function () { if (unseen && atBottom()) { unseen = 0; showPill(); } }, { passive: true });

  function refold(item) {
    const fold = item.querySelector(".fold");
    const pre = fold && fold.querySelector("pre");
    if (!pre) return;
    const lines = pre.textContent.split("\n").length;
    if ((lines > 24 || pre.textContent.length > 3000) && !fold.querySelector("button.show-all")) {
      fold.classList.add("long");
      pre.setAttribute("tabindex", "0");  // a box that scrolls is reachable by keyboard
      const b = document.createElement("button");
      b.type = "button"; b.className = "show-all"; b.setAttribute("aria-expanded", "false");
      b.textContent = "Show all"; b.dataset.label = "Show all";
      fold.appendChild(b);
    }
  }
  function sameRun(a, b) { return a && b && a.dataset.run === b.dataset.run; }
  function toolCard(id) {
    return Array.prototype.find.call(box.querySelectorAll(".ti-tool"), function (c) { return c.dataset.toolId === id; });
  }

  // One item into the box: output chunks and system phases merge into the item before them, a
  // tool's result goes into its call's card; anything else is appended. True when it added an item.
  function place(item) {
    const last = box.lastElementChild;
    if (item.classList.contains("ti-output") && last && last.classList.contains("ti-output") &&
        sameRun(last, item) && last.dataset.stream === item.dataset.stream) {
      const pre = last.querySelector("pre");
      item.querySelectorAll(".chunk").forEach(function (c) { pre.appendChild(c); });
      last.dataset.lastSeq = item.dataset.lastSeq;
      refold(last);
      return false;
    }
    if (item.classList.contains("ti-phases") && last && last.classList.contains("ti-phases") && sameRun(last, item)) {
      const line = last.querySelector(".phase-line"), list = last.querySelector(".phase-list");
      item.querySelectorAll(".phase-line > .phase").forEach(function (p) { line.appendChild(p); });
      item.querySelectorAll(".phase-list > li").forEach(function (li) { list.appendChild(li); });
      last.dataset.lastSeq = item.dataset.lastSeq;
      return false;
    }
    const callId = item.dataset.resultFor;
    if (callId) {
      const call = toolCard(callId);
      const slot = call && call.querySelector(".result-slot");
      if (slot && slot.querySelector(".pending-result")) {
        slot.replaceChildren(item.querySelector(".ev-tool_result"));
        call.dataset.lastSeq = item.dataset.lastSeq;
        return false;
      }
    }
    // A tool hook's decision recorded after its call was shown: into the call's card, before the
    // call (pre_tool_use) or after its outcome (post_tool_use).
    const decided = item.dataset.policyFor;
    if (decided) {
      const call = toolCard(decided);
      const slot = call && call.querySelector(item.dataset.policyAt === "before" ? ".policy-before" : ".policy-after");
      if (slot) {
        slot.appendChild(item.querySelector(".policy-line"));
        call.dataset.lastSeq = item.dataset.lastSeq;
        return false;
      }
    }
    box.appendChild(item);
    return true;
  }

  async function pull() {
    if (busy) { again = true; return; }
    busy = true;
    try {
      do {
        again = false;
        const url = box.dataset.fragment + "?after=" + lastSeq + (box.dataset.run ? "&run=" + box.dataset.run : "");
        const r = await fetch(url, { headers: { Accept: "text/html" }, credentials: "same-origin" });
        if (!r.ok) break;
        const next = Number(r.headers.get("X-Last-Seq") || lastSeq);
        const tpl = document.createElement("template");
        tpl.innerHTML = await r.text();
        const follow = atBottom();
        let added = 0;
        Array.prototype.slice.call(tpl.content.children).forEach(function (item) { if (place(item)) added += 1; });
        lastSeq = Math.max(lastSeq, next);
        box.dataset.after = String(lastSeq);
        if (follow) window.scrollTo(0, document.documentElement.scrollHeight);
        else if (added) { unseen += added; showPill(); }
        if (r.headers.get("X-More") === "yes") again = true;
      } while (again);
    } finally { busy = false; }
  }

  const src = new EventSource(box.dataset.events + "?after=" + lastSeq);
  (box.dataset.kinds || "").split(" ").forEach(function (k) { if (k) src.addEventListener(k, pull); });
  src.onmessage = pull;  // kinds this page was not told about still arrive
  // The badge and the line under the title say the same state: a change updates both.
  src.addEventListener("state", function (m) {
    const st = JSON.parse(m.data).state;
    const badge = document.querySelector("h1 span.badge[class*='state-']");
    if (!badge || badge.dataset.state === st) return;
    badge.className = "badge state-" + st; badge.dataset.state = st; badge.textContent = st.replace("_", " ");
    const waiting = document.getElementById("waiting"), text = document.getElementById("waiting-text");
    const line = waiting && waiting.getAttribute("data-when-" + st);
    if (text && line) text.textContent = line;
  });
  // When the task comes to rest the page reloads, to show its new state and forms.
  src.addEventListener("end", function () { src.close(); pull().finally(function () { window.location.reload(); }); });
})();
