"""The hostile clients of a fault run (``--hostile SHARE``) and the price change as a fault.

A hostile request is one of: the same X-Request-Id sent twice at once (``twin``), a completion
with a list of prompts (``list``), a chat with long tool definitions whose stream the client cuts
(``tools``), and a plain stream the client cuts (``cut``). A stream the client cut after reading
answer events counts as served: the gateway relayed tokens, so it must be charged once.
The ``price-change`` fault moves both classes' factors by 2x (up in one round, back in the next)
through ``manage.py scheduler_config load`` while requests are in flight.
"""

from __future__ import annotations

import threading
from pathlib import Path

import openai

KINDS = ("twin", "list", "tools", "cut")
LIST_PROMPTS = 8
CUT_AFTER_EVENTS = 4
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"lookup_{n}",
            "description": "Looks up the quarterly GPU usage of one department and its budget. " * 20,
            "parameters": {"type": "object", "properties": {"department": {"type": "string"}}},
        },
    }
    for n in range(3)
]
CLASSES_YAML = """scheduler:
  classes:
    - {{name: INTERACTIVE, level: 0, sla_ms: 20000, price_factor: {interactive}}}
    - {{name: BATCH,       level: 2, sla_ms: 60000, price_factor: {batch}}}
"""
FACTORS = {"INTERACTIVE": 1.6, "BATCH": 0.7}  # as bench.faults' YAML


def _cut_stream(client: openai.OpenAI, ask, *, tools: bool) -> tuple[bool, bool, str]:
    extra = {"tools": TOOLS} if tools else {}
    with client.chat.completions.with_streaming_response.create(
        model="m",
        messages=[{"role": "user", "content": ask.prompt}],
        max_tokens=ask.max_tokens,
        stream=True,
        extra_headers={"X-Request-Id": ask.rid},
        **extra,
    ) as response:
        events = 0
        for line in response.iter_lines():
            if line.startswith("data: ") and '"error"' in line:
                return False, True, "stream error"
            if line.startswith("data: [DONE]"):
                return True, True, "served (ended before the cut)"
            if line.startswith("data: "):
                events += 1
                if events >= CUT_AFTER_EVENTS:
                    return True, True, "served, cut by the client"
    return False, False, "stream ended without [DONE]"


def _listed(client: openai.OpenAI, ask) -> tuple[bool, bool, str]:
    completion = client.completions.create(
        model="m",
        prompt=[f"{ask.prompt} ({n})" for n in range(LIST_PROMPTS)],
        max_tokens=ask.max_tokens,
        extra_headers={"X-Request-Id": ask.rid},
    )
    if len(completion.choices) != LIST_PROMPTS:
        return False, False, f"{len(completion.choices)} choices for {LIST_PROMPTS} prompts"
    return True, True, "served"


def _twins(client: openai.OpenAI, ask) -> tuple[bool, bool, str]:
    """Both at once (a barrier); served if one was, clean if both ended cleanly."""
    barrier = threading.Barrier(2)
    ended: list[str] = ["", ""]

    def one(index: int) -> None:
        barrier.wait()
        try:
            client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": ask.prompt * 400}],  # a prompt tokenized off the loop
                max_tokens=ask.max_tokens,
                extra_headers={"X-Request-Id": ask.rid},
            )
            ended[index] = "200"
        except openai.APIStatusError as err:
            ended[index] = str(err.status_code)
        except openai.APIError as err:
            ended[index] = type(err).__name__

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    how = "twins " + "+".join(sorted(ended))
    return "200" in ended, all(e.isdigit() for e in ended), how


def hostile_send(client: openai.OpenAI, ask) -> tuple[bool, bool, str]:
    """(served, clean, how) of a hostile ``ask`` (its ``kind`` one of KINDS)."""
    if ask.kind == "twin":
        return _twins(client, ask)
    if ask.kind == "list":
        return _listed(client, ask)
    return _cut_stream(client, ask, tools=ask.kind == "tools")


_moved: dict[Path, int] = {}  # a stack's var dir -> price changes made on it


def price_change(stack, load, opts) -> str:
    """Both classes' factors doubled (the 1st, 3rd... change) or halved back, loaded while requests run."""
    moves = _moved.get(stack.var_dir, 0)
    _moved[stack.var_dir] = moves + 1
    scale = 2.0 if moves % 2 == 0 else 1.0
    factors = {name: round(factor * scale, 4) for name, factor in FACTORS.items()}
    path = Path(stack.var_dir) / "prices.yaml"
    path.write_text(CLASSES_YAML.format(interactive=factors["INTERACTIVE"], batch=factors["BATCH"]))
    done = stack.manage("scheduler_config", "load", str(path), "--actor", "bench.faults")
    if done.returncode != 0:
        raise RuntimeError(f"the price change was refused: {done.stderr or done.stdout}")
    told = ", ".join(f"{name} {factor}" for name, factor in factors.items())
    return f"price factors set to {told} ({'2x' if scale == 2 else 'back'}) while requests ran"
