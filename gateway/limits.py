"""What a request may cost at most, so that its budget hold is an upper bound of its charge.

Output: the limit per choice (the client's, else the model's default; above the model's maximum:
400), times its choices (`output_tokens_held`); it is also what goes upstream. Prompt: the body's
length in bytes plus template tokens per message and an allowance per image (`prompt_bound`),
since no tokenizer makes more tokens than bytes. Why, and what is charged beyond the hold:
docs/money.md, "What a request holds".
"""

from __future__ import annotations

from django.conf import settings

from gateway.errors import invalid_request
from gateway.payload import CHAT, EMBED, Payload

TEMPLATE_TOKENS_PER_MESSAGE = 8  # role markers and separators of any chat template we know, generously
TEMPLATE_TOKENS_PER_REQUEST = 16  # begin-of-text, the assistant's priming


def output_limits(model: str) -> tuple[int, int]:
    """(default, maximum) output tokens per choice for ``model``."""
    per_model = settings.FAIRGATE_MODEL_OUTPUT_LIMITS.get(model)
    if per_model is not None:
        return per_model
    maximum = settings.FAIRGATE_MAX_OUTPUT_TOKENS
    return min(settings.FAIRGATE_DEFAULT_MAX_TOKENS, maximum), maximum


def output_limit(payload: Payload) -> int:
    """The output tokens per choice the request is held at and sent upstream with; raises
    400 invalid_request for an output limit above the model's maximum or ``n`` above the cap.
    Embeddings produce no output tokens: 0."""
    if payload.kind == EMBED:
        return 0
    if payload.n > settings.FAIRGATE_MAX_N:
        raise invalid_request(f"'n' is at most {settings.FAIRGATE_MAX_N} here (FAIRGATE_MAX_N); got {payload.n}.")
    default, maximum = output_limits(payload.model)
    if payload.max_tokens is None:
        return default
    if payload.max_tokens > maximum:
        raise invalid_request(
            f"'{payload.max_tokens_field}' is at most {maximum} for model '{payload.model}'; got {payload.max_tokens}."
        )
    return payload.max_tokens


def output_tokens_held(payload: Payload) -> int:
    """The output tokens the request is held (and scheduled) for: ``output_limit`` per choice."""
    return payload.output_limit * payload.choices


def _media_parts(messages: list[dict]) -> int:
    return sum(
        1
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if not (isinstance(part, dict) and part.get("type") == "text")
    )


def prompt_bound(payload: Payload) -> int:
    """An upper bound of the prompt tokens any backend can count for this request."""
    bound = len(payload.raw) + TEMPLATE_TOKENS_PER_REQUEST
    if payload.kind == CHAT:
        messages = payload.body["messages"]
        bound += TEMPLATE_TOKENS_PER_MESSAGE * len(messages) + settings.FAIRGATE_IMAGE_TOKENS * _media_parts(messages)
    return bound
