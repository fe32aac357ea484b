"""Counting a fault round against the ledger, and the table / report of bench.faults.

Per round (its requests share the X-Request-Id prefix ``tag-``; the ledger keys them
``tenant/tag-i``, a further attempt ``tenant/tag-i#2``):

* tried, ended cleanly, served: from the clients' outcomes (bench.fault_load);
* charged exactly once: served requests with exactly one ``charge`` row (over all attempts);
* left held: ``hold`` rows of the round without a ``release`` row, when counted (as soon as nothing of the
  round is held and every served request is charged, or at the limit: 60 s after the fault by default);
* overspent: ``billing_budget`` rows with a limit and ``spent + held > limit`` (every budget);
* served-but-uncharged: served requests with no ``charge`` row;
* ``manage.py ledger verify``'s verdict.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

COLUMNS = (
    "fault",
    "tried",
    "ended cleanly",
    "served",
    "charged exactly once",
    "left held",
    "overspent",
    "served-but-uncharged",
    "ledger verify",
)
LOG_LEVELS = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b|Traceback")


@dataclass
class Count:
    fault: str
    tried: int = 0
    clean: int = 0
    served: int = 0
    charged_once: int = 0
    left_held: int = 0
    overspent: int = 0
    uncharged: int = 0
    charged_twice: int = 0
    charged_unserved: int = 0  # e.g. a stream cut by the backend: charged for what was relayed
    verify_failures: int = 0
    rounds: int = 0
    client: Counter = field(default_factory=Counter)  # how requests ended
    releases: Counter = field(default_factory=Counter)  # release reasons
    unbilled: Decimal = Decimal(0)
    log: Counter = field(default_factory=Counter)  # the gateway's warnings and errors, digested
    notes: list[str] = field(default_factory=list)

    @property
    def unclean(self) -> int:
        return self.tried - self.clean

    @property
    def target_met(self) -> bool:
        return not (self.left_held or self.overspent or self.uncharged or self.charged_twice or self.verify_failures)

    def merge(self, other: Count) -> None:
        for name in (
            "tried",
            "clean",
            "served",
            "charged_once",
            "left_held",
            "overspent",
            "uncharged",
            "charged_twice",
            "charged_unserved",
            "verify_failures",
            "rounds",
            "unbilled",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("client", "releases", "log"):
            getattr(self, name).update(getattr(other, name))
        self.notes += other.notes

    def row(self) -> tuple:
        verify = "ok" if not self.verify_failures else f"FAILED {self.verify_failures}/{self.rounds}"
        return (
            self.fault,
            self.tried,
            self.clean,
            self.served,
            f"{self.charged_once} / {self.served}",
            self.left_held,
            self.overspent,
            self.uncharged,
            verify,
        )


def _base(request_id: str) -> str:
    return request_id.split("/", 1)[1].split("#", 1)[0]


def ledger_count(stack, count: Count, tag: str, served: set[str]) -> None:
    """Fills the ledger's columns of ``count`` for the requests ``tag-*`` (``served``: their ids)."""
    rows = stack.query(
        "SELECT request_id, kind, reason, unbilled FROM billing_ledgerentry WHERE request_id LIKE %s", (f"%/{tag}-%",)
    )
    charges: Counter = Counter()
    holds, released = set(), set()
    for request_id, kind, reason, unbilled in rows:
        if kind == "charge":
            charges[_base(request_id)] += 1
            count.unbilled += Decimal(unbilled)
        elif kind == "hold":
            holds.add(request_id)
        elif kind == "release":
            released.add(request_id)
            count.releases[reason] += 1
    count.left_held = len(holds - released)
    count.charged_once = sum(charges[rid] == 1 for rid in served)
    count.uncharged = sum(charges[rid] == 0 for rid in served)
    count.charged_twice = sum(charges[rid] > 1 for rid in served)
    count.charged_unserved = sum(1 for rid in charges if rid not in served)
    ((count.overspent,),) = stack.query(
        'SELECT count(*) FROM billing_budget WHERE "limit" IS NOT NULL AND spent + held > "limit"'
    )


def settled(stack, tag: str, served: set[str]) -> bool:
    """Nothing of the round is held and every served request has its charge (the state a round is
    counted in; a round that never reaches it is counted at the bench's limit, and fails)."""
    probe = Count("probe")
    ledger_count(stack, probe, tag, served)
    return probe.left_held == 0 and probe.uncharged == 0


def round_count(stack, fault: str, tag: str, outcomes: list) -> Count:
    count = Count(
        fault,
        tried=len(outcomes),
        clean=sum(o.clean for o in outcomes),
        served=sum(o.served for o in outcomes),
        rounds=1,
    )
    count.client.update(o.how for o in outcomes)
    ledger_count(stack, count, tag, {o.ask.rid for o in outcomes if o.served})
    verify = stack.manage("ledger", "verify")
    if verify.returncode != 0:
        count.verify_failures = 1
        count.notes.append(f"ledger verify: {(verify.stderr or verify.stdout).strip()[-500:]}")
    return count


def log_digest(text: str) -> Counter:
    """Warning and error lines with their numbers, times and ids blanked, counted."""
    digest: Counter = Counter()
    for line in text.splitlines():
        if not LOG_LEVELS.search(line):
            continue
        line = re.sub(r"^\[?\d{4}-\d\d-\d\d [\d:,.]+:? ", "", line)  # the time stamp (gateway's, Celery's)
        line = re.sub(r"0x[0-9a-f]+|[0-9a-f]{8,}|\d+(\.\d+)?", "#", line)
        digest[line[:200]] += 1
    return digest


# --- output ------------------------------------------------------------------------------


def table(counts: list[Count]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(cell) for cell in c.row()) + " |" for c in counts]
    return "\n".join(lines)


def client_line(count: Count) -> str:
    return ", ".join(f"{how} {n}" for how, n in count.client.most_common())


def finance_line(count: Count) -> str:
    releases = ", ".join(f"{reason or '(none)'} {n}" for reason, n in count.releases.most_common())
    return (
        f"releases by reason: {releases or 'none'}; charged but not served (partial streams) "
        f"{count.charged_unserved}; served and charged more than once {count.charged_twice}; "
        f"unbilled {count.unbilled}"
    )


def machine() -> str:
    def version(argv: list[str]) -> str:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            return "?"

    return (
        f"{platform.node()}: {platform.system()} {platform.release()} {platform.machine()}, "
        f"{os.cpu_count()} cores (shared), Python {platform.python_version()}, "
        f"{version(['psql', '--version'])}, {version(['redis-server', '--version'])}"
    )


def report(counts: list[Count], *, command: str, date: str, settings: str, about: dict[str, tuple[str, str]]) -> str:
    """The markdown of bench/REPORT-faults.md; ``about``: fault -> (what it does, what finance expects)."""
    missed = [c for c in counts if not c.target_met]
    parts = [
        "# Fault runs against the production shape",
        "",
        f"`{command}` — {date}; machine: {machine()}.",
        "",
        f"Set-up: {settings}",
        "",
        "Targets, counted once the round's ledger settled (at most 60 s after each fault): 0 left held, "
        "0 overspent, 0 served-but-uncharged, every served "
        'request charged exactly once, `manage.py ledger verify` ok. "Ended cleanly": the client got a whole '
        'answer or an OpenAI-shaped error; "served": the whole body, or `[DONE]` for a stream.',
        "",
        table(counts),
        "",
        "Targets missed: " + (", ".join(c.fault for c in missed) if missed else "none") + ".",
        "",
    ]
    for c in counts:
        what, finance = about.get(c.fault, ("", ""))
        parts += [
            f"## {c.fault}",
            "",
            what,
            "",
            f"- **To a client:** {client_line(c)}.",
            f"- **To finance:** {finance} Measured: {finance_line(c)}; ledger verify "
            f"{'ok' if not c.verify_failures else 'FAILED'}.",
        ]
        parts += [f"- {note}" for note in dict.fromkeys(c.notes)]
        if c.log:
            parts += ["- Warnings and errors in the processes' logs (numbers blanked; the most frequent):", ""]
            parts += [f"  - {n} × `{line}`" for line, n in c.log.most_common(8)]
        parts.append("")
    return "\n".join(parts)
