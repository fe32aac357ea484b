"""Money and durations as the console writes them: one function on the server
(console.formatting, its template filters) and one in the browser (console/static/console/format.js,
run here under node on the same table), giving the same text; never a float, never "60 s"."""

from __future__ import annotations

import json
import shutil
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest
from django.template import Context, Template
from django.test import override_settings

from console.formatting import duration_text, ended_because, money_text

FORMAT_JS = Path(__file__).resolve().parents[3] / "console" / "static" / "console" / "format.js"

MONEY = [  # (decimal text, expected): cents; two significant digits only below a cent
    ("0.0545219999999999", "USD 0.05"),
    ("0.265500", "USD 0.27"),
    ("60000.000000", "USD 60,000.00"),
    ("0", "USD 0.00"),
    ("0.000000", "USD 0.00"),
    ("0.00054521", "USD 0.00055"),
    ("0.00996", "USD 0.01"),
    ("0.005", "USD 0.0050"),
    ("-0.004", "USD -0.0040"),
    ("-12.345", "USD -12.35"),
    ("1234567.891", "USD 1,234,567.89"),
    ("5E-7", "USD 0.00000050"),
    ("0.1", "USD 0.10"),
]

DURATIONS = [  # (ms, expected): rounded once, so never "60 s" or "60 min"
    (0, "0 ms"),
    (999, "999 ms"),
    (1000, "1.0 s"),
    (59_949, "59.9 s"),
    (59_950, "1 min"),
    (119_499, "1 min 59 s"),
    (119_600, "2 min"),
    (179_999, "3 min"),
    (3_599_499, "59 min 59 s"),
    (3_599_500, "1 h"),
    (5_000_000, "1 h 23 min"),
    (7_199_999, "2 h"),
]


@pytest.mark.parametrize(("text", "expected"), MONEY)
def test_money_on_the_server(text, expected):
    assert money_text(text, "USD") == expected
    assert money_text(Decimal(text), "USD") == expected


def test_money_is_never_a_float_and_uses_the_configured_currency():
    with pytest.raises(TypeError):
        money_text(0.1)
    assert money_text(None) == money_text("") == money_text("nonsense") == "—"
    with override_settings(FAIRGATE_CURRENCY="EUR"):
        assert money_text("60000") == "EUR 60,000.00"
        rendered = Template("{% load console_format %}{{ v|money }} · {{ ms|duration }} · {% currency %}").render(
            Context({"v": Decimal("0.0545219999999999"), "ms": 119_600})
        )
        assert rendered == "EUR 0.05 · 2 min · EUR"


@pytest.mark.parametrize(("ms", "expected"), DURATIONS)
def test_duration_on_the_server(ms, expected):
    assert duration_text(ms) == expected


def test_no_duration_ever_reads_60():
    texts = {duration_text(ms) for ms in range(0, 7_300_000, 137)}
    assert not [t for t in texts if " 60 " in f" {t} " or t.startswith("60 ")]


def test_reasons_are_words():
    assert ended_because("cancelled").startswith("the client gave up")
    assert ended_because("queue_timeout").startswith("queue timeout")
    assert ended_because("budget_exhausted").startswith("budget exhausted")
    assert ended_because("upstream_error").startswith("upstream error")
    assert ended_because("something_new") == "something new"


def _node(script: str) -> object:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is missing (the browser's formatter is tested under it): apt-get install -y nodejs")
    out = subprocess.run(
        [node, "-e", f"const F = require({json.dumps(str(FORMAT_JS))});\n{script}"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return json.loads(out.stdout)


def test_the_browser_formats_as_the_server_does():
    cases = json.dumps({"money": [t for t, _ in MONEY], "durations": [ms for ms, _ in DURATIONS]})
    got = _node(
        f"const c = {cases};"
        "console.log(JSON.stringify({money: c.money.map(t => F.money(t, 'USD')),"
        " durations: c.durations.map(F.duration),"
        " sweep: Array.from({length: 53300}, (_, i) => F.duration(i * 137))}));"
    )
    assert got["money"] == [e for _, e in MONEY]
    assert got["durations"] == [e for _, e in DURATIONS]
    assert got["sweep"] == [duration_text(i * 137) for i in range(53_300)]  # the same on every input


def test_the_browser_never_parses_money_as_a_float():
    source = FORMAT_JS.read_text()
    assert "parseFloat" not in source and "Number(text" not in source
    got = _node(
        "console.log(JSON.stringify([F.money('0.1000000000000000055511151231257827', 'USD'),"
        " F.money('123456789012345678.005', 'EUR'), F.percent('30', '60000.000000'), F.cents('-12.345')]))"
    )
    assert got == ["USD 0.10", "EUR 123,456,789,012,345,678.01", 0.05, -1235]


def test_eta_words_in_the_browser():
    got = _node(
        "const now = Date.UTC(2026, 0, 1, 12, 0);"
        "console.log(JSON.stringify([F.eta({eta_ms: 120000, eta_upper_ms: 240000}, now),"
        " F.eta({eta_ms: 20000, eta_upper_ms: 38000}, now), F.eta({eta_ms: 119600}, now),"
        " F.eta({eta_ms: 5000, eta_confidence: 'prior'}, now),"
        " F.eta({eta_ms: 1800000, eta_upper_ms: 3600000}, now).slice(0, 3),"
        " F.slip({eta_ms: 300000, eta_slip_reason: 'higher_class', eta_first_at_ms: now}, now),"
        " F.slip({eta_ms: 1000}, now)]))"
    )
    assert got[:4] == [
        "about 2–4 min",
        "about 20–38 s",
        "about 2 min",
        "no estimate yet: first requests of this class today",
    ]
    assert got[4] == "by "  # an hour or more: the clock time in the viewer's zone
    assert got[5].startswith("Later than first shown") and "more urgent class" in got[5]
    assert got[6] == ""
