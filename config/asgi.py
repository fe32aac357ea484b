"""ASGI entry point: the API paths through a lean Django handler, everything else through the
full one, WebSockets through Channels; the lifespan wrapper runs the embedded dispatcher."""

import os

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Static files (admin, console) are served in-process: the embedded default has no web server in front.
django_asgi_app = ASGIStaticFilesHandler(get_asgi_application())

# The imports below need Django set up first.
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from console.routing import websocket_urlpatterns  # noqa: E402
from gateway.asgi import ApiRouter, GatewayASGIHandler, Lifespan  # noqa: E402
from gateway.forwarded import ForwardedHeaders  # noqa: E402

application = Lifespan(
    ProtocolTypeRouter(
        {
            # Behind a trusted proxy the console sees the client's scheme and address (gateway.forwarded).
            "http": ApiRouter(GatewayASGIHandler(), ForwardedHeaders(django_asgi_app)),
            # The console's live updates: session-authenticated, and only from our own origin (ALLOWED_HOSTS).
            "websocket": ForwardedHeaders(
                AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
            ),
        }
    )
)
