from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"

    def ready(self) -> None:
        from billing.cache import connect_invalidation
        from billing.price_exposure import class_exposure
        from scheduling.prices import impact_source_add

        connect_invalidation()
        impact_source_add(class_exposure)  # what a price change touches, shown before it is confirmed
