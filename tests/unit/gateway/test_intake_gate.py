"""The intake gate (gateway.asgi → gateway.intake.intake_gate), in process through the real ASGI
handler: a request below the top class waits for its lane's turn before its body is read (the
server's ``receive`` is not even called), the top class is read meanwhile, a full backlog is
refused there, a request whose class cannot be told waits after every class, and a slow body or a
client that leaves does not keep a turn. Intake runs for real; what comes after it (hold, admit,
upstream) is replaced by an answer naming the class intake found."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway import intake as intake_module
from gateway import lanes as lanes_module
from gateway import views
from gateway.asgi import GatewayASGIHandler
from gateway.auth import Caller
from gateway.dispatcher import Dispatcher
from gateway.errors import ErrorCode, GatewayError
from tests.unit.gateway.test_lanes import _intake_config

BATCH_LEVEL = 2
CALLERS = {
    "fg_batch": Caller("t", 1, False, ("INTERACTIVE", "BATCH"), "BATCH", "fg_batch"),
    "fg_chat": Caller("t", 1, False, ("INTERACTIVE", "BATCH"), "INTERACTIVE", "fg_chat"),
}


class _Client:
    """uvicorn's side of one request. The body comes in ``parts`` (each after its event is set, the
    first at once unless ``slow``); ``asked`` counts the server's calls for it."""

    def __init__(self, body: bytes, *, parts: int = 1, leaves: bool = False) -> None:
        size = -(-len(body) // parts)
        self.parts = [body[i : i + size] for i in range(0, len(body), size)]
        self.arrived = [asyncio.Event() for _ in self.parts]
        self.arrived[0].set()
        self.leaves = leaves
        self.asked = 0
        self.sent: list[dict] = []
        self._done = asyncio.Event()

    async def receive(self) -> dict:
        index = self.asked
        self.asked += 1
        if self.leaves or index >= len(self.parts):
            await (asyncio.sleep(0) if self.leaves else self._done.wait())
            return {"type": "http.disconnect"}
        await self.arrived[index].wait()
        return {"type": "http.request", "body": self.parts[index], "more_body": index + 1 < len(self.parts)}

    async def send(self, message: dict) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            self._done.set()

    @property
    def status(self) -> int | None:
        return self.sent[0]["status"] if self.sent else None

    @property
    def headers(self) -> dict[str, str]:
        return {k.decode().lower(): v.decode() for k, v in self.sent[0]["headers"]}

    def json(self) -> dict:
        return json.loads(b"".join(m.get("body", b"") for m in self.sent[1:]))


def _body(content: str = "hi") -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 5}).encode()


def _send(client: _Client, key: str, cls: str | None = None, request_id: str | None = None) -> asyncio.Task:
    headers = [(b"host", b"testserver"), (b"authorization", f"Bearer {key}".encode())]
    headers += [(b"content-type", b"application/json")]
    if cls is not None:
        headers.append((b"x-priority-class", cls.encode()))
    if request_id is not None:
        headers.append((b"x-request-id", request_id.encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    return asyncio.create_task(GatewayASGIHandler()(scope, client.receive, client.send))


async def _settle() -> None:
    for _ in range(20):  # let every woken task run up to its next await
        await asyncio.sleep(0)


@pytest.fixture
def gate(monkeypatch, settings):
    """One turn, a backlog of one per class; callers by key; intake's answer names its class."""
    settings.FAIRGATE_INTAKE_CONCURRENCY = 1
    settings.FAIRGATE_INTAKE_BACKLOG = 1
    lanes_module.lanes_reset()

    async def authenticate(authorization):
        caller = CALLERS.get((authorization or "").removeprefix("Bearer "))
        if caller is None:
            raise GatewayError(401, ErrorCode.INVALID_API_KEY, "Invalid API key.")
        return caller

    async def serve(request, kind):
        asked = await intake_module.intake(request, kind)
        return views.json_response({"cls": asked.cls, "prompt_tokens": asked.payload.prompt_tokens})

    monkeypatch.setattr(intake_module, "authenticate", authenticate)
    monkeypatch.setattr(views, "serve", serve)
    dispatchers: list[Dispatcher] = []

    async def dispatcher_get():
        if not dispatchers:
            dispatchers.append(Dispatcher(_intake_config(), audit_pk=None, loop=asyncio.get_running_loop()))
        return dispatchers[0]

    monkeypatch.setattr(intake_module, "dispatcher_get", dispatcher_get)
    yield lanes_module.lanes
    lanes_module.lanes_reset()


def test_a_batch_request_waits_for_its_turn_unread_while_the_top_class_is_read_and_the_backlog_is_bounded(gate):
    async def scenario() -> None:
        lanes = gate()
        held = await lanes.take(level=BATCH_LEVEL, cls="BATCH")  # another batch intake holds the one turn
        parked = _Client(_body("x" * 9000))
        parked_task = _send(parked, "fg_batch")  # BATCH by its key's default class: no header read
        await _settle()
        assert parked.asked == 0 and lanes.waiting(BATCH_LEVEL) == 1  # its body not even asked for

        chat = _Client(_body())
        await asyncio.wait_for(_send(chat, "fg_chat"), 10)
        assert chat.status == 200 and chat.json()["cls"] == "INTERACTIVE"
        assert not parked_task.done() and parked.asked == 0  # read past the parked batch request

        refused = _Client(_body())
        await asyncio.wait_for(_send(refused, "fg_batch", "BATCH", request_id="b-2"), 10)
        assert refused.status == 429 and refused.json()["error"]["code"] == "queue_full"
        assert refused.headers["x-request-id"] == "b-2" and refused.headers["retry-after"] == "1"
        assert refused.asked == 0  # refused from its headers

        stranger = _Client(_body())  # declares the top class with a key that does not authenticate
        await asyncio.wait_for(_send(stranger, "fg_nope", "INTERACTIVE"), 10)
        assert stranger.status == 401 and stranger.asked == 0  # refused from its headers, in no lane

        held.release()
        await asyncio.wait_for(parked_task, 10)
        assert parked.status == 200 and parked.json()["cls"] == "BATCH"
        assert parked.json()["prompt_tokens"] > 1000  # parsed and estimated in its turn
        assert lanes.busy == 0 and lanes.waiting(BATCH_LEVEL) == 0

    asyncio.run(scenario())


def test_a_slow_body_gives_its_turn_back_and_waits_for_one_again_once_it_is_in(gate):
    async def scenario() -> None:
        lanes = gate()
        slow = _Client(_body("y" * 4000), parts=2)
        slow_task = _send(slow, "fg_batch")
        await _settle()
        assert slow.asked >= 1  # it had the turn and asked for its body: the rest does not come

        quick = _Client(_body())
        await asyncio.wait_for(_send(quick, "fg_batch"), 10)  # the turn came back to the lanes
        assert quick.status == 200 and quick.json()["cls"] == "BATCH"
        assert not slow_task.done()

        slow.arrived[1].set()
        await asyncio.wait_for(slow_task, 10)
        assert slow.status == 200 and slow.json()["cls"] == "BATCH"
        assert lanes.busy == 0

    asyncio.run(scenario())


def test_a_client_that_left_while_parked_gives_the_turn_it_is_handed_back_at_once(gate):
    async def scenario() -> None:
        lanes = gate()
        held = await lanes.take(level=BATCH_LEVEL, cls="BATCH")
        gone = _Client(_body(), leaves=True)
        gone_task = _send(gone, "fg_batch")
        await _settle()
        assert lanes.waiting(BATCH_LEVEL) == 1
        held.release()
        await asyncio.wait_for(gone_task, 10)
        assert gone.sent == [] and lanes.busy == 0  # no answer to send, and no turn kept

    asyncio.run(scenario())
