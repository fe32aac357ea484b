"""The Celery app. With REDIS_URL its broker is Redis. Without, tasks run eagerly in the process
that sends them, or, with CELERY_BROKER_URL=filesystem://localhost/ (as `make demo` runs), through kombu's
file transport in var/celery to a real worker: no server to install."""

import os
from pathlib import Path

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("fairgate")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_configure.connect
def _folders(sender, **kwargs) -> None:
    """The file transport's folders must exist before anyone sends or reads."""
    for folder in (sender.conf.broker_transport_options or {}).values():
        if isinstance(folder, str):
            Path(folder).mkdir(parents=True, exist_ok=True)
