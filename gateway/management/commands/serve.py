"""`manage.py serve`: the production ASGI server (uvicorn) for the whole app.

uvicorn, not daphne: it speaks the ASGI lifespan protocol (so the embedded dispatcher can start and
stop with the process), it is the faster HTTP server of the two (httptools + uvloop), and it serves
WebSockets for Channels as well.
"""
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Serve Fairgate (gateway, console, admin) with uvicorn."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--log-level", default="warning")

    def handle(self, *args, host: str, port: int, log_level: str, **opts):
        import uvicorn

        self.stdout.write(f"Fairgate on http://{host}:{port}/ (admin at /admin/)")
        uvicorn.run(
            "config.asgi:application",
            host=host,
            port=port,
            log_level=log_level,
            proxy_headers=False,  # X-Forwarded-For is trusted only from configured proxies, by the gateway
            access_log=False,
            lifespan="auto",
        )
