// A table (or notebook output) wider than its column scrolls inside its own box (labkit-book.css);
// on a phone its last columns are then out of sight. This says so: a box that scrolls gets a cue
// above it ("scroll sideways: more columns →"), updated as the reader scrolls and as the page
// resizes, and a shadow at the edge that hides columns. Added to every page by labkit_theme.py.
(function () {
  "use strict";
  const SELECTOR = ".bd-article .pst-scrollable-table-container, .bd-article .cell_output .output";
  function cue(box) {
    let el = box.previousElementSibling;
    if (!el || !el.classList.contains("lx-scroll-cue")) {
      el = document.createElement("div");
      el.className = "lx-scroll-cue";
      el.setAttribute("aria-hidden", "true");   // the scroll box itself is reachable by keyboard
      box.before(el);
      box.addEventListener("scroll", () => update(box), { passive: true });
      if (!box.hasAttribute("tabindex")) box.setAttribute("tabindex", "0");
    }
    return el;
  }
  function update(box) {
    const hidden = box.scrollWidth - box.clientWidth;
    const scrolls = hidden > 1 && box.querySelector("table");
    box.classList.toggle("lx-scrolls", !!scrolls);
    const prev = box.previousElementSibling;
    if (!scrolls) { if (prev && prev.classList.contains("lx-scroll-cue")) prev.hidden = true; return; }
    const el = cue(box), atEnd = box.scrollLeft >= hidden - 1, atStart = box.scrollLeft <= 1;
    el.hidden = false;
    el.textContent = atEnd ? "← scroll back: more columns" : atStart ? "scroll sideways: more columns →" : "← more columns →";
    box.classList.toggle("lx-more-right", !atEnd);
    box.classList.toggle("lx-more-left", !atStart);
  }
  function all() { document.querySelectorAll(SELECTOR).forEach(update); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", all); else all();
  window.addEventListener("load", all);
  let timer = null;
  window.addEventListener("resize", () => { clearTimeout(timer); timer = setTimeout(all, 100); });
  window.labkitScrollCue = { update: all };
})();
