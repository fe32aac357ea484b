// Operations: the dispatcher's counters and the last hour's timeline, pushed every few seconds.
"use strict";
(function () {
  const el = Live.el, ms = Live.ms;
  const HOUR_MS = 3600000;
  let points = [];
  const chart = new Chart(document.getElementById("timeline"), {
    type: "line",
    data: { labels: [], datasets: [
      { label: "in_queue", data: [], borderColor: "#2563eb", yAxisID: "count", pointRadius: 0 },
      { label: "batch_completed", data: [], borderColor: "#16a34a", yAxisID: "count", pointRadius: 0 },
      { label: "aging_preempts", data: [], borderColor: "#dc2626", yAxisID: "count", pointRadius: 0 },
      { label: "interactive wait p95 (s)", data: [], borderColor: "#d97706", yAxisID: "seconds", pointRadius: 0, spanGaps: true },
    ] },
    options: { animation: false, scales: {
      count: { type: "linear", position: "left", beginAtZero: true },
      seconds: { type: "linear", position: "right", beginAtZero: true, grid: { drawOnChartArea: false } } } },
  });

  function redraw() {
    const cutoff = Date.now() - HOUR_MS;
    points = points.filter(function (p) { return p.at_ms >= cutoff; });
    chart.data.labels = points.map(function (p) { return new Date(p.at_ms).toLocaleTimeString(); });
    chart.data.datasets[0].data = points.map(function (p) { return p.in_queue; });
    chart.data.datasets[1].data = points.map(function (p) { return p.batch_completed; });
    chart.data.datasets[2].data = points.map(function (p) { return p.aging_preempts; });
    chart.data.datasets[3].data = points.map(function (p) { return p.interactive_p95_ms === null ? null : p.interactive_p95_ms / 1000; });
    chart.update();
  }

  function fill(id, rows, cells) {
    const tbody = document.querySelector("#" + id + " tbody");
    tbody.textContent = "";
    rows.forEach(function (r) {
      tbody.appendChild(el("tr", {}, cells(r).map(function (c) { return el("td", { text: c === null || c === undefined ? "—" : String(c) }); })));
    });
  }

  Live.connect("/ws/console/", function (msg) {
    if (msg.type !== "ops") return;
    document.getElementById("ops-at").textContent = "updated " + new Date(msg.at_ms).toLocaleTimeString();
    document.getElementById("in-queue").textContent = msg.in_queue;
    fill("classes-table", msg.classes, function (c) {
      return [c["class"], c.depth, c.depth_limit, ms(c.wait_p95_ms), c.throughput_per_min, c.rejected_queue_full, c.queue_timeout, c.boosted, c.preempted];
    });
    fill("backends-table", msg.backends, function (b) {
      return [b.backend + (b.enabled ? "" : " (disabled)"), b.in_use + " / " + b.slots, b.tpm_used + (b.tpm ? " / " + b.tpm : ""), b.errors, b.circuit_open ? "open" : "closed"];
    });
    fill("rejects-table", Object.entries(msg.rejects).map(function ([code, n]) { return { code: code, n: n }; }), function (r) { return [r.code, r.n]; });
    const known = new Set(points.map(function (p) { return p.at_ms; }));
    (msg.timeline || []).forEach(function (p) { if (!known.has(p.at_ms)) points.push(p); });
    points.sort(function (a, b) { return a.at_ms - b.at_ms; });
    redraw();
  });
})();
