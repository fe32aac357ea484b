// The console's formatting, one function each, the same rules as the server's console/formatting.py
// (tests/integration/console/test_formatting.py runs both on one table): money from its decimal
// text with BigInt (never parsed as a float), durations rounded once (never "60 s"), and ETAs as
// ranges or "by HH:MM" with the engine's confidence and slip reason in words.
"use strict";
(function (root) {
  const NONE = "—";

  function groups(digits) { return digits.replace(/\B(?=(\d{3})+(?!\d))/g, ","); }

  function roundTo(n, scale, places) {  // n * 10^-scale to `places` decimals, half away from zero, as BigInt
    if (places >= scale) return n * 10n ** BigInt(places - scale);
    const div = 10n ** BigInt(scale - places);
    return (n + div / 2n) / div;
  }

  function money(text, currency) {
    if (text === null || text === undefined || text === "") return NONE;
    const m = /^\s*([+-]?)(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?\s*$/.exec(String(text));
    if (!m || (!m[2] && !m[3])) return NONE;
    let n = BigInt((m[2] || "") + (m[3] || "") || "0");
    let scale = (m[3] || "").length - parseInt(m[4] || "0", 10);
    if (scale < 0) { n = n * 10n ** BigInt(-scale); scale = 0; }
    let places = 2;
    if (n !== 0n && n * 100n < 10n ** BigInt(scale)) places = scale - (n.toString().length - 2);  // two significant digits
    let shown = roundTo(n, scale, places);
    if (places > 2 && shown * 100n >= 10n ** BigInt(places)) { places = 2; shown = roundTo(n, scale, 2); }
    const digits = shown.toString().padStart(places + 1, "0");
    const whole = groups(digits.slice(0, digits.length - places)), frac = digits.slice(digits.length - places);
    const sign = m[1] === "-" && shown !== 0n ? "-" : "";
    const cur = currency || (root.document && root.document.body && root.document.body.dataset.currency) || "USD";
    return cur + " " + sign + whole + (places ? "." + frac : "");
  }

  function parse(text) {  // decimal text -> [BigInt digits, scale] (value = digits * 10^-scale), or null
    const m = /^\s*([+-]?)(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?\s*$/.exec(String(text === null || text === undefined ? "" : text));
    if (!m || (!m[2] && !m[3])) return null;
    let n = BigInt((m[2] || "") + (m[3] || "") || "0");
    let scale = (m[3] || "").length - parseInt(m[4] || "0", 10);
    if (scale < 0) { n = n * 10n ** BigInt(-scale); scale = 0; }
    return [m[1] === "-" ? -n : n, scale];
  }

  // Whole cents of a decimal text, as a Number (for a chart's axis or a bar's width only): the
  // amount itself is never parsed as a float.
  function cents(text) {
    const p = parse(text);
    if (!p) return null;
    const neg = p[0] < 0n, n = neg ? -p[0] : p[0];
    const c = roundTo(n, p[1], 2);
    return Number(neg ? -c : c);
  }

  // ``part`` as a percentage of ``whole`` (decimal texts), to 0.01 %; null where whole is not above 0.
  function percent(part, whole) {
    const a = parse(part), b = parse(whole);
    if (!a || !b || b[0] <= 0n) return null;
    const scale = Math.max(a[1], b[1]);
    const x = a[0] * 10n ** BigInt(scale - a[1]), y = b[0] * 10n ** BigInt(scale - b[1]);
    return Number((x * 10000n) / y) / 100;
  }

  function duration(value) {
    if (value === null || value === undefined) return NONE;
    const ms = Math.max(0, Math.trunc(value));
    if (ms < 1000) return ms + " ms";
    const tenths = Math.floor((ms + 50) / 100);
    if (tenths < 600) return Math.floor(tenths / 10) + "." + (tenths % 10) + " s";
    const seconds = Math.floor((ms + 500) / 1000);
    if (seconds < 3600) {
      const min = Math.floor(seconds / 60), rest = seconds % 60;
      return rest ? min + " min " + rest + " s" : min + " min";
    }
    const minutes = Math.floor((seconds + 30) / 60), h = Math.floor(minutes / 60), mm = minutes % 60;
    return mm ? h + " h " + mm + " min" : h + " h";
  }

  const SLIP = {
    higher_class: "requests of a more urgent class came first",
    fair_share: "other departments' fair turns came first",
    circuit_open: "the model's server is failing, so nothing is sent to it for now",
  };

  function clock(epochMs) {
    return new Date(epochMs).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  }

  function around(lo, hi, unitMs, unit) {
    const a = Math.max(1, Math.round(lo / unitMs)), b = Math.max(a, Math.round(hi / unitMs));
    return "about " + (a === b ? a : a + "–" + b) + " " + unit;
  }

  // An ETA in words from the engine's fields (all but eta_ms optional): a range under an hour,
  // else "by HH:MM" in the viewer's time zone.
  function eta(row, nowMs) {
    if (!row || row.eta_ms === null || row.eta_ms === undefined) return "not known yet";
    if (row.eta_confidence === "prior") return "no estimate yet: first requests of this class today";
    if (row.eta_confidence === "blocked") return "no estimate: " + (SLIP[row.eta_slip_reason] || "nothing can start now");
    const lo = row.eta_ms, hi = row.eta_upper_ms === null || row.eta_upper_ms === undefined ? lo : Math.max(lo, row.eta_upper_ms);
    if (hi < 1000) return "any moment";
    if (hi >= 3600000) return "by " + clock((nowMs || Date.now()) + hi);
    if (hi === lo) return "about " + duration(lo);
    if (hi < 60000) return around(lo, hi, 1000, "s");
    return around(lo, hi, 60000, "min");
  }

  // Why an ETA slipped past what was first shown, in words; "" where it did not.
  function slip(row, nowMs) {
    if (!row || !row.eta_slip_reason) return "";
    const first = row.eta_first_at_ms ? " (first expected to start by " + clock(row.eta_first_at_ms) + ")" : "";
    const late = row.eta_first_at_ms && row.eta_ms !== null && row.eta_ms !== undefined && (nowMs || Date.now()) + row.eta_ms <= row.eta_first_at_ms;
    if (late) return "";
    return "Later than first shown" + first + ": " + (SLIP[row.eta_slip_reason] || row.eta_slip_reason.replace(/_/g, " ")) + ".";
  }

  const api = { money: money, duration: duration, eta: eta, slip: slip, cents: cents, percent: percent, SLIP: SLIP };
  if (typeof module !== "undefined" && module.exports) module.exports = api; else root.Format = api;
})(typeof window !== "undefined" ? window : globalThis);
