"""The clients of a fault run and how each request ended, with the official `openai` SDK.

A load is ``count`` requests spread evenly over ``duration_s`` (request i is due at i x duration/count)
and sent by ``clients`` threads, each with a client of its own (``max_retries=0``: every try is
counted once). Each request has an X-Request-Id of its own; tenants, streaming and max_tokens are
drawn from a seeded mix. How a request ended:

* served: the client got the whole body (non-streamed: a parsed completion) or, streamed,
  ``data: [DONE]`` (read off the raw SSE lines: the SDK's iterator hides the end marker);
* a clean error: an OpenAI-shaped error, as an HTTP status or as an error event in the stream;
* anything else (connection refused or reset, a stream cut without an end, a timeout) is unclean.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import openai

from bench.fault_hostile import KINDS, hostile_send

MODEL = "m"
PROMPTS = (
    "Summarise the quarterly GPU usage.",
    "Write a haiku about queues.",
    "Explain weighted fair queuing to a new engineer.",
    "List three ways a budget hold can end.",
)


@dataclass(frozen=True)
class Ask:
    rid: str  # X-Request-Id
    key: str  # API key name (bench.faults: the tenant's slug)
    stream: bool
    max_tokens: int
    prompt: str
    kind: str = "plain"  # or one of bench.fault_hostile.KINDS


@dataclass
class Outcome:
    ask: Ask
    served: bool
    clean: bool
    how: str  # "served", "402 budget_exhausted", "stream error upstream_error", "connection", ...
    ended_s: float = 0.0


def plan(
    tag: str, count: int, mix: dict[str, float], *, seed: int, stream_share: float = 0.5, hostile_share: float = 0.0
) -> list[Ask]:
    """``count`` requests named ``tag-<i>``; ``mix`` is key name -> share of the requests;
    ``hostile_share`` of them hostile (bench.fault_hostile), of each kind alike."""
    rng = random.Random(seed)
    names, weights = list(mix), list(mix.values())
    return [
        Ask(
            f"{tag}-{i}",
            rng.choices(names, weights)[0],
            rng.random() < stream_share,
            rng.randint(16, 64),
            rng.choice(PROMPTS),
            rng.choice(KINDS) if rng.random() < hostile_share else "plain",
        )
        for i in range(count)
    ]


def _error_of(body: object) -> dict | None:
    """The ``error`` object of an OpenAI-shaped error body, else None."""
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) and error.get("message") and error.get("code") else None


def _status_error(err: openai.APIStatusError) -> str:
    try:
        error = _error_of(err.response.json())
    except (ValueError, json.JSONDecodeError):
        error = None
    if error is None:
        return f"{err.status_code} not OpenAI-shaped"
    return f"{err.status_code} {error['code']}"


def _plain(client: openai.OpenAI, ask: Ask) -> tuple[bool, bool, str]:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": ask.prompt}],
        max_tokens=ask.max_tokens,
        extra_headers={"X-Request-Id": ask.rid},
    )
    completion = raw.parse()
    return (True, True, "served") if completion.choices else (False, False, "empty answer")


def _streamed(client: openai.OpenAI, ask: Ask, streaming: Counter, lock: threading.Lock) -> tuple[bool, bool, str]:
    with client.chat.completions.with_streaming_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": ask.prompt}],
        max_tokens=ask.max_tokens,
        stream=True,
        extra_headers={"X-Request-Id": ask.rid},
    ) as response:
        with lock:
            streaming["open"] += 1
        try:
            for line in response.iter_lines():
                if line.startswith("data: [DONE]"):
                    return True, True, "served"
                if line.startswith("data: ") and '"error"' in line:
                    error = _error_of(json.loads(line[6:]))
                    return (False, True, f"stream error {error['code']}") if error else (False, False, "bad event")
            return False, False, "stream ended without [DONE]"
        finally:
            with lock:
                streaming["open"] -= 1


def send(client: openai.OpenAI, ask: Ask, streaming: Counter, lock: threading.Lock) -> Outcome:
    try:
        if ask.kind != "plain":
            served, clean, how = hostile_send(client, ask)
        elif ask.stream:
            served, clean, how = _streamed(client, ask, streaming, lock)
        else:
            served, clean, how = _plain(client, ask)
    except openai.APIStatusError as err:
        how = _status_error(err)
        served, clean = False, not how.endswith("not OpenAI-shaped")
    except openai.APITimeoutError:
        served, clean, how = False, False, "timeout"
    except openai.APIConnectionError as err:
        served, clean, how = False, False, f"connection ({_cause(err)})"
    except Exception as err:  # noqa: BLE001 - a transport error inside a stream (the raw lines are not wrapped)
        served, clean, how = False, False, f"cut ({type(err).__name__})"
    return Outcome(ask, served, clean, how, time.monotonic())


def _cause(err: BaseException) -> str:
    while err.__cause__ is not None:
        err = err.__cause__
    text = str(err).lower()
    for word in ("refused", "reset", "disconnected", "closed", "incomplete"):
        if word in text:
            return word
    return type(err).__name__


@dataclass
class Load:
    """``asks`` sent by ``clients`` threads; `start`, then `join`."""

    base_url: str
    keys: dict[str, str]
    asks: list[Ask]
    duration_s: float
    clients: int = 12
    timeout_s: float = 60.0
    outcomes: list[Outcome] = field(default_factory=list)
    started_s: float = 0.0
    _next: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _streaming: Counter = field(default_factory=Counter)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Load:
        self.started_s = time.monotonic()
        self._threads = [
            threading.Thread(target=self._client, name=f"client-{n}", daemon=True) for n in range(self.clients)
        ]
        for thread in self._threads:
            thread.start()
        return self

    def streams_open(self) -> int:
        return self._streaming["open"]

    def join(self) -> list[Outcome]:
        for thread in self._threads:
            thread.join(self.duration_s + 3 * self.timeout_s)
        return self.outcomes

    def _take(self) -> Ask | None:
        with self._lock:
            if self._next >= len(self.asks):
                return None
            index, self._next = self._next, self._next + 1
        delay_s = self.started_s + index * self.duration_s / len(self.asks) - time.monotonic()
        if delay_s > 0:
            time.sleep(delay_s)
        return self.asks[index]

    def _client(self) -> None:
        clients: dict[str, openai.OpenAI] = {}
        while (ask := self._take()) is not None:
            if ask.key not in clients:
                clients[ask.key] = openai.OpenAI(
                    base_url=f"{self.base_url}/v1", api_key=self.keys[ask.key], max_retries=0, timeout=self.timeout_s
                )
            outcome = send(clients[ask.key], ask, self._streaming, self._lock)
            with self._lock:
                self.outcomes.append(outcome)
        for client in clients.values():
            client.close()
