// Policy: the boost curve of the live aging policy (levels gained against wait / SLA).
"use strict";
(function () {
  const curve = JSON.parse(document.getElementById("curve-data").textContent);
  const top = Math.max.apply(null, curve.boost.filter(function (v) { return v !== null; }).concat([1]));
  const preempt = curve.ratios.map(function (r) { return curve.preempt_ratio !== null && r >= curve.preempt_ratio ? top + 0.5 : null; });
  new Chart(document.getElementById("curve"), {
    type: "line",
    data: { labels: curve.ratios, datasets: [
      { label: "priority gained (class levels)", data: curve.boost, borderColor: "#2563eb", pointRadius: 0, tension: 0 },
      { label: "served before everything else", data: preempt, borderColor: "#dc2626", borderWidth: 4, pointRadius: 0 },
    ] },
    options: { animation: false, scales: {
      x: { title: { display: true, text: "share of the target wait already waited" }, ticks: { callback: function (v, i) { return i % 10 === 0 ? curve.ratios[i] : ""; } } },
      y: { beginAtZero: true, title: { display: true, text: "levels" } } } },
  });
})();

// After a Save the page comes back where it was, with the outcome beside the form that was sent.
(function () {
  const KEY = "policy-scroll";
  const saved = sessionStorage.getItem(KEY);
  sessionStorage.removeItem(KEY);
  if (saved !== null && document.querySelector(".feedback")) window.scrollTo(0, Number(saved));
  document.querySelectorAll("form[method=post]").forEach(function (form) {
    form.addEventListener("submit", function () { sessionStorage.setItem(KEY, String(window.scrollY)); });
  });
})();
