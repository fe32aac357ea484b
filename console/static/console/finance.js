// Finance: tables and charts from billing's report API (/api/billing/…), scoped on the server.
"use strict";
(function () {
  const el = Live.el;
  const PALETTE = ["#2563eb", "#16a34a", "#d97706", "#dc2626", "#7c3aed", "#0891b2", "#be185d", "#4b5563"];
  let burnChart = null, mixChart = null, mixRows = [];

  function params(extra) {
    const p = new URLSearchParams();
    ["tenant", "since", "until"].forEach(function (k) {
      const v = document.getElementById("f-" + k).value;
      if (v) p.set(k, v);
    });
    Object.entries(extra || {}).forEach(function ([k, v]) { if (v !== "" && v !== null) p.set(k, v); });
    return p;
  }

  async function report(name, extra) {
    const response = await fetch("/api/billing/" + name + "/?" + params(extra), { headers: { Accept: "application/json" }, credentials: "same-origin" });
    if (!response.ok) throw new Error(name + ": HTTP " + response.status);
    return response.json();
  }

  function fill(tbody, rows, cells, onClick) {
    tbody.textContent = "";
    if (!rows.length) { tbody.appendChild(el("tr", {}, [el("td", { colspan: "9", "class": "muted", text: "No data." })])); return; }
    rows.forEach(function (r) {
      const tr = el("tr", {}, cells(r).map(function (c) { return el("td", { text: c === null || c === undefined ? "—" : String(c) }); }));
      if (onClick) { tr.classList.add("clickable"); tr.addEventListener("click", function () { onClick(r); }); }
      tbody.appendChild(tr);
    });
  }

  function setCsv() {
    document.querySelectorAll("a.csv[data-report]").forEach(function (a) {
      a.href = "/api/billing/" + a.dataset.report + "/?" + params({ format: "csv" });
    });
  }

  async function drill(row) {
    const [y, m] = row.month.split("-").map(Number);
    const since = row.month + "-01";
    const next = m === 12 ? (y + 1) + "-01-01" : y + "-" + String(m + 1).padStart(2, "0") + "-01";
    const q = { tenant: row.tenant, since: since, until: next, kind: "charge", limit: 1000 };
    const p = new URLSearchParams(q);
    const data = await (await fetch("/api/billing/ledger/?" + p, { headers: { Accept: "application/json" } })).json();
    const rows = data.rows.filter(function (r) { return r.class_name === row["class"]; });
    document.getElementById("drill").hidden = false;
    document.getElementById("drill-title").textContent = row.tenant + " · " + row["class"] + " · " + row.month + " (" + rows.length + " requests)";
    p.set("format", "csv");
    document.getElementById("drill-csv").href = "/api/billing/ledger/?" + p;
    fill(document.querySelector("#drill-table tbody"), rows, function (r) {
      return [r.request_id, Live.when(r.at), r.model, r.backend_name, r.prompt_tokens + "/" + r.completion_tokens, r.base_cost, r.factor, r.amount];
    });
  }

  function burnChartDraw(charges, burn) {
    // cumulative spend by month per tenant, then a dashed line to the projected year-end spend
    const months = Array.from(new Set(charges.map(function (r) { return r.month; }))).sort();
    const datasets = [];
    burn.forEach(function (b, i) {
      let running = 0;
      const points = months.map(function (m) {
        charges.filter(function (r) { return r.tenant === b.tenant && r.month === m; }).forEach(function (r) { running += parseFloat(r.charge); });
        return running;
      });
      const color = PALETTE[i % PALETTE.length];
      datasets.push({ label: b.tenant + " spent", data: points.concat([null]), borderColor: color, backgroundColor: color, tension: 0.1 });
      const projected = months.map(function () { return null; });
      if (months.length) projected[months.length - 1] = points[points.length - 1];
      projected.push(parseFloat(b.projected_spend));
      datasets.push({ label: b.tenant + " projected", data: projected, borderColor: color, borderDash: [6, 4], pointStyle: "triangle", spanGaps: true });
      if (b.limit) datasets.push({ label: b.tenant + " budget", data: months.concat(["year end"]).map(function () { return parseFloat(b.limit); }), borderColor: color, borderWidth: 1, pointRadius: 0, borderDash: [2, 2] });
    });
    const labels = months.concat(["year end"]);
    if (burnChart) burnChart.destroy();
    burnChart = new Chart(document.getElementById("burn-chart"), { type: "line", data: { labels: labels, datasets: datasets },
      options: { animation: false, plugins: { legend: { position: "bottom" } }, scales: { y: { beginAtZero: true, title: { display: true, text: "spend" } } } } });
  }

  function mixChartDraw() {
    const measure = document.getElementById("mix-measure").value;
    const months = Array.from(new Set(mixRows.map(function (r) { return r.month; }))).sort();
    const classes = Array.from(new Set(mixRows.map(function (r) { return r["class"]; }))).sort();
    const tenantPicked = document.getElementById("f-tenant").value;
    const datasets = classes.map(function (cls, i) {
      return { label: cls, backgroundColor: PALETTE[i % PALETTE.length], data: months.map(function (m) {
        const rows = mixRows.filter(function (r) { return r.month === m && r["class"] === cls; });
        if (tenantPicked || rows.length <= 1) return rows.length ? 100 * parseFloat(rows[0][measure] || 0) : 0;
        // all tenants: average the tenants' shares weighted by their requests
        const weight = rows.reduce(function (s, r) { return s + r.requests; }, 0);
        return weight ? rows.reduce(function (s, r) { return s + 100 * parseFloat(r[measure] || 0) * r.requests; }, 0) / weight : 0;
      }) };
    });
    if (mixChart) mixChart.destroy();
    mixChart = new Chart(document.getElementById("mix-chart"), { type: "bar", data: { labels: months, datasets: datasets },
      options: { animation: false, scales: { x: { stacked: true }, y: { stacked: true, max: 100, title: { display: true, text: "% of " + (measure === "request_share" ? "requests" : "spend") } } } } });
  }

  async function load() {
    setCsv();
    const [charges, burn, mix] = await Promise.all([report("charges"), report("burn"), report("class-mix")]);
    fill(document.querySelector("#charges-table tbody"), charges.rows, function (r) {
      return [r.tenant, r.month, r["class"], r.requests, r.prompt_tokens, r.completion_tokens, r.base_cost, r.charge, r.effective_multiplier, r.unbilled];
    }, drill);
    fill(document.querySelector("#burn-table tbody"), burn.rows, function (r) {
      return [r.tenant, r.limit, r.spent, r.held, r.remaining, r.projected_spend];
    });
    mixRows = mix.rows;
    burnChartDraw(charges.rows, burn.rows);
    mixChartDraw();
  }

  document.getElementById("filters").addEventListener("submit", function (e) { e.preventDefault(); load(); });
  document.getElementById("mix-measure").addEventListener("change", mixChartDraw);
  document.getElementById("whatif").addEventListener("submit", async function (e) {
    e.preventDefault();
    const form = new FormData(e.target);
    const p = new URLSearchParams();
    form.forEach(function (v, k) { if (v) p.set(k, v); });
    const response = await fetch("/api/billing/what-if/?" + p, { headers: { Accept: "application/json" } });
    const data = await response.json();
    p.set("format", "csv");
    document.getElementById("whatif-csv").href = "/api/billing/what-if/?" + p;
    fill(document.querySelector("#whatif-table tbody"), response.ok ? data.rows : [], function (r) {
      return [r.tenant, r.actual, r.from_class_charge, r.what_if, r.saving];
    });
  });

  let reloadTimer = null;
  Live.connect("/ws/console/", function (msg) {
    if (msg.type === "finance" && !reloadTimer) {  // charges settled: refresh, at most every 5 s
      reloadTimer = setTimeout(function () { reloadTimer = null; load(); }, 5000);
    }
  });
  load();
})();
