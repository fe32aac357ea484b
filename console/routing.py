"""WebSocket routes of the console (mounted in config.asgi behind session auth and an origin check)."""

from django.urls import path

from console.consumers import ConsoleConsumer

websocket_urlpatterns = [
    path("ws/console/", ConsoleConsumer.as_asgi()),
]
