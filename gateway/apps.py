from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"
    verbose_name = "Gateway"

    def ready(self) -> None:
        from django.core.signals import request_finished

        from gateway.db import close_at_request_end

        request_finished.connect(close_at_request_end, dispatch_uid="gateway-close-at-request-end")
