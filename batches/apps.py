from django.apps import AppConfig


class BatchesConfig(AppConfig):
    name = "batches"
    verbose_name = "Batches"

    def ready(self) -> None:
        from batches import (  # noqa: PLC0415 -- app registry timing: they import models
            check_process,
            checks,  # noqa: F401  (registers the start-up checks)
            feeder,
            prices,
        )
        from gateway.api import live_register  # noqa: PLC0415 -- app registry timing
        from scheduling.prices import impact_source_add  # noqa: PLC0415 -- app registry timing

        live_register(on_serving=feeder.start, on_stopping=feeder.stop)  # every serving process feeds lines
        live_register(on_stopping=check_process.checker_stop)  # its file checker, if it started one
        impact_source_add(prices.batches_open_of_class)  # what a price change touches, shown before it is confirmed
