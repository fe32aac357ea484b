from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"

    def ready(self) -> None:
        from billing.cache import connect_invalidation
        from billing.price_exposure import class_exposure
        from billing.price_versions import PRICE_BOOK
        from scheduling.prices import impact_source_add, price_book_set

        connect_invalidation()
        price_book_set(PRICE_BOOK)  # scheduling's configuration reads and writes prices through it
        impact_source_add(class_exposure)  # what a price change touches, shown before it is confirmed
