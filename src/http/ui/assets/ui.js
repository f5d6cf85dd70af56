// The svc dashboard's one script: the live tail on the events page. It
// reads the stream named by the table's data-stream and adds a row per
// event, newest first, keeping the last 200. Text goes in as text.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const table = document.getElementById("live");
  if (!table) return;
  const rows = table.querySelector("tbody");
  const source = new EventSource(table.dataset.stream);
  const add = (event) => {
    let envelope = {};
    try { envelope = JSON.parse(event.data); } catch (_) { return; }
    const row = document.createElement("tr");
    for (const text of [envelope.time || "", envelope.type || event.type, envelope.subject || ""]) {
      const cell = document.createElement("td");
      cell.textContent = text;
      row.appendChild(cell);
    }
    rows.insertBefore(row, rows.firstChild);
    while (rows.children.length > 200) rows.removeChild(rows.lastChild);
  };
  source.onmessage = add;
});
