// Finance: the burn as small multiples (one chart per department, scaled to its own spend) and
// the incentive view (each class's share before and after each price change, and the premium).
"use strict";
(function () {
  const el = Finance.el;
  const charts = [];
  let shiftChart = null, shift = null;

  function pct(share) { return share === null || share === undefined ? "—" : Math.round(100 * parseFloat(share)) + " %"; }

  function money(text) {
    const value = parseFloat(text);
    if (!isFinite(value)) return "—";
    if (value === 0) return "0";
    return Math.abs(value) >= 100 ? value.toFixed(0) : Math.abs(value) >= 1 ? value.toFixed(2) : value.toPrecision(2);
  }

  function bucketLabel(iso, step) {
    const d = new Date(iso);
    if (step === "minute") return d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    if (step === "hour") return d.toLocaleString([], { month: "short", day: "numeric", hour: "2-digit" });
    if (step === "day") return d.toLocaleDateString([], { month: "short", day: "numeric" });
    return d.toLocaleDateString([], { year: "numeric", month: "short" });
  }

  const STEP_MS = { minute: 60000, hour: 3600000, day: 86400000, month: 30 * 86400000 };

  function multiple(slug, spent, budget, step, color) {
    // from nothing one step before the first charge, so a single bucket still draws a line
    const first = spent[0];
    const points = [{ at: new Date(new Date(first.at).getTime() - STEP_MS[step]).toISOString(), cumulative: "0" }].concat(spent);
    const used = budget && budget.limit ? " · " + (100 * parseFloat(budget.spent) / parseFloat(budget.limit)).toPrecision(2) + " % of " + money(budget.limit) : "";
    const box = el("figure", { "class": "multiple", "data-tenant": slug }, [
      el("figcaption", {}, [el("strong", { text: slug }), el("span", { "class": "muted", text: " spent " + money(points[points.length - 1].cumulative) + used })]),
    ]);
    const canvas = el("canvas", { height: "120" });
    box.appendChild(canvas);
    charts.push(new Chart(canvas, { type: "line", data: {
      labels: points.map(function (p) { return bucketLabel(p.at, step); }),
      datasets: [{ label: slug, data: points.map(function (p) { return parseFloat(p.cumulative); }), borderColor: color, backgroundColor: color, pointRadius: points.length > 30 ? 0 : 2, fill: false }] },
      options: { animation: false, plugins: { legend: { display: false } },
        scales: { x: { ticks: { maxTicksLimit: 4, maxRotation: 0 } }, y: { beginAtZero: true, ticks: { maxTicksLimit: 4 } } } } }));
    return box;
  }

  async function burnDraw() {
    const [burn, series] = await Promise.all([Finance.report("burn"), Finance.report("burn-series")]);
    Finance.fill(document.querySelector("#burn-table tbody"), burn.rows, function (r) {
      return [r.tenant, r.limit, r.spent, r.held, r.remaining, r.projected_spend];
    });
    charts.splice(0).forEach(function (c) { c.destroy(); });
    const box = document.getElementById("burn-multiples");
    box.textContent = "";
    const budgets = Object.fromEntries(burn.rows.map(function (b) { return [b.tenant, b]; }));
    const bySlug = {};
    series.rows.forEach(function (r) { (bySlug[r.tenant] = bySlug[r.tenant] || []).push(r); });
    Object.keys(bySlug).sort().forEach(function (slug, i) {
      box.appendChild(multiple(slug, bySlug[slug], budgets[slug], series.step, Finance.PALETTE[i % Finance.PALETTE.length]));
    });
    const idle = burn.rows.map(function (b) { return b.tenant; }).filter(function (slug) { return !bySlug[slug]; });
    document.getElementById("burn-idle").textContent = idle.length ? "No spend in this period: " + idle.join(", ") + "." : "";
  }

  function periodHead(p) {
    const since = p.starts_at ? " (from " + new Date(p.starts_at).toLocaleString() + ")" : "";
    return p.period === 0 ? "Before" + since : "After " + p.opened_by + since;
  }

  function shiftStory(data) {
    const story = document.getElementById("shift-story");
    const periods = data.periods;
    if (!data.top_class || !periods.length) { story.textContent = "No charges in this period."; return; }
    const parts = periods.map(function (p) {
      return (p.period === 0 ? "" : "after " + p.opened_by + ": ") + pct(p.top_share) + " (premium " + money(p.top_premium) + ")";
    });
    story.textContent = "Share of all requests in " + data.top_class + ", the top class: " + parts.join(" → ") +
      (data.changes.length ? "" : ". No price change in this period.");
  }

  function shiftTable(data) {
    const periods = data.periods;
    const thead = document.querySelector("#shift-table thead");
    thead.textContent = "";
    thead.appendChild(el("tr", {}, [el("th", { text: "Department" })].concat(periods.map(function (p) { return el("th", { text: periodHead(p) }); }))));
    const tbody = document.querySelector("#shift-table tbody");
    tbody.textContent = "";
    const tenants = Array.from(new Set(data.rows.map(function (r) { return r.tenant; }))).sort();
    tenants.forEach(function (slug) {
      const cells = periods.map(function (p) {
        const rows = data.rows.filter(function (r) { return r.tenant === slug && r.period === p.period; });
        if (!rows.length) return el("td", { "class": "muted", text: "—" });
        const top = rows.find(function (r) { return r.top; });
        return el("td", { "data-period": String(p.period), "class": "shift" }, [
          el("span", { "class": "share", text: pct(top ? top.request_share : 0) }),
          el("small", { "class": "premium", text: " premium " + money(top ? top.premium : "0") }),
        ]);
      });
      const tr = el("tr", { "class": "clickable", "data-tenant": slug }, [el("td", { text: slug })].concat(cells));
      tr.addEventListener("click", function () { shiftDetail(slug); });
      tbody.appendChild(tr);
    });
  }

  function shiftDetail(slug) {
    const rows = shift.rows.filter(function (r) { return r.tenant === slug; });
    const classes = Array.from(new Set(rows.map(function (r) { return r["class"]; }))).sort();
    document.getElementById("shift-detail").hidden = false;
    document.getElementById("shift-detail-title").textContent = slug + ": each class's share of requests, period by period";
    const datasets = classes.map(function (cls, i) {
      return { label: cls, backgroundColor: Finance.PALETTE[i % Finance.PALETTE.length], data: shift.periods.map(function (p) {
        const row = rows.find(function (r) { return r.period === p.period && r["class"] === cls; });
        return row ? 100 * parseFloat(row.request_share) : 0;
      }) };
    });
    if (shiftChart) shiftChart.destroy();
    shiftChart = new Chart(document.getElementById("shift-chart"), { type: "bar",
      data: { labels: shift.periods.map(function (p) { return p.period === 0 ? "before" : "after " + p.opened_by; }), datasets: datasets },
      options: { animation: false, maintainAspectRatio: false, indexAxis: "y", scales: { x: { stacked: true, max: 100, title: { display: true, text: "% of requests" } }, y: { stacked: true } } } });
  }

  async function incentiveDraw() {
    shift = await Finance.report("class-shift");
    shiftStory(shift);
    shiftTable(shift);
  }

  Finance.views.push(burnDraw, incentiveDraw);
})();
