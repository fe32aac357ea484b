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
    options: { animation: false, maintainAspectRatio: false, interaction: { mode: "index", intersect: false },
      plugins: { legend: { position: "bottom" } }, scales: {
      x: { ticks: { maxTicksLimit: 8, maxRotation: 0 } },
      count: { type: "linear", position: "left", beginAtZero: true, title: { display: true, text: "requests" } },
      seconds: { type: "linear", position: "right", beginAtZero: true, title: { display: true, text: "interactive p95 (s)" }, grid: { drawOnChartArea: false } } } },
  });

  function niceMax(values) {
    // an axis top just above the data: 1, 2 or 5 × a power of ten
    const top = Math.max.apply(null, values.filter(function (v) { return v !== null && isFinite(v); }).concat([0]));
    if (top <= 0) return 1;
    const power = Math.pow(10, Math.floor(Math.log10(top * 1.05)));
    const step = [1, 2, 5, 10].find(function (m) { return m * power >= top * 1.05; });
    return step * power;
  }

  function timelineTable() {
    // the field report's table: one row per minute (its first sample), newest first
    const rows = [];
    let minute = null;
    points.forEach(function (p) {
      const m = Math.floor(p.at_ms / 60000);
      if (m !== minute) { rows.push(p); minute = m; }
    });
    if (points.length && rows[rows.length - 1] !== points[points.length - 1]) rows.push(points[points.length - 1]);
    fill("timeline-table", rows.reverse(), function (p) {
      return [new Date(p.at_ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false }), p.in_queue.toLocaleString(),
        p.interactive_p95_ms === null ? "—" : (p.interactive_p95_ms / 1000).toFixed(2) + "s", p.batch_completed.toLocaleString(), p.aging_preempts.toLocaleString()];
    });
  }

  function redraw() {
    const cutoff = Date.now() - HOUR_MS;
    points = points.filter(function (p) { return p.at_ms >= cutoff; });
    chart.data.labels = points.map(function (p) { return new Date(p.at_ms).toLocaleTimeString(); });
    chart.data.datasets[0].data = points.map(function (p) { return p.in_queue; });
    chart.data.datasets[1].data = points.map(function (p) { return p.batch_completed; });
    chart.data.datasets[2].data = points.map(function (p) { return p.aging_preempts; });
    chart.data.datasets[3].data = points.map(function (p) { return p.interactive_p95_ms === null ? null : p.interactive_p95_ms / 1000; });
    chart.options.scales.count.max = niceMax(chart.data.datasets.slice(0, 3).flatMap(function (d) { return d.data; }));
    chart.options.scales.seconds.max = niceMax(chart.data.datasets[3].data);
    chart.update();
    timelineTable();
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
