from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"

    def ready(self) -> None:
        from console.live import hooks

        hooks.connect()
