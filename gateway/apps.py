from django.apps import AppConfig
from django.core.signals import request_finished

from gateway import metrics


class GatewayConfig(AppConfig):
    name = "gateway"
    verbose_name = "Gateway"

    def ready(self) -> None:
        from billing.client import metrics_registry  # noqa: PLC0415 -- app registry timing: imports models
        from gateway.db import close_at_request_end  # noqa: PLC0415 -- app registry timing

        request_finished.connect(close_at_request_end, dispatch_uid="gateway-close-at-request-end")
        # The billing client's metrics, served and read with the gateway's (registered here, not in
        # gateway.metrics, which stays importable without Django: billing.client needs it set up).
        metrics.REGISTRY.register(metrics_registry)
