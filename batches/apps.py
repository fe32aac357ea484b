from django.apps import AppConfig


class BatchesConfig(AppConfig):
    name = "batches"
    verbose_name = "Batches"

    def ready(self) -> None:
        from batches import (
            checks,  # noqa: F401  (registers the start-up checks)
            feeder,
        )
        from gateway import live

        live.register(on_serving=feeder.start, on_stopping=feeder.stop)  # every serving process feeds lines
