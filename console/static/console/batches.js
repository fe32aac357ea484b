// My queue: the tenant's batch jobs as cards (progress, ETA, charges, cancel), rendered from the
// page's first data and then from the server's pushes (queue.js hands them over).
"use strict";
const BatchCards = (function () {
  const box = document.getElementById("batch-cards");
  const template = document.getElementById("batch-cancel-template");
  const el = Live.el;
  const PARTS = ["completed", "failed", "cancelled", "expired", "running", "waiting"];
  const STATUS = { in_progress: "running", finalizing: "writing its results", completed: "finished", expired: "expired: its window ended",
    cancelling: "cancelling", cancelled: "cancelled" };

  function eta(card) {
    if (card.status !== "in_progress" && card.status !== "cancelling") return STATUS[card.status] || card.status;
    const engine = card.engine_eta;  // the engine has no measurement for its waiting lines: say so, no figure
    if (engine && engine.eta_confidence && engine.eta_confidence !== "measured") return Format.eta(engine);
    if (card.eta_s === null || card.eta_s === undefined) return "not known yet";
    if (card.eta_s === 0 && card.waiting) return "later than forecast when it was created (that time has passed)";
    return Format.eta(Object.assign({}, card, { eta_ms: card.eta_s * 1000 }));
  }

  function counts(card) {  // each line once, under its true state
    const ended = card.completed + card.failed + (card.cancelled || 0) + (card.expired || 0);
    const parts = [card.completed + " completed"];
    ["failed", "cancelled", "expired"].forEach(function (k) { if (card[k]) parts.push(card[k] + " " + k); });
    return ended + " of " + card.total + " ended (" + parts.join(", ") + ") · " + card.running + " running · " + card.waiting + " waiting";
  }

  function progress(card) {
    const bar = el("div", { "class": "bar progress", role: "img",
      "aria-label": PARTS.map(function (p) { return card[p] + " " + p; }).join(", ") + " of " + card.total });
    PARTS.forEach(function (part) {
      const width = card.total ? (100 * (card[part] || 0)) / card.total : 0;
      bar.appendChild(el("span", { "class": part, style: "width:" + width + "%" }));
    });
    return bar;
  }

  function cancelForm(card) {
    const form = template.cloneNode(true);
    form.hidden = false;
    form.removeAttribute("id");
    form.action = "/console/batches/" + encodeURIComponent(card.id) + "/cancel/";
    form.className = "inline";
    form.appendChild(el("button", { type: "submit", "class": "danger", text: "Cancel" }));
    return form;
  }

  function one(card) {
    const money = "charged " + Live.money(card.charged) + (card.cost_bound ? " of at most " + Live.money(card.cost_bound) : "");
    const node = el("article", { "class": "job " + card.status, "data-id": card.id }, [
      el("h3", {}, [card.description || card.id, el("small", { "class": "muted" }, [" · " + card["class"] + " · " + (STATUS[card.status] || card.status)])]),
      card.description ? el("p", { "class": "muted small", "data-field": "batch-id", text: "Batch " + card.id }) : "",
      progress(card),
      el("p", { "class": "figures", "data-field": "counts", text: counts(card) }),
      el("p", { "class": "figures" }, ["When done: ", el("span", { "data-field": "eta", text: eta(card) })]),
      el("p", { "class": "figures", "data-field": "money", text: money[0].toUpperCase() + money.slice(1) }),
    ]);
    const slip = card.waiting ? Format.slip(card) : "";
    if (slip) node.appendChild(el("p", { "class": "slip", text: slip }));
    const failed = Live.failures(card);
    if (failed) node.appendChild(failed);
    if (card.fits_window === false && card.status === "in_progress") {
      node.appendChild(el("p", { "class": "error", text: "Forecast at create: it cannot finish within its window; what is left then expires." }));
    }
    if (card.cancellable) node.appendChild(cancelForm(card));
    return node;
  }

  function render(cards) {
    box.textContent = "";
    if (!cards.length) { box.appendChild(el("p", { "class": "muted", text: "No batch jobs running or ended in the last hour." })); return; }
    cards.forEach(function (card) { box.appendChild(one(card)); });
  }

  render(JSON.parse(document.getElementById("batches-initial").textContent));
  return { render: render };
})();
