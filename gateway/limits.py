"""What a request may cost at most, so that its budget hold is an upper bound of its charge.

* **Output**: the limit per choice is the client's ``max_tokens`` / ``max_completion_tokens``
  (the smaller, if both), else the model's default; above the model's maximum the request is
  refused (400) before anything is held. The limit is what the gateway sends upstream
  (``gateway.payload.upstream_body``), so a backend that honours it cannot produce more. The
  request is held for that limit times its choices (``Payload.choices``: ``n`` per prompt; a
  ``/v1/completions`` prompt list, at most ``FAIRGATE_MAX_PROMPTS`` prompts, is answered a
  choice per prompt): `output_tokens_held`, for HTTP requests and batch lines alike.
* **Prompt**: the backend's tokenizer is not ``cl100k_base``, so the estimate is no bound. The
  bound is the request body's length in bytes, plus a few tokens per message for the chat
  template's special tokens and a fixed allowance per image part. Every byte-level BPE tokenizer
  (GPT, Llama 3, Qwen, Mistral's) makes at most one token per byte, SentencePiece with byte
  fallback at most one per byte of text plus a prefix token, and JSON never encodes text in
  fewer bytes than its UTF-8; the body also carries every tool definition and system prompt a
  template can put in front of the model. The estimate still drives scheduling (TPM, fairness);
  only the hold uses the bound. What it costs in budget headroom, measured once:
  docs/decisions/2026-12-01-hold-bound-by-prompt-bytes.md.

What a backend reports beyond the hold is not charged: billing caps the charge at the hold and
records the rest as *unbilled* (billing.booking).
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
