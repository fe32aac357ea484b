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

  function ms(value) {
    if (value === null || value === undefined) return "—";
    if (value < 1000) return value + " ms";
    if (value < 60000) return (value / 1000).toFixed(1) + " s";
    if (value < 3600000) return Math.floor(value / 60000) + " min " + Math.round((value % 60000) / 1000) + " s";
    return (value / 3600000).toFixed(1) + " h";
  }

  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    Object.entries(attrs || {}).forEach(function ([k, v]) {
      if (k === "text") node.textContent = v; else node.setAttribute(k, v);
    });
    (children || []).forEach(function (c) { node.appendChild(typeof c === "string" ? document.createTextNode(c) : c); });
    return node;
  }

  function when(iso) {
    if (!iso) return "";
    const d = new Date(iso);
    return isNaN(d) ? iso : d.toLocaleString();
  }

  document.querySelectorAll(".when").forEach(function (n) { n.textContent = when(n.textContent.trim()); });
  return { connect: connect, ms: ms, el: el, when: when };
})();
