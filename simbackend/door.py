"""The simulated backend's door, as a real upstream's: the key it requires, and Azure OpenAI's paths.

With ``--api-key`` a call without that key is answered 401 as OpenAI answers it (``invalid_api_key``;
the key sent is never echoed). With ``--azure`` the completions live at
``/openai/deployments/{deployment}/{chat/completions|completions|embeddings}?api-version=...`` and
the key comes in the ``api-key`` header, as on Azure OpenAI; the ``/v1`` paths do not exist there.
"""

from __future__ import annotations

import hmac
import re
from typing import Any
from urllib.parse import parse_qs

from .config import SimConfig
from .protocol import SimError

AZURE_PATH = re.compile(r"/openai/deployments/(?P<deployment>[^/]+)/(?P<op>chat/completions|completions|embeddings)")
V1_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models")


def door_check(config: SimConfig, scope: dict[str, Any]) -> tuple[str, str]:
    """(deployment, path as the router knows it): Azure's path mapped onto ``/v1/...``."""
    path = scope["path"]
    if not config.azure:
        return "", path
    if path in V1_PATHS:
        raise SimError(404, "404", "Resource not found", "invalid_request_error")
    match = AZURE_PATH.fullmatch(path)
    if match is None:
        return "", path
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    if not query.get("api-version", [""])[0]:
        raise SimError(
            404, "404", "Resource not found (an api-version query parameter is required)", "invalid_request_error"
        )
    return match["deployment"], f"/v1/{match['op']}"


def key_check(config: SimConfig, authorization: str | None, api_key: str | None) -> None:
    """401 unless the call carries the configured key where its dialect puts it."""
    if not config.api_key:
        return
    sent = api_key if config.azure else _bearer(authorization)
    if sent is not None and hmac.compare_digest(sent.encode(), config.api_key.encode()):
        return
    where = "an api-key header" if config.azure else "an Authorization: Bearer header"
    raise SimError(
        401,
        "invalid_api_key",
        f"Incorrect or missing API key: send the backend's key in {where}.",
        "invalid_request_error",
    )


def _bearer(authorization: str | None) -> str | None:
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return None
