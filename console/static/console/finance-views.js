// Finance: the burn as small multiples (one chart per department, scaled to its own spend) and
// the incentive view (each class's share of requests per day or week, price changes marked on
// the time axis, volume alongside; per department, the share before the first change and after
// the last).
"use strict";
(function () {
  const el = Finance.el;
  const charts = [];
  let shiftChart = null, shift = null, timeChart = null;

  function pct(share) { return share === null || share === undefined ? "—" : Math.round(100 * parseFloat(share)) + " %"; }

  const money = Live.money;

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
    const pct = budget && budget.limit ? Format.percent(budget.spent, budget.limit) : null;
    const used = pct !== null ? " · " + (pct > 0 && pct < 0.01 ? "under 0.01" : pct.toFixed(pct < 1 ? 2 : 0)) + " % of " + money(budget.limit) : "";
    const box = el("figure", { "class": "multiple", "data-tenant": slug }, [
      el("figcaption", {}, [el("strong", { text: slug }), el("span", { "class": "muted", text: " spent " + money(points[points.length - 1].cumulative) + used })]),
    ]);
    const canvas = el("canvas", { height: "120" });
    box.appendChild(canvas);
    charts.push(new Chart(canvas, { type: "line", data: {
      labels: points.map(function (p) { return bucketLabel(p.at, step); }),
      datasets: [{ label: slug, data: points.map(function (p) { return Format.cents(p.cumulative) / 100; }), borderColor: color, backgroundColor: color, pointRadius: points.length > 30 ? 0 : 2, fill: false }] },
      options: { animation: false, plugins: { legend: { display: false } },
        scales: { x: { ticks: { maxTicksLimit: 4, maxRotation: 0 } }, y: { beginAtZero: true, ticks: { maxTicksLimit: 4 } } } } }));
    return box;
  }

  async function burnDraw() {
    const [burn, series] = await Promise.all([Finance.report("burn"), Finance.report("burn-series")]);
    Finance.fill(document.querySelector("#burn-table tbody"), burn.rows, function (r) {
      return [r.tenant, money(r.limit), money(r.spent), money(r.held), money(r.remaining), money(r.projected_spend)];
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
    if (p.period === 0) return (shift && shift.changes.length ? "Before the first price change" : "The whole period") + since;
    return "After " + p.opened_by + since;
  }

  const STEP_WORD = { minute: "minute", hour: "hour", day: "day", week: "week" };

  function shown(periods) {  // the periods a headline or the table compares: the first and the last
    return periods.length > 1 ? [periods[0], periods[periods.length - 1]] : periods.slice();
  }

  // Whether volume changed between before the first price change and after the last one (mean
  // requests per bucket, empty buckets counted), in words; "" where it did not or cannot tell.
  function volumeNote(data) {
    if (!data.changes.length || !data.series || !data.series.length) return "";
    const first = new Date(data.changes[0].at).getTime(), last = new Date(data.changes[data.changes.length - 1].at).getTime();
    const totals = {};
    data.series.forEach(function (r) { totals[r.at] = r.bucket_requests; });
    const before = [], after = [];
    Object.keys(totals).forEach(function (at) {
      const t = new Date(at).getTime();
      if (t + STEP_MS[data.step] <= first) before.push(totals[at]); else if (t >= last) after.push(totals[at]);
    });
    if (!before.length || !after.length) return "";
    const mean = function (xs) { return xs.reduce(function (a, b) { return a + b; }, 0) / xs.length; };
    const a = mean(before), b = mean(after), step = STEP_WORD[data.step];
    if (Math.max(a, b) < 1.5 * Math.min(a, b) && Math.min(a, b) > 0) return "";
    return "Volume changed too: about " + Math.round(a) + " requests a " + step + " before the first price change, " + Math.round(b) +
      " after the last. Read the shares, not the counts" + (b < a / 2 ? ": fewer requests after a change may simply mean the work ended." : ".");
  }

  function shiftStory(data) {
    const story = document.getElementById("shift-story");
    const periods = data.periods;
    if (!data.top_class || !periods.length) { story.textContent = "No charges in this period."; return; }
    const ends = shown(periods);
    const parts = ends.map(function (p) {
      return (p.period === 0 ? "" : "after " + p.opened_by + ": ") + pct(p.top_share) + " (premium " + money(p.top_premium) + ")";
    });
    const between = periods.length > 2 ? " (" + (periods.length - 2) + " more price changes between: see the chart)" : "";
    story.textContent = "Share of all requests in " + data.top_class + ", the top class: " + parts.join(" → ") + between +
      (data.changes.length ? "" : ". No price change in this period.");
    document.getElementById("shift-volume").textContent = volumeNote(data);
  }

  function shiftTable(data) {
    const periods = shown(data.periods);
    const thead = document.querySelector("#shift-table thead");
    thead.textContent = "";
    thead.appendChild(el("tr", {}, [el("th", { text: "Department" })].concat(periods.map(function (p) { return el("th", { text: periodHead(p) }); }))));
    const tbody = document.querySelector("#shift-table tbody");
    tbody.textContent = "";
    const tenants = Array.from(new Set(data.rows.map(function (r) { return r.tenant; }))).sort();
    tenants.forEach(function (slug) {
      const cells = periods.map(function (p) {
        const rows = data.rows.filter(function (r) { return r.tenant === slug && r.period === p.period; });
        if (!rows.length) return el("td", { "class": "muted", "data-period": String(p.period), text: "no requests" });
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

  // Price changes as dashed vertical lines on the share chart's time axis, each labelled.
  const changeMarks = {
    id: "changeMarks",
    afterDatasetsDraw: function (chart, args, options) {
      const ctx = chart.ctx, area = chart.chartArea;
      (options.marks || []).forEach(function (mark, i) {
        const x = chart.scales.x.getPixelForValue(mark.index) - (mark.before ? chart.scales.x.width / (2 * Math.max(1, chart.data.labels.length)) : 0);
        ctx.save();
        ctx.strokeStyle = "#111827"; ctx.setLineDash([4, 3]); ctx.beginPath(); ctx.moveTo(x, area.top); ctx.lineTo(x, area.bottom); ctx.stroke();
        ctx.setLineDash([]); ctx.fillStyle = "#111827"; ctx.font = "11px system-ui, sans-serif";
        ctx.fillText(mark.label, Math.min(x + 3, area.right - ctx.measureText(mark.label).width), area.top + 11 + 12 * (i % 3));
        ctx.restore();
      });
    },
  };

  function timeDraw(data) {
    const canvas = document.getElementById("share-time-chart");
    const series = data.series || [];
    document.getElementById("share-time-empty").hidden = series.length > 0;
    const buckets = Array.from(new Set(series.map(function (r) { return r.at; }))).sort();
    const classes = Array.from(new Set(series.map(function (r) { return r["class"]; }))).sort();
    const datasets = classes.map(function (cls, i) {
      return { type: "line", label: cls + " share", yAxisID: "y", borderColor: Finance.PALETTE[i % Finance.PALETTE.length],
        backgroundColor: Finance.PALETTE[i % Finance.PALETTE.length], spanGaps: false, pointRadius: buckets.length > 40 ? 0 : 3,
        data: buckets.map(function (at) {
          const row = series.find(function (r) { return r.at === at && r["class"] === cls; });
          return row && row.share !== null ? Format.percent(row.share, "1") : null;
        }) };
    });
    const volume = buckets.map(function (at) { return series.find(function (r) { return r.at === at; }).bucket_requests; });
    datasets.push({ type: "bar", label: "requests (all classes)", yAxisID: "volume", data: volume, backgroundColor: "rgba(148,163,184,.35)" });
    const marks = data.changes.map(function (c) {
      const t = new Date(c.at).getTime();
      let index = 0;
      buckets.forEach(function (at, i) { if (new Date(at).getTime() <= t) index = i; });
      return { index: index, label: c["class"] + " ×" + c.old + " → ×" + c["new"] };
    });
    const list = document.getElementById("price-changes");
    list.textContent = "";
    data.changes.forEach(function (c) {
      list.appendChild(el("li", { text: new Date(c.at).toLocaleString() + ": " + c["class"] + " price factor ×" + c.old + " → ×" + c["new"] }));
    });
    if (timeChart) timeChart.destroy();
    timeChart = new Chart(canvas, { data: { labels: buckets.map(function (at) { return bucketLabel(at, data.step); }), datasets: datasets },
      plugins: [changeMarks],
      options: { animation: false, maintainAspectRatio: false, plugins: { legend: { position: "bottom" }, changeMarks: { marks: marks } },
        scales: { x: { ticks: { maxTicksLimit: 8, maxRotation: 0 } },
          y: { min: 0, max: 100, title: { display: true, text: "% of the " + STEP_WORD[data.step] + "'s requests" } },
          volume: { position: "right", beginAtZero: true, grid: { drawOnChartArea: false }, title: { display: true, text: "requests" } } } } });
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
    timeDraw(shift);
  }

  Finance.views.push(burnDraw, incentiveDraw);
  Finance.shareChart = function () { return timeChart; };
})();
