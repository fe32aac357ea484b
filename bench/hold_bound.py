"""What bounding the prompt by its bytes costs in budget headroom (gateway.limits).

A hold covers the prompt's byte length (an upper bound in any byte-level tokenizer) instead of
the cl100k_base estimate. The difference is held only while a request is in flight and goes back
at settlement, so it costs nothing unless a budget is near its limit; there it refuses earlier.
This measures how much more is held, on real-looking prompts cut from text of several kinds,
for a request with ``max_tokens`` output at output/input price ratio ``--price-ratio``:

    python -m bench.hold_bound [--prompt-chars 2000] [--max-tokens 256] [--price-ratio 2] [FILE ...]

Defaults: this repository's README (English prose), a Python module (code), the scheduler YAML
(configuration), and the field report in ../shared/seeds (Chinese) when it is there.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import django

REPO = Path(__file__).resolve().parent.parent
DEFAULTS = [
    REPO / "README.md",
    REPO / "gateway" / "exchange.py",
    REPO / "config" / "scheduler.example.yaml",
    *sorted((REPO.parent / "shared" / "seeds").glob("*.txt")),
]


def _prompts(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, max(1, len(text) - size + 1), size)] or [text]


def measure(path: Path, *, prompt_chars: int, max_tokens: int, price_ratio: float) -> dict:
    from gateway.limits import prompt_bound
    from gateway.payload import CHAT, payload_parse
    from gateway.tokens import estimate_chat

    estimates, bounds = 0, 0
    prompts = _prompts(path.read_text(errors="replace"), prompt_chars)
    for prompt in prompts:
        body = {
            "model": "m",
            "messages": [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
        }
        payload = payload_parse(CHAT, json.dumps(body, ensure_ascii=False).encode())
        estimates += estimate_chat(payload.body)
        bounds += prompt_bound(payload)
    output = price_ratio * max_tokens * len(prompts)
    return {
        "corpus": path.name,
        "prompts": len(prompts),
        "bytes_per_token": bounds / estimates,
        "hold_ratio": (bounds + output) / (estimates + output),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--prompt-chars", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--price-ratio", type=float, default=2.0, help="output price / input price")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    print(
        f"prompts of {args.prompt_chars} characters, max_tokens {args.max_tokens}, "
        f"output priced {args.price_ratio:g}x input\n"
    )
    print("| corpus | prompts | prompt bound / cl100k estimate | hold with the bound / hold with the estimate |")
    print("|---|---|---|---|")
    for path in [p for p in (args.files or DEFAULTS) if p.exists()]:
        row = measure(path, prompt_chars=args.prompt_chars, max_tokens=args.max_tokens, price_ratio=args.price_ratio)
        print(f"| {row['corpus']} | {row['prompts']} | {row['bytes_per_token']:.2f}x | {row['hold_ratio']:.2f}x |")


if __name__ == "__main__":
    main()
