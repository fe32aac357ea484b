"""Backend capacity: which backend, if any, can take a request now.

A backend takes a request when it is enabled, serves its model, is not under a 429 hold, has a free
slot, and its sliding TPM/RPM windows admit it; reserved slots are the top class's and VIP tenants';
a fallback backend serves VIP requests only, when no primary can. The rules: docs/engine.md,
"Capacity".
"""

from __future__ import annotations

from collections.abc import Iterable

from .model import BackendSpec
from .store import SchedulerStore

WINDOW_MS = 60_000


class BackendState:
    __slots__ = (
        "spec",
        "name",
        "slots",
        "reserved",
        "busy",
        "hold_until_ms",
        "tpm",
        "rpm",
        "limited",
        "enabled",
        "removed",
    )

    def __init__(self, spec: BackendSpec, busy: int = 0, hold_until_ms: int = 0) -> None:
        self.spec = spec
        self.name = spec.name
        self.slots = spec.slots
        self.reserved = min(spec.reserved_slots, spec.slots)
        self.busy = busy
        self.hold_until_ms = hold_until_ms
        self.tpm = spec.tpm
        self.rpm = spec.rpm
        self.limited = spec.tpm is not None or spec.rpm is not None
        self.enabled = spec.enabled
        self.removed = False  # dropped from the configuration, draining its running requests


class Capacity:
    def __init__(self, backends: Iterable[BackendSpec], store: SchedulerStore) -> None:
        self._store = store
        self.states: dict[str, BackendState] = {}
        self._primaries: dict[str, tuple[BackendState, ...]] = {}
        self._fallbacks: dict[str, tuple[BackendState, ...]] = {}
        self._enabled: tuple[BackendState, ...] = ()
        self.total_slots = 0
        self.total_reserved = 0
        self.reconfigure(backends)

    def reconfigure(self, backends: Iterable[BackendSpec]) -> None:
        """New specs; busy slots and holds carry over by name; a removed backend drains (disabled)."""
        old = self.states
        states: dict[str, BackendState] = {}
        for spec in backends:
            prev = old.get(spec.name)
            states[spec.name] = BackendState(spec, prev.busy if prev else 0, prev.hold_until_ms if prev else 0)
        for name, prev in old.items():
            if name not in states and prev.busy > 0:
                gone = BackendState(prev.spec, prev.busy, prev.hold_until_ms)
                gone.enabled = False
                gone.removed = True
                states[name] = gone
        self.states = states
        self._index()

    def _index(self) -> None:
        primaries: dict[str, list[BackendState]] = {}
        fallbacks: dict[str, list[BackendState]] = {}
        self.total_slots = self.total_reserved = 0
        for state in self.states.values():
            if not state.enabled:
                continue
            target = fallbacks if state.spec.fallback_for else primaries
            for model in state.spec.models:
                target.setdefault(model, []).append(state)
            if not state.spec.fallback_for:
                self.total_slots += state.slots
                self.total_reserved += state.reserved
        self._primaries = {m: tuple(v) for m, v in primaries.items()}
        self._fallbacks = {m: tuple(v) for m, v in fallbacks.items()}
        self._enabled = tuple(state for state in self.states.values() if state.enabled)

    def serves(self, model: str, vip: bool) -> bool:
        """Whether any enabled backend could ever take a request for ``model``."""
        return model in self._primaries or (vip and model in self._fallbacks)

    def model_slots(self, model: str) -> int:
        return sum(s.slots for s in self._primaries.get(model, ()))

    def model_reserved(self, model: str) -> int:
        """Slots of the model's primary backends reserved for the top class and VIP tenants."""
        return sum(s.reserved for s in self._primaries.get(model, ()))

    def free_slots(self, model: str, now_ms: int) -> int:
        """Free slots of the model's primary backends that are not under a 429 hold."""
        return sum(max(0, s.slots - s.busy) for s in self._primaries.get(model, ()) if s.hold_until_ms <= now_ms)

    def any_free(self, now_ms: int) -> bool:
        for state in self._enabled:
            if state.busy < state.slots and state.hold_until_ms <= now_ms:
                return True
        return False

    def place(self, model: str, privileged: bool, vip: bool, est_tokens: int, now_ms: int) -> BackendState | None:
        best = self._best(self._primaries.get(model, ()), privileged, est_tokens, now_ms)
        if best is None and vip:
            best = self._best(self._fallbacks.get(model, ()), True, est_tokens, now_ms)
        return best

    def _best(
        self, candidates: tuple[BackendState, ...], privileged: bool, est_tokens: int, now_ms: int
    ) -> BackendState | None:
        best = None
        best_free = 0
        for state in candidates:
            free = state.slots - state.busy - (0 if privileged else state.reserved)
            if free <= best_free or state.hold_until_ms > now_ms:
                continue
            if state.limited and not self._window_admits(state, est_tokens, now_ms):
                continue
            best, best_free = state, free
        return best

    def _window_admits(self, state: BackendState, est_tokens: int, now_ms: int) -> bool:
        tokens, requests, _ = self._store.window_usage(state.name, now_ms, WINDOW_MS)
        if state.rpm is not None and requests + 1 > state.rpm:
            return False
        if state.tpm is not None and requests and tokens + est_tokens > state.tpm:
            return False
        return True

    def occupy(self, state: BackendState, est_tokens: int, now_ms: int) -> int | None:
        """Take a slot; returns the window handle used to reconcile tokens later."""
        state.busy += 1
        if state.limited:
            return self._store.window_add(state.name, now_ms, est_tokens)
        return None

    def release(self, name: str, handle: int | None, token_delta: int) -> None:
        """Free a slot on ``name`` and correct its TPM sample by ``token_delta`` tokens."""
        state = self.states.get(name)
        if state is None:
            return
        state.busy -= 1
        if handle is not None and token_delta:
            self._store.window_adjust(name, handle, token_delta)
        if state.removed and state.busy <= 0:
            del self.states[name]

    def hold(self, name: str, until_ms: int) -> None:
        state = self.states.get(name)
        if state is not None and until_ms > state.hold_until_ms:
            state.hold_until_ms = until_ms

    def next_reopen_ms(self, now_ms: int) -> int | None:
        """Earliest future ms at which a hold ends or a window sample leaves its window."""
        best: int | None = None
        for state in self.states.values():
            if not state.enabled:
                continue
            if state.hold_until_ms > now_ms and (best is None or state.hold_until_ms < best):
                best = state.hold_until_ms
            if state.limited:
                _, count, oldest = self._store.window_usage(state.name, now_ms, WINDOW_MS)
                if oldest is not None and (best is None or oldest + WINDOW_MS < best):
                    best = oldest + WINDOW_MS
        return best
