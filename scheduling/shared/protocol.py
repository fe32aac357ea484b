"""What gateways tell the shared dispatcher, what it answers, and how one step applies to the engine.

Commands and answers are plain lists, msgpack-packed in batches (`pack`): one stream entry per
gateway turn, one list element of answers per commit. `Step` applies one batch at one instant and
then pumps (expire, dispatch), the same engine calls in the same order as the embedded
dispatcher; the engine being deterministic, replayed steps rebuild the same state. The commands,
the answers and the leases on running slots: docs/shared-scheduler.md, "The wire protocol".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from scheduling.engine import Scheduler
from scheduling.engine.circuits import Circuits
from scheduling.engine.model import BackendSpec, Request, RequestId

log = logging.getLogger(__name__)
Command = list[Any]
Answer = list[Any]


BATCH_MAX = 128  # commands per stream entry: a step takes a bounded amount of work per entry read
RUN_LEASE_MS = 30_000  # a running request's slot, granted or renewed this long ago, comes back
RUN_CHECK_MS = 1000  # how often a step looks for ended leases
RENEW_MAX = 1000  # request ids per renew command


def pack(messages: list[Any]) -> bytes:
    """A batch of commands or answers (or the owner's own commands of one step) for the wire."""
    return msgpack.packb(messages)  # type: ignore[no-any-return]


def _checked(found: object) -> list[Command | None]:
    if not isinstance(found, list):
        raise ValueError("not a list")
    return [c if isinstance(c, list) and c and isinstance(c[0], str) else None for c in found]


def unpack(raw: bytes) -> list[Command | None]:
    """`pack`'s list, each message checked (None for one that is not a message: skipped, by the
    owner and by every replay alike, so a bad entry can neither stop the dispatcher nor split its
    replicas); an empty list (logged) for a batch that cannot be read at all."""
    try:
        return _checked(msgpack.unpackb(raw))
    except (ValueError, TypeError, msgpack.UnpackException) as bad:  # ExtraData and FormatError are ValueErrors
        log.warning("skipping a malformed batch (%s): %r", bad, raw[:200])
        return []


def decode_json(raw: str | bytes) -> Command | None:
    """One command (or answer) as a JSON array: the format before the batches; None (logged) for one that is not."""
    try:
        return _checked([json.loads(raw)])[0]
    except ValueError:  # json's errors are ValueErrors too
        log.warning("skipping a malformed command: %r", raw[:200])
        return None


def decode_json_list(raw: str | bytes) -> list[Command | None]:
    """A JSON list of commands (the owner's own, logged with a step before the batches)."""
    try:
        return _checked(json.loads(raw))
    except ValueError:
        log.warning("skipping a step's malformed own commands: %r", raw[:200])
        return []


def entry_commands(fields: dict[bytes, bytes]) -> list[Command | None]:
    """The commands of one stream entry: a batch (``m``), or one JSON command (``c``)."""
    batch = fields.get(b"m")
    if batch is not None:
        return unpack(batch)
    one = fields.get(b"c")
    return [None if one is None else decode_json(one)]


def answers_of(raw: bytes) -> list[Answer]:
    """The answers in one element of a gateway's list: a batch, or one JSON answer."""
    if raw[:1] == b"[":  # no msgpack list starts with "[" (0x5b is a positive integer there)
        found = [decode_json(raw)]
    else:
        found = unpack(raw)
    return [answer for answer in found if answer is not None]


def submit(
    gateway: str,
    request_id: str,
    *,
    tenant: str,
    cls: str,
    model: str,
    prompt_tokens: int,
    expected_output_tokens: int,
    timeout_ms: int | None = None,
    vip: bool = False,
    job: str | None = None,
) -> Command:
    return [
        "submit",
        gateway,
        request_id,
        tenant,
        cls,
        model,
        prompt_tokens,
        expected_output_tokens,
        timeout_ms,
        vip,
        job,
    ]


def _circuits() -> Circuits:
    return Circuits(threshold=3, cooldown_ms=30_000)  # until a gateway's report brings its settings


@dataclass
class Routes:
    """The dispatcher's state beside the engine: which gateway waits for each live request, and
    the circuit breakers of the backends."""

    of: dict[str, str] = field(default_factory=dict)  # request id -> gateway id
    circuits: Circuits = field(default_factory=_circuits)
    leased: dict[str, int] = field(default_factory=dict)  # running request id -> its lease's end (ms)
    check_ms: int = 0  # the next step at or after this instant looks for ended leases

    def as_record(self) -> dict[str, Any]:
        """Plain data (the shared dispatcher's snapshot)."""
        return {"of": self.of, "circuits": self.circuits.as_record(), "leased": self.leased, "check_ms": self.check_ms}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Routes:
        return cls(
            dict(record["of"]), Circuits.from_record(record["circuits"]), dict(record["leased"]), record["check_ms"]
        )

    def live_of(self, gateway: str) -> list[str]:
        return [rid for rid, gw in self.of.items() if gw == gateway]

    def end(self, rid: str) -> str | None:
        """``rid`` is no longer live: its gateway (None: it was not)."""
        self.leased.pop(rid, None)
        return self.of.pop(rid, None)


class Step:
    """One step of the dispatcher: commands applied at ``now_ms``, then the pump. Collects the
    answers per gateway in ``out``."""

    def __init__(self, sched: Scheduler, routes: Routes, now_ms: int, backends: Iterable[BackendSpec] = ()) -> None:
        self.sched = sched
        self.routes = routes
        self.now_ms = now_ms
        self.backends = tuple(backends)  # as configured (the circuits disable some: `_backends_changed`)
        self.out: dict[str, list[Answer]] = {}

    def _tell(self, gateway: str | None, answer: Answer) -> None:
        if gateway is not None:
            self.out.setdefault(gateway, []).append(answer)

    def apply(self, commands: Iterable[Command | None]) -> None:
        """Each command in turn. One that is unknown or malformed, or that the engine refuses, is
        logged and skipped (deterministically: a replay skips it the same way)."""
        for command in commands:
            if command is None:
                continue
            handler = _HANDLERS.get(command[0])
            try:
                if handler is None:
                    raise ValueError(f"unknown command {command[0]!r}")
                handler(self, command)
            except (ValueError, TypeError, KeyError) as bad:
                log.warning("skipping command %r: %s", command[:3], bad)
                if command[0] == "submit" and len(command) > 2 and isinstance(command[2], str):
                    self._tell(
                        command[1] if isinstance(command[1], str) else None, ["refused", command[2], "invalid", None]
                    )

    def _backends_changed(self) -> None:
        self.sched.reconfigure(now_ms=self.now_ms, backends=self.routes.circuits.effective(self.backends, self.now_ms))

    def pump(self) -> None:
        sched, now_ms, routes = self.sched, self.now_ms, self.routes
        if routes.circuits.reopen_due(now_ms):  # cool-downs ended: half-open, back in the rotation
            self._backends_changed()
        for request in sched.expire(now_ms=now_ms):
            self._tell(routes.end(request.id), ["expired", request.id, max(0, now_ms - request.enqueued_ms)])
        if now_ms >= routes.check_ms:
            self._reclaim()
        for grant in sched.dispatch(now_ms=now_ms):
            rid = grant.request.id
            gateway = routes.of.get(rid)
            if gateway is None:  # nobody waits for it (cannot happen: ends and routes go together)
                sched.fail(rid, now_ms=now_ms, reason="cancelled")
                continue
            routes.leased[rid] = now_ms + RUN_LEASE_MS
            self._tell(gateway, ["granted", rid, grant.backend, grant.waited_ms, grant.preempt, grant.boosted])

    def _reclaim(self) -> None:
        """Running requests whose lease has ended are failed: their slots come back."""
        routes, now_ms = self.routes, self.now_ms
        routes.check_ms = now_ms + RUN_CHECK_MS
        for rid in [rid for rid, until_ms in routes.leased.items() if until_ms <= now_ms]:
            if self._running(rid):  # (its gateway logs it: every replica replays this step)
                self.sched.fail(RequestId(rid), now_ms=now_ms, reason="lease_ended")
            self._tell(routes.end(rid), ["reclaimed", rid])

    # --- the commands ----------------------------------------------------------------------

    def _submit(self, c: Command) -> None:
        _, gateway, rid, tenant, cls, model, prompt_tokens, output_tokens, timeout_ms, vip, *rest = c
        sched, now_ms = self.sched, self.now_ms
        if rid in self.routes.of or sched.state_of(RequestId(rid)) is not None:
            self._tell(gateway, ["refused", rid, "id_in_use", None])
            return
        request = Request(
            id=RequestId(rid),
            tenant=tenant,
            cls=cls,
            model=model,
            prompt_tokens=prompt_tokens,
            expected_output_tokens=output_tokens,
            enqueued_ms=now_ms,
            deadline_ms=None if timeout_ms is None else now_ms + timeout_ms,
            vip=vip,
            job=rest[0] if rest else None,
        )
        admission = sched.submit(request, now_ms=now_ms)
        if not admission.admitted:
            self._tell(gateway, ["refused", rid, admission.reason, admission.retry_after_ms])
            return
        self.routes.of[rid] = gateway
        self._tell(gateway, ["admitted", rid])

    def _running(self, rid: str) -> bool:
        return self.sched.state_of(RequestId(rid)) == "running"

    def _complete(self, c: Command) -> None:
        _, rid, prompt_tokens, output_tokens = c
        if self._running(rid):
            backend = self.sched.backend_of(RequestId(rid))
            if backend is not None:
                self.routes.circuits.success(backend)
            self.sched.complete(
                RequestId(rid), now_ms=self.now_ms, prompt_tokens=prompt_tokens, output_tokens=output_tokens
            )
        self.routes.end(rid)

    def _fail(self, c: Command) -> None:
        _, rid, reason = c
        if self._running(rid):
            self.sched.fail(RequestId(rid), now_ms=self.now_ms, reason=reason)
        self.routes.end(rid)

    def _requeue(self, c: Command) -> None:
        _, rid, retry_after_ms = c
        if self._running(rid):
            self.sched.requeue(RequestId(rid), now_ms=self.now_ms, backend_retry_after_ms=max(0, retry_after_ms))
            self.routes.leased.pop(rid, None)  # waiting again: leased anew when granted

    def _cancel(self, c: Command) -> None:
        _, rid = c
        gateway = self.routes.of.get(rid)
        left = self.sched.cancel(RequestId(rid), now_ms=self.now_ms)
        if left:
            self.routes.end(rid)
        self._tell(gateway, ["cancelled", rid, left])

    def _upstream(self, c: Command) -> None:
        _, backend, ok, threshold, cooldown_ms = c
        circuits = self.routes.circuits
        circuits.threshold, circuits.cooldown_ms = int(threshold), int(cooldown_ms)
        if ok:
            circuits.success(backend)
        elif circuits.failure(backend, self.now_ms):
            log.warning("circuit open for backend %s for %d ms (shared dispatcher)", backend, cooldown_ms)
            self._backends_changed()

    def _gone(self, c: Command) -> None:
        _, gateway = c
        for rid in self.routes.live_of(gateway):
            key = RequestId(rid)
            state = self.sched.state_of(key)
            if state == "queued":  # a policy that ignores cancels grants it later: failed at once then (`pump`)
                self.sched.cancel(key, now_ms=self.now_ms)
            elif state == "running":
                self.sched.fail(key, now_ms=self.now_ms, reason="gateway_gone")
            self.routes.end(rid)

    def _renew(self, c: Command) -> None:
        _, gateway, rids = c
        routes, until_ms = self.routes, self.now_ms + RUN_LEASE_MS
        for rid in rids:
            if routes.of.get(rid) == gateway and self._running(rid):
                routes.leased[rid] = until_ms


_HANDLERS = {
    "submit": Step._submit,
    "complete": Step._complete,
    "fail": Step._fail,
    "requeue": Step._requeue,
    "cancel": Step._cancel,
    "upstream": Step._upstream,
    "gone": Step._gone,
    "renew": Step._renew,
}
