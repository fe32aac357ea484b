"""Configuration of the simulated GPU backend and its command-line options.

The same option set serves ``python -m simbackend`` (argparse) and
``python manage.py simbackend`` (Django's parser is an argparse subclass).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

DEFAULT_MODEL = "fairgate-sim"


@dataclass(frozen=True)
class SimConfig:
    """How the simulated backend behaves. Zero for ``tpm``/``rpm`` means unlimited."""

    host: str = "127.0.0.1"
    port: int = 9100
    slots: int = 8
    ttft_ms: float = 150.0
    tokens_per_s: float = 40.0
    tpm: int = 0
    rpm: int = 0
    fail_rate: float = 0.0
    seed: int = 1
    fixed_latency_ms: float | None = None
    default_max_tokens: int = 64
    max_tokens_cap: int = 4096
    models: tuple[str, ...] = ()
    prefill_unit_tokens: int = 512
    window_ms: float = 60_000.0
    # Misbehaviour a real backend shows: a tokenizer that counts more than the gateway's
    # estimate, and output beyond the max_tokens asked for.
    prompt_token_factor: float = 1.0
    extra_completion_tokens: int = 0
    # A reasoning model: each chat choice's first tokens are reasoning (``reasoning_content``).
    reasoning_tokens: int = 0
    # A real upstream's door: an API key it requires (401 without it), and Azure OpenAI's dialect
    # (``/openai/deployments/{deployment}/...?api-version=``, the key in ``api-key``; no ``/v1``).
    api_key: str = ""
    azure: bool = False

    def __post_init__(self) -> None:
        _require(self.slots >= 1, "--slots must be at least 1")
        _require(self.ttft_ms >= 0, "--ttft-ms must not be negative")
        _require(self.tokens_per_s > 0, "--tokens-per-s must be positive")
        _require(self.tpm >= 0 and self.rpm >= 0, "--tpm/--rpm must not be negative")
        _require(0.0 <= self.fail_rate <= 1.0, "--fail-rate must be within [0, 1]")
        _require(
            self.fixed_latency_ms is None or self.fixed_latency_ms >= 0,
            "--fixed-latency-ms must not be negative",
        )
        _require(self.max_tokens_cap >= 1, "--max-tokens-cap must be at least 1")
        _require(self.default_max_tokens >= 1, "--default-max-tokens must be at least 1")
        _require(self.prompt_token_factor > 0, "--prompt-token-factor must be positive")
        _require(self.extra_completion_tokens >= 0, "--extra-completion-tokens must not be negative")
        _require(self.reasoning_tokens >= 0, "--reasoning-tokens must not be negative")

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> SimConfig:
        """Build from a parsed-options mapping; unknown keys (e.g. Django's verbosity) are ignored."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in options.items() if k in known and v is not None}
        models = values.get("models")
        if isinstance(models, str):
            values["models"] = tuple(m.strip() for m in models.split(",") if m.strip())
        return cls(**values)

    @property
    def served_models(self) -> tuple[str, ...]:
        return self.models or (DEFAULT_MODEL,)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the simulator's options on an argparse-compatible parser."""
    d = SimConfig()
    add = parser.add_argument
    add("--host", default=d.host, help="interface to bind (default %(default)s)")
    add("--port", type=int, default=d.port, help="TCP port (default %(default)s)")
    add("--slots", type=int, default=d.slots, help="concurrent requests before 429")
    add("--ttft-ms", type=float, default=d.ttft_ms, help="prefill time per 512 prompt tokens")
    add("--tokens-per-s", type=float, default=d.tokens_per_s, help="decode speed per request")
    add("--tpm", type=int, default=d.tpm, help="tokens per 60 s window, 0 = unlimited")
    add("--rpm", type=int, default=d.rpm, help="requests per 60 s window, 0 = unlimited")
    add("--fail-rate", type=float, default=d.fail_rate, help="fraction answered with 500")
    add("--seed", type=int, default=d.seed, help="seed of filler text and failures")
    add(
        "--fixed-latency-ms",
        type=float,
        default=None,
        help="fixed total latency per request, overriding the prefill/decode model",
    )
    add("--default-max-tokens", type=int, default=d.default_max_tokens)
    add("--max-tokens-cap", type=int, default=d.max_tokens_cap, help="upper bound on output")
    add("--models", default="", help="comma-separated model names to accept (default: any)")
    add(
        "--prompt-token-factor",
        type=float,
        default=d.prompt_token_factor,
        help="report prompt tokens as this multiple of its own count (another tokenizer)",
    )
    add(
        "--extra-completion-tokens",
        type=int,
        default=d.extra_completion_tokens,
        help="produce this many tokens beyond max_tokens (a backend that ignores the limit)",
    )
    add(
        "--reasoning-tokens",
        type=int,
        default=d.reasoning_tokens,
        help="the first this many tokens of each chat choice are reasoning_content",
    )
    add("--api-key", default=d.api_key, help="require this key (Authorization: Bearer, or api-key with --azure)")
    add(
        "--azure",
        action="store_true",
        default=d.azure,
        help="speak Azure OpenAI: /openai/deployments/{deployment}/chat/completions?api-version=..., api-key header",
    )
