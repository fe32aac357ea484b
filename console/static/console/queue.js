// My queue: the tenant's waiting and running requests, pushed by the server (never polled).
"use strict";
(function () {
  const tbody = document.querySelector("#queue-table tbody");
  const counts = document.getElementById("counts");
  const more = document.getElementById("queue-more");
  const total = document.getElementById("queue-total");
  const card = document.getElementById("card");
  const el = Live.el, ms = Live.ms;
  let rows = [];
  let receivedAt = Date.now();
  let watchId = null;
  let lastCard = null;
  let lastPush = null;

  function classCell(r) {
    if (r.declared_class && r.declared_class !== r["class"]) {
      return r["class"] + " (declared " + r.declared_class + ", rule " + r.downgrade_rule + ")";
    }
    return r["class"];
  }

  function ordinal(n) {
    const tens = n % 100, ones = n % 10;
    const suffix = tens >= 11 && tens <= 13 ? "th" : ones === 1 ? "st" : ones === 2 ? "nd" : ones === 3 ? "rd" : "th";
    return n + suffix;
  }

  function position(r) {
    // the engine's place in the model's line (every department), then among your own of that class
    if (r.position === null || r.position === undefined) return "—";
    const mine = r.of_yours ? ", " + ordinal(r.of_yours) + " of yours in " + r["class"] : "";
    return ordinal(r.position) + " in line" + mine;
  }

  function jobName(r) {  // a batch's line is its batch's (console/live/jobs.py), else its X-Job-Id
    const line = /^(batch_[0-9a-f]{24})\.\d+(~\d+)?$/.exec(r.id);
    if (!r.job) return "—";
    if (r.job.indexOf("key/") === 0) return line ? "batch " + line[1] : "untagged";
    return r.job;
  }

  function waited(r) {
    return r.state === "queued" ? r.waited_ms + (Date.now() - receivedAt) : r.waited_ms;
  }

  function renderRows() {
    tbody.textContent = "";
    if (!rows.length) {
      tbody.appendChild(el("tr", { "class": "empty" }, [el("td", { colspan: "9", text: "Nothing waiting or running." })]));
      return;
    }
    rows.forEach(function (r) {
      tbody.appendChild(el("tr", { "data-id": r.id, "class": r.state }, [
        el("td", { "data-label": "Request", text: r.id }), el("td", { "data-label": "Class", text: classCell(r) }), el("td", { "data-label": "Model", "class": "opt", text: r.model }),
        el("td", { "data-label": "State", text: r.state }),
        el("td", { "data-label": "Position", "class": "position", "data-position": r.position === null ? "—" : String(r.position), text: position(r) }),
        el("td", { "data-label": "Expected to start", "class": "eta", title: Format.slip(r), text: r.state === "running" ? "running" : Format.eta(r) + (Format.slip(r) ? " (later than first shown)" : "") }),
        el("td", { "data-label": "Waited", "class": "waited opt", text: ms(waited(r)) }),
        el("td", { "data-label": "Charge held", "class": "money opt", text: r.estimated_charge === null || r.estimated_charge === undefined ? "—" : "at most " + Live.money(r.estimated_charge) }),
        el("td", { "data-label": "Job", "class": "opt", text: jobName(r) }),
      ]));
    });
  }

  function renderCounts(queue) {
    counts.textContent = "";
    Object.keys(queue.counts).sort().forEach(function (cls) {
      const c = queue.counts[cls];
      counts.appendChild(el("span", { "class": "count", "data-class": cls, text: cls + ": " + c.queued + " waiting, " + c.running + " running" }));
    });
    total.textContent = queue.total ? "(" + queue.total + ")" : "";
    const first = (queue.offset || 0) + 1, last = (queue.offset || 0) + queue.rows.length;
    more.hidden = !queue.truncated;
    more.textContent = queue.truncated ? "Showing " + first + "–" + last + " of " + queue.total + ", nearest to service first." : "";
    pager.hidden = queue.total <= PAGE && !offset;
    document.getElementById("page-label").textContent = first + "–" + last + " of " + queue.total;
    document.getElementById("page-prev").disabled = !offset;
    document.getElementById("page-next").disabled = last >= queue.total;
  }

  // Paging: the first page is pushed live; a further one is read from the queue API every 2 s.
  const PAGE = 50;
  const pager = document.getElementById("queue-pager");
  let offset = 0, pageTimer = null;
  async function fetchPage() {
    const query = new URLSearchParams(window.CONSOLE_TENANT_QUERY.replace(/^\?/, ""));
    query.set("offset", offset); query.set("limit", PAGE);
    const response = await fetch("/console/api/queue/?" + query, { credentials: "same-origin" });
    if (!response.ok || !offset) return;
    const queue = await response.json();
    rows = queue.rows; receivedAt = Date.now(); renderRows(); renderCounts(queue);
  }
  function turn(by) {
    offset = Math.max(0, offset + by);
    clearInterval(pageTimer);
    pageTimer = offset ? setInterval(fetchPage, 2000) : null;
    if (offset) fetchPage();
    else if (lastPush) { rows = lastPush.rows; receivedAt = Date.now(); renderRows(); renderCounts(lastPush); }
  }
  document.getElementById("page-prev").addEventListener("click", function () { turn(-PAGE); });
  document.getElementById("page-next").addEventListener("click", function () { turn(PAGE); });

  function renderCard(request, charge, found) {
    card.hidden = false;
    card.textContent = "";
    if (!found) { card.appendChild(el("p", { text: "No request " + watchId + " of yours is live or finished in the last hour." })); return; }
    const items = [["Request", watchId]];
    if (request) {
      items.push(["State", request.state], ["Class", classCell(request)], ["Model", request.model || ""]);
      if (request.state === "queued") {
        items.push(["Position", String(request.position)], ["Expected to start", Format.eta(request)]);
        if (Format.slip(request)) items.push(["Later than first shown", Format.slip(request)]);
      }
      if (request.ended_because && request.state !== "completed") items.push(["Why it ended", request.ended_because]);
      items.push(["Waited", ms(request.waited_ms)]);
    }
    if (charge) items.push(["Charge", Live.money(charge.amount) + " (price ×" + charge.factor + ", " + charge.prompt_tokens + " tokens in, " + charge.completion_tokens + " out)"]);
    const dl = el("dl");
    items.forEach(function ([k, v]) { dl.appendChild(el("dt", { text: k })); dl.appendChild(el("dd", { "data-field": k.toLowerCase().replace(/ /g, "-"), text: v })); });
    card.appendChild(dl);
  }

  function cardFromRows() {
    if (!watchId) return;
    const row = rows.find(function (r) { return r.id === watchId; });
    if (row) { lastCard = { request: row, charge: lastCard && lastCard.charge, found: true }; renderCard(row, lastCard.charge, true); }
  }

  function addCharge(c) {
    const table = document.querySelector("#charges tbody");
    table.insertBefore(el("tr", { "data-id": c.request_id }, [
      el("td", { text: c.request_id }), el("td", { text: c["class"] }), el("td", { "class": "opt", text: c.prompt_tokens + "/" + c.completion_tokens }),
      el("td", { text: "×" + c.factor }), el("td", { "class": "money", text: Live.money(c.amount) }), el("td", { "class": "opt", text: Live.when(c.at) }),
    ]), table.firstChild);
    while (table.children.length > 20) table.removeChild(table.lastChild);
    if (watchId && c.request_id === watchId) {
      lastCard = { request: lastCard && lastCard.request, charge: c, found: true };
      renderCard(lastCard.request, c, true);
    }
  }

  function addEvent(listId, text) {
    const list = document.getElementById(listId);
    const muted = list.querySelector(".muted");
    if (muted) muted.remove();
    list.insertBefore(el("li", { text: text }), list.firstChild);
    while (list.children.length > 20) list.removeChild(list.lastChild);
  }

  function setBudget(b) {
    ["spent", "held", "remaining", "limit"].forEach(function (k) {
      const node = document.getElementById("budget-" + k);
      if (node && b[k] !== null && b[k] !== undefined) { node.dataset.amount = b[k]; node.textContent = Live.money(b[k]); }
    });
    drawBar(b);
  }

  function drawBar(b) {  // widths from the decimal texts (Format.percent): never parsed as floats
    const spent = document.getElementById("bar-spent"), held = document.getElementById("bar-held");
    const spentPct = Format.percent(b.spent, b.limit), heldPct = Format.percent(b.held, b.limit);
    if (!spent || spentPct === null) return;
    spent.style.width = Math.min(100, spentPct) + "%";
    held.style.width = Math.min(100, heldPct || 0) + "%";
  }

  const socket = Live.connect(window.CONSOLE_WS, function (msg) {
    if (msg.type === "update") {
      if (msg.queue) lastPush = msg.queue;
      if (msg.queue && !offset) { rows = msg.queue.rows; receivedAt = Date.now(); renderRows(); renderCounts(msg.queue); cardFromRows(); }
      (msg.charges || []).forEach(addCharge);
      (msg.downgrades || []).forEach(function (d) { addEvent("downgrades", d.request_id + ": " + d.from + " → " + d.to + " (rule " + d.rule + ")"); });
      (msg.alerts || []).forEach(function (a) {
        const what = a.runs_out_on ? " runs out on " + a.runs_out_on + " at the current burn" : " crossed " + a.threshold_pct + "%";
        addEvent("alerts", a.budget + what + ": spent " + Live.money(a.spent) + " of " + Live.money(a.limit));
      });
      if (msg.budget) setBudget(msg.budget);
      if (msg.batches) BatchCards.render(msg.batches);
      if (msg.jobs) JobCards.render(msg.jobs);
    } else if (msg.type === "card" && msg.id === watchId) {
      lastCard = msg;
      renderCard(msg.request, msg.charge, msg.found);
    }
  });

  document.getElementById("watch-form").addEventListener("submit", function (event) {
    event.preventDefault();
    watchId = document.getElementById("watch-id").value.trim() || null;
    lastCard = null;
    card.hidden = !watchId;
    socket.send({ type: "watch", id: watchId || "" });
    cardFromRows();
  });

  setInterval(function () {
    document.querySelectorAll("#queue-table tbody tr.queued").forEach(function (tr, i) {
      const r = rows.find(function (x) { return x.id === tr.dataset.id; });
      if (r) tr.querySelector(".waited").textContent = ms(waited(r));
    });
  }, 1000);

  const b = document.getElementById("budget");
  drawBar({ limit: document.getElementById("budget-limit").dataset.amount, spent: document.getElementById("budget-spent").dataset.amount,
            held: document.getElementById("budget-held").dataset.amount });

  // a failure's link on a job or batch card follows that request here
  document.addEventListener("click", function (event) {
    const link = event.target.closest("[data-follow]");
    if (!link) return;
    event.preventDefault();
    document.getElementById("watch-id").value = link.dataset.follow;
    document.getElementById("watch-form").requestSubmit();
    document.getElementById("follow").scrollIntoView({ block: "start" });
  });
})();
