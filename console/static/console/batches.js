// My queue: the tenant's batch jobs as cards (progress, ETA, charges, cancel), rendered from the
// page's first data and then from the server's pushes (queue.js hands them over).
"use strict";
const BatchCards = (function () {
  const box = document.getElementById("batch-cards");
  const template = document.getElementById("batch-cancel-template");
  const el = Live.el;
  const PARTS = ["completed", "failed", "running", "waiting"];

  function eta(card) {
    if (card.status !== "in_progress" && card.status !== "cancelling") return card.status;
    if (card.eta_s === null || card.eta_s === undefined) return "not known yet";
    return "about " + Live.ms(card.eta_s * 1000);
  }

  function progress(card) {
    const bar = el("div", { "class": "bar progress", role: "img",
      "aria-label": PARTS.map(function (p) { return card[p] + " " + p; }).join(", ") + " of " + card.total });
    PARTS.forEach(function (part) {
      const width = card.total ? (100 * card[part]) / card.total : 0;
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
    const done = card.completed + card.failed;
    const money = "charged " + card.charged + (card.cost_bound ? " of at most " + card.cost_bound : "");
    const node = el("article", { "class": "job " + card.status, "data-id": card.id }, [
      el("h3", { text: card.id + " · " + card["class"] + " · " + card.status }),
      progress(card),
      el("p", { "class": "figures", text: done + " of " + card.total + " done (" + card.completed + " completed, " +
        card.failed + " failed) · " + card.running + " running · " + card.waiting + " waiting" }),
      el("p", { "class": "figures", text: "ETA to the last line: " + eta(card) + " · " + money }),
    ]);
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
