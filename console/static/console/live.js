// Fairgate console: the WebSocket to /ws/console/ (session-authenticated), with reconnects,
// and small formatting helpers shared by the pages. No framework.
"use strict";
window.Live = (function () {
  function connect(path, onMessage) {
    const status = document.getElementById("live-status");
    let socket = null;
    let retryMs = 500;
    function setStatus(text, on) {
      if (!status) return;
      status.textContent = text;
      status.className = "status " + (on ? "on" : "off");
    }
    function open() {
      const scheme = location.protocol === "https:" ? "wss://" : "ws://";
      socket = new WebSocket(scheme + location.host + path);
      socket.onopen = function () { retryMs = 500; setStatus("live", true); };
      socket.onmessage = function (event) {
        try { onMessage(JSON.parse(event.data)); } catch (err) { console.error(err); }
      };
      socket.onclose = function (event) {
        // 4401 signed out or deactivated, 4403 role or tenant changed: the page itself is re-checked
        if (event.code === 4401 || event.code === 4403) { setStatus("access changed", false); location.reload(); return; }
        setStatus("reconnecting…", false);
        setTimeout(open, retryMs);
        retryMs = Math.min(retryMs * 2, 10000);
      };
    }
    open();
    return { send: function (obj) { if (socket && socket.readyState === 1) socket.send(JSON.stringify(obj)); } };
  }

  const ms = Format.duration;  // console/static/console/format.js

  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    Object.entries(attrs || {}).forEach(function ([k, v]) {
      if (k === "text") node.textContent = v; else node.setAttribute(k, v);
    });
    (children || []).forEach(function (c) { node.appendChild(typeof c === "string" ? document.createTextNode(c) : c); });
    return node;
  }

  // A card's failures: how many and why (in words), and its latest ones, each a link that follows
  // that request on the page ("Follow one request").
  function failures(card) {
    if (!card.failed_by_reason || !card.failed_by_reason.length) return null;
    const why = card.failed_by_reason.map(function (r) { return r.count + " × " + (r.because || r.reason); }).join("; ");
    const list = el("ul", { "class": "failure-list" });
    (card.failures || []).forEach(function (f) {
      list.appendChild(el("li", {}, [el("a", { href: "#follow", "data-follow": f.id, text: f.id }), " — " + (f.because || f.reason)]));
    });
    return el("details", { "class": "failures" }, [el("summary", { text: "Why they failed: " + why }), list]);
  }

  function when(iso) {
    if (!iso) return "";
    const d = new Date(iso);
    return isNaN(d) ? iso : d.toLocaleString();
  }

  document.querySelectorAll(".when").forEach(function (n) { n.textContent = when(n.textContent.trim()); });
  return { connect: connect, ms: ms, el: el, when: when, money: Format.money, failures: failures };
})();
