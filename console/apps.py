from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"

    def ready(self) -> None:
        from console.live import hooks  # noqa: PLC0415 -- app registry timing: imports models
        from console.live.publisher import console_live_start  # noqa: PLC0415 -- app registry timing
        from gateway.api import live_register  # noqa: PLC0415 -- app registry timing

        hooks.connect()
        live_register(on_serving=console_live_start)
