"""Serving the simulated backend with uvicorn: foreground (CLI) or in a background thread (tests)."""

from __future__ import annotations

import importlib.util
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import uvicorn

from .app import SimBackendApp
from .config import SimConfig
from .gate import Gate

STARTUP_TIMEOUT_S = 10.0


def uvicorn_config(app: SimBackendApp, config: SimConfig, *, port: int | None = None) -> uvicorn.Config:
    """A lean uvicorn setup: uvloop/httptools when installed, no access log, no proxy trust."""
    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port if port is None else port,
        loop="uvloop" if _installed("uvloop") else "asyncio",
        http="httptools" if _installed("httptools") else "h11",
        interface="asgi3",
        lifespan="on",
        access_log=False,
        log_level="warning",
        proxy_headers=False,
        server_header=False,
        date_header=False,
        backlog=4096,
        timeout_keep_alive=30,
        timeout_graceful_shutdown=3,
    )


def run(options: Mapping[str, Any]) -> None:
    """Serve in the foreground until interrupted; ``options`` are the parsed CLI options."""
    config = SimConfig.from_options(options)
    app = SimBackendApp(config)
    print(_banner(config), flush=True)
    uvicorn.Server(uvicorn_config(app, config)).run()


@dataclass
class RunningSim:
    """A simulator serving in a background thread; ``stop()`` shuts it down, ``gate`` holds answers."""

    app: SimBackendApp
    server: uvicorn.Server
    thread: threading.Thread
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def gate(self) -> Gate:
        """The gate before the answers (open by default); callable from this thread."""
        return self.app.gate

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=STARTUP_TIMEOUT_S)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(timeout=STARTUP_TIMEOUT_S)


def start_in_thread(config: SimConfig) -> RunningSim:
    """Start on ``config.port`` (0 picks a free port) and return once it accepts connections."""
    app = SimBackendApp(config)
    server = uvicorn.Server(uvicorn_config(app, config))
    thread = threading.Thread(target=server.run, name="simbackend", daemon=True)
    thread.start()
    deadline_s = time.monotonic() + STARTUP_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline_s:
            server.should_exit = True
            raise RuntimeError("the simulated backend did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    return RunningSim(app, server, thread, config.host, port)


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _banner(config: SimConfig) -> str:
    timing = (
        f"fixed latency {config.fixed_latency_ms:g} ms"
        if config.fixed_latency_ms is not None
        else f"ttft {config.ttft_ms:g} ms, {config.tokens_per_s:g} tokens/s"
    )
    return (
        f"simulated GPU backend on http://{config.host}:{config.port} — {config.slots} slots, "
        f"{timing}, tpm {config.tpm or 'unlimited'}, rpm {config.rpm or 'unlimited'}, "
        f"fail rate {config.fail_rate:g}, seed {config.seed}, "
        f"models {', '.join(config.models) or 'any'}"
    )
