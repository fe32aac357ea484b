from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"

    def ready(self) -> None:
        from console.live import hooks
        from console.live.publisher import console_live_start
        from gateway.api import live_register

        hooks.connect()
        live_register(on_serving=console_live_start)
