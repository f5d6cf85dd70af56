// The svc dashboard's one script. Live parts follow the event stream: the
// events page adds a row per event (newest first, the last 200), and pages
// marked data-refresh reload their content (at most every 2 s) when events
// arrive. Streams close while the tab is hidden and go on from the last
// event seen when it shows again. Text goes in as text; reloaded content is
// the server's own escaped page.
"use strict";

function follow(url, onEvent, element) {
  let last = null;
  let source = null;
  const start = () => {
    if (source) return;
    element.dataset.following = "yes";
    const from = last ? (url.includes("?") ? "&" : "?") + "after=" + encodeURIComponent(last) : "";
    source = new EventSource(url + from);
    source.onmessage = (event) => {
      if (event.lastEventId) last = event.lastEventId;
      onEvent(event);
    };
  };
  const stop = () => {
    if (source) source.close();
    source = null;
    element.dataset.following = "no";
  };
  document.addEventListener("visibilitychange", () => (document.hidden ? stop() : start()));
  if (!document.hidden) start();
}

function liveTail(table) {
  const rows = table.querySelector("tbody");
  follow(table.dataset.stream, (event) => {
    let envelope;
    try { envelope = JSON.parse(event.data); } catch (_) { return; }
    const row = document.createElement("tr");
    for (const text of [envelope.time || "", envelope.type || "", envelope.subject || ""]) {
      const cell = document.createElement("td");
      cell.textContent = text;
      row.appendChild(cell);
    }
    rows.insertBefore(row, rows.firstChild);
    while (rows.children.length > 200) rows.removeChild(rows.lastChild);
  }, table);
}

function refreshing(main) {
  let pending = false;
  const refresh = async () => {
    pending = false;
    // Not while someone is typing in a form of the page.
    if (main.contains(document.activeElement) && document.activeElement.matches("input, select")) return;
    const response = await fetch(location.href, { credentials: "same-origin" });
    if (!response.ok) return;
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html").querySelector("main");
    if (fresh) main.replaceChildren(...fresh.childNodes);
  };
  follow(main.dataset.refresh, () => {
    if (!pending) {
      pending = true;
      setTimeout(refresh, 2000);
    }
  }, main);
}

document.addEventListener("DOMContentLoaded", () => {
  const table = document.getElementById("live");
  if (table) liveTail(table);
  const main = document.querySelector("main[data-refresh]");
  if (main) refreshing(main);
});
