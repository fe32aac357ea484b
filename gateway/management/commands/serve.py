"""`manage.py serve`: the production ASGI server (uvicorn) for the whole app.

uvicorn, not daphne: it speaks the ASGI lifespan protocol (so the embedded dispatcher starts and
stops with the process), it is the faster HTTP server of the two (httptools + uvloop), and it serves
WebSockets for Channels as well. One process: the dispatcher's queues live in it.
"""
import importlib.util

from django.core.management.base import BaseCommand


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


class Command(BaseCommand):
    help = "Serve Fairgate (gateway, dispatcher, console, admin) with uvicorn."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--log-level", default="warning")

    def handle(self, *args, host: str, port: int, log_level: str, **opts):
        import uvicorn

        self.stdout.write(f"Fairgate on http://{host}:{port}/ (OpenAI API at /v1/, admin at /admin/)")
        self.stdout.flush()
        uvicorn.run(
            "config.asgi:application",
            host=host,
            port=port,
            log_level=log_level,
            http="httptools" if _installed("httptools") else "h11",
            loop="uvloop" if _installed("uvloop") else "asyncio",
            proxy_headers=False,  # X-Forwarded-For is trusted only from FAIRGATE_TRUSTED_PROXIES, by the gateway
            server_header=False,
            access_log=False,
            lifespan="on",
            backlog=4096,
            timeout_keep_alive=30,
        )
