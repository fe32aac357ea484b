// My queue, job first: the tenant's HTTP jobs (X-Job-Id; untagged: by key and class) as cards
// with a progress bar, the ETA to the last request and the money; and a chart of its waits by
// class over the last hour. Cards come with the server's pushes (queue.js hands them over).
"use strict";
const JobCards = (function () {
  const box = document.getElementById("job-cards");
  const el = Live.el;
  const PARTS = [["done", "completed"], ["failed", "failed"], ["running", "running"], ["waiting", "waiting"]];
  let chart = null;

  function progress(card) {
    const bar = el("div", { "class": "bar progress", role: "img",
      "aria-label": PARTS.map(function ([k]) { return card[k] + " " + k; }).join(", ") + " of " + card.total });
    PARTS.forEach(function ([key, css]) {
      bar.appendChild(el("span", { "class": css, "data-part": key, style: "width:" + (card.total ? (100 * card[key]) / card.total : 0) + "%" }));
    });
    return bar;
  }

  function eta(card) {
    if (!card.waiting && !card.running) return card.failed ? "ended (" + card.failed + " of " + card.total + " without an answer)" : "finished";
    if (!card.waiting) return "last requests running";
    return Format.eta(card);
  }

  function field(name, text) { return el("span", { "data-field": name, text: text }); }

  const BASIS = { "mean so far": "from the mean charge so far", "holds (at most)": "at most: what is held for it" };

  function one(card) {
    const total = card.estimated_total === null ? "not known yet" : (card.estimate_basis === "charged" ? Live.money(card.estimated_total) :
      "about " + Live.money(card.estimated_total) + " (" + (BASIS[card.estimate_basis] || card.estimate_basis) + ")");
    const node = el("article", { "class": "job http", "data-job": card.job }, [
      el("h3", { text: card.label + " · " + card.classes.join(", ") }),
      progress(card),
      el("p", { "class": "figures" }, [field("done", String(card.done)), " done · ", field("failed", String(card.failed)), " failed · ",
        field("running", String(card.running)), " running · ", field("waiting", String(card.waiting)), " waiting · of ", field("total", String(card.total))]),
      el("p", { "class": "figures" }, ["When done: ", field("eta", eta(card))]),
      el("p", { "class": "figures" }, ["Charged so far ", field("charged", Live.money(card.charged)), " · estimated total ", field("estimate", total)]),
    ]);
    const slip = card.waiting ? Format.slip(card) : "";
    if (slip) node.appendChild(el("p", { "class": "slip", "data-field": "slip", text: slip }));
    const failed = Live.failures(card);
    if (failed) node.appendChild(failed);
    return node;
  }

  function render(cards) {
    box.textContent = "";
    if (!cards.length) { box.appendChild(el("p", { "class": "muted", text: "No requests in the last hour. Tag a job's requests with an X-Job-Id header to follow them as one." })); return; }
    cards.forEach(function (card) { box.appendChild(one(card)); });
  }

  async function waits() {
    const canvas = document.getElementById("waits-chart");
    const response = await fetch("/console/api/waits/" + (window.CONSOLE_TENANT_QUERY || ""), { credentials: "same-origin" });
    if (!response.ok) return;
    const rows = (await response.json()).rows;
    document.getElementById("waits-empty").hidden = rows.length > 0;
    const minutes = Array.from(new Set(rows.map(function (r) { return r.minute; }))).sort();
    const classes = Array.from(new Set(rows.map(function (r) { return r["class"]; }))).sort();
    const colors = ["#dc2626", "#d97706", "#2563eb", "#16a34a", "#7c3aed"];
    const datasets = classes.map(function (cls, i) {
      return { label: cls, borderColor: colors[i % colors.length], backgroundColor: colors[i % colors.length], spanGaps: true,
        data: minutes.map(function (m) { const r = rows.find(function (x) { return x.minute === m && x["class"] === cls; }); return r ? r.mean_wait_ms / 1000 : null; }) };
    });
    const labels = minutes.map(function (m) { return new Date(m + ":00Z").toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }); });
    if (chart) { chart.data.labels = labels; chart.data.datasets = datasets; chart.update(); return; }
    chart = new Chart(canvas, { type: "line", data: { labels: labels, datasets: datasets }, options: { animation: false, maintainAspectRatio: false,
      plugins: { legend: { position: "bottom" } }, scales: { y: { beginAtZero: true, title: { display: true, text: "mean wait (s)" } }, x: { ticks: { maxTicksLimit: 6, maxRotation: 0 } } } } });
  }

  waits();
  setInterval(waits, 30000);
  return { render: render };
})();
