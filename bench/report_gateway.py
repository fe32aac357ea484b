"""bench/REPORT-gateway.md: the live benchmarks' results, one generated section per benchmark.

bench/report.py regenerates REPORT.md from simulator runs; the live benchmarks (gateway
overhead, surge replay) write here instead, each replacing only its own section.
"""

from __future__ import annotations

import re
from pathlib import Path

REPORT_PATH = Path(__file__).resolve().parent / "REPORT-gateway.md"
TITLE = (
    "# Fairgate live benchmarks\n\nMeasured against the real gateway (`manage.py serve`) and the simulated "
    "GPU backend over HTTP on this machine; each section is rewritten by the command named in it.\n"
)
ORDER = ("overhead", "surge")


def section_write(name: str, markdown: str, path: Path = REPORT_PATH) -> Path:
    text = path.read_text(encoding="utf-8") if path.exists() else TITLE
    block = f"<!-- begin:{name} -->\n{markdown.strip()}\n<!-- end:{name} -->\n"
    pattern = re.compile(rf"<!-- begin:{re.escape(name)} -->.*?<!-- end:{re.escape(name)} -->\n?", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        later = [n for n in ORDER[ORDER.index(name) + 1 :] if f"<!-- begin:{n} -->" in text] if name in ORDER else []
        if later:
            marker = f"<!-- begin:{later[0]} -->"
            text = text.replace(marker, block + "\n" + marker, 1)
        else:
            text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text, encoding="utf-8")
    return path
