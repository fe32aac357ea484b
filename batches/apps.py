from django.apps import AppConfig


class BatchesConfig(AppConfig):
    name = "batches"
    verbose_name = "Batches"

    def ready(self) -> None:
        from batches import checks  # noqa: F401  (registers the start-up checks)
        from batches.feeder import feed
        from gateway import hooks

        hooks.on_serving(feed)  # every serving process feeds batch lines to its engine
