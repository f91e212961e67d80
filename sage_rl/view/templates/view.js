// sage-rl view: one tab at a time, pages parked in <template> until shown, and links that find
// their target wherever it is (another tab, a page not shown yet, a closed <details>).
(function () {
  "use strict";
  const tabs = Array.from(document.querySelectorAll("section.tab"));
  const tabLinks = Array.from(document.querySelectorAll("nav.tabs a"));

  function showTab(tab) {
    for (const t of tabs) t.hidden = t !== tab;
    for (const a of tabLinks) a.classList.toggle("active", a.getAttribute("href") === "#" + tab.id);
  }

  function mount(tpl) {
    document.getElementById(tpl.dataset.host).appendChild(tpl.content.cloneNode(true));
    tpl.remove();
  }

  function showPage(page) {
    const host = page.parentElement;
    for (const p of host.querySelectorAll(":scope > .page")) p.hidden = p !== page;
    const nav = document.querySelector('nav.pager[data-host="' + host.id + '"]');
    if (!nav) return;
    for (const a of nav.querySelectorAll("a")) a.classList.toggle("active", a.getAttribute("href") === "#" + page.id);
  }

  function find(id) {
    const el = document.getElementById(id);
    if (el) return el;
    for (const tpl of document.querySelectorAll("template[data-host]")) {
      if (tpl.content.getElementById(id)) {
        mount(tpl);
        return document.getElementById(id);
      }
    }
    return null;
  }

  function reveal(id, scroll) {
    const el = id && find(id);
    if (!el) return;
    const tab = el.closest("section.tab");
    if (tab) showTab(tab);
    const page = el.closest(".page");
    if (page) showPage(page);
    for (let d = el; d; d = d.parentElement) if (d.tagName === "DETAILS") d.open = true;
    if (!scroll) return;
    if (el === tab) { window.scrollTo(0, 0); return; }
    el.scrollIntoView({ block: "start" });
    el.classList.remove("flash");
    void el.offsetWidth;
    el.classList.add("flash");
  }

  document.addEventListener("click", function (e) {
    const a = e.target.closest('a[href^="#"]');
    if (!a || e.ctrlKey || e.metaKey) return;
    const id = a.getAttribute("href").slice(1);
    e.preventDefault();
    history.pushState(null, "", "#" + id);
    reveal(id, true);
  });
  window.addEventListener("popstate", function () { reveal(location.hash.slice(1), true); });

  const start = location.hash.slice(1);
  showTab(tabs[0]);
  for (const nav of document.querySelectorAll("nav.pager")) {
    const first = document.querySelector("#" + nav.dataset.host + " > .page");
    if (first) showPage(first);
  }
  if (start) reveal(start, true);
})();
