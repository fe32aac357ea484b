from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"

    def ready(self) -> None:
        # Imported here, not at the top: they import models, which the app registry loads after this module.
        from billing.cache_signals import connect_invalidation  # noqa: PLC0415 -- app registry timing
        from billing.price_exposure import class_exposure  # noqa: PLC0415 -- app registry timing
        from billing.price_versions import PRICE_BOOK  # noqa: PLC0415 -- app registry timing
        from scheduling.prices import impact_source_add, price_book_set  # noqa: PLC0415 -- app registry timing

        connect_invalidation()
        price_book_set(PRICE_BOOK)  # scheduling's configuration reads and writes prices through it
        impact_source_add(class_exposure)  # what a price change touches, shown before it is confirmed
