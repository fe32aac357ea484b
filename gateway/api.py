"""The gateway as the apps above it (the console, the Batch API) use it: the one gateway module
they import, kept so by an import-linter contract (pyproject.toml). The dispatcher is reached
through the scheduler's port (`SchedulerPort`) and read through its `QueueView`, never the engine.
"""

from gateway.admission import Bill
from gateway.admission import admit as admit_with_hold
from gateway.auth import authenticate, caller_of
from gateway.charging import Hold
from gateway.db import db_call, log_failure
from gateway.dispatch_core import Entry
from gateway.errors import ErrorCode, GatewayError, invalid_request
from gateway.exchange import spawn
from gateway.intake import Asked, classify
from gateway.lifecycle import UNTAGGED_JOB, Outcome, PublicId, State, engine_id, ordered_id
from gateway.limits import output_limit, output_tokens_held, prompt_bound
from gateway.live import register as live_register
from gateway.metrics import LIVE, REGISTRY, REJECTS, UPSTREAM_ERRORS
from gateway.models import DowngradeEvent
from gateway.payload import CHAT, EMBED, TEXT, Payload, estimate, payload_estimate, payload_parse, upstream_body
from gateway.port import QueueView, SchedulerPort
from gateway.runtime import current, dispatcher_get
from gateway.views import api_view, json_response

__all__ = [
    "CHAT",
    "EMBED",
    "LIVE",
    "REGISTRY",
    "REJECTS",
    "TEXT",
    "UNTAGGED_JOB",
    "UPSTREAM_ERRORS",
    "Asked",
    "Bill",
    "DowngradeEvent",
    "Entry",
    "ErrorCode",
    "GatewayError",
    "Hold",
    "Outcome",
    "Payload",
    "PublicId",
    "QueueView",
    "SchedulerPort",
    "State",
    "admit_with_hold",
    "api_view",
    "authenticate",
    "caller_of",
    "classify",
    "current",
    "db_call",
    "dispatcher_get",
    "engine_id",
    "estimate",
    "invalid_request",
    "json_response",
    "live_register",
    "log_failure",
    "ordered_id",
    "output_limit",
    "output_tokens_held",
    "payload_estimate",
    "payload_parse",
    "prompt_bound",
    "spawn",
    "upstream_body",
]
