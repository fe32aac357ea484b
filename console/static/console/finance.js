// Finance: tables and charts from billing's report API (/api/billing/…), scoped on the server.
"use strict";
(function () {
  const el = Live.el;
  const PALETTE = ["#2563eb", "#16a34a", "#d97706", "#dc2626", "#7c3aed", "#0891b2", "#be185d", "#4b5563"];
  let mixChart = null, mixRows = [], mixOverall = [];
  const money = Live.money;

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
    if (!rows.length) { tbody.appendChild(el("tr", {}, [el("td", { colspan: "11", "class": "muted", text: "No data." })])); return; }
    rows.forEach(function (r) {
      const tr = el("tr", {}, cells(r).map(function (c) {
        if (c instanceof Node) return el("td", {}, [c]);
        return el("td", { text: c === null || c === undefined ? "—" : String(c) });
      }));
      if (onClick) { tr.classList.add("clickable"); tr.addEventListener("click", function () { onClick(r); }); }
      tbody.appendChild(tr);
    });
  }

  function effective(row) {
    // charge / base cost, only where it is not the price factor, with the reason
    if (!row.effective_note) return "";
    return el("span", { "class": "effective", title: row.effective_note }, [
      el("span", { text: row.effective_multiplier }), el("small", { "class": "note", text: row.effective_note })]);
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
      return [r.request_id, Live.when(r.at), r.model, r.backend_name, r.prompt_tokens + "/" + r.completion_tokens, money(r.base_cost), r.factor, money(r.amount)];
    });
  }

  function mixChartDraw() {
    // one department: its own rows; all of them: the server's shares over the whole set (not an
    // average of the departments' shares)
    const measure = document.getElementById("mix-measure").value;
    const rowsShown = document.getElementById("f-tenant").value ? mixRows : mixOverall;
    const months = Array.from(new Set(rowsShown.map(function (r) { return r.month; }))).sort();
    const classes = Array.from(new Set(rowsShown.map(function (r) { return r["class"]; }))).sort();
    const datasets = classes.map(function (cls, i) {
      return { label: cls, backgroundColor: PALETTE[i % PALETTE.length], data: months.map(function (m) {
        const row = rowsShown.find(function (r) { return r.month === m && r["class"] === cls; });
        return row && row[measure] !== null ? Format.percent(row[measure], "1") : 0;
      }) };
    });
    if (mixChart) mixChart.destroy();
    mixChart = new Chart(document.getElementById("mix-chart"), { type: "bar", data: { labels: months, datasets: datasets },
      options: { animation: false, maintainAspectRatio: false, scales: { x: { stacked: true }, y: { stacked: true, max: 100, title: { display: true, text: "% of " + (measure === "request_share" ? "requests" : "spend") } } } } });
  }

  async function load() {
    setCsv();
    const [charges, mix] = await Promise.all([report("charges"), report("class-mix")]);
    fill(document.querySelector("#charges-table tbody"), charges.rows, function (r) {
      return [r.tenant, r.month, r["class"], r.requests, r.prompt_tokens, r.completion_tokens, money(r.base_cost), money(r.charge), r.price_factor, effective(r), money(r.unbilled)];
    }, drill);
    mixRows = mix.rows;
    mixOverall = mix.overall || [];
    mixChartDraw();
    Finance.views.forEach(function (view) { view(); });
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
      return [r.tenant, money(r.actual), money(r.from_class_charge), money(r.what_if), money(r.saving)];
    });
  });

  let reloadTimer = null;
  Live.connect("/ws/console/", function (msg) {
    if (msg.type === "finance" && !reloadTimer) {  // charges settled: refresh, at most every 5 s
      reloadTimer = setTimeout(function () { reloadTimer = null; load(); }, 5000);
    }
  });
  window.Finance = { report: report, fill: fill, el: el, PALETTE: PALETTE, views: [], mixChart: function () { return mixChart; } };
  document.addEventListener("DOMContentLoaded", load);
})();
