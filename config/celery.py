"""The Celery app. Embedded default (no REDIS_URL): tasks run eagerly in-process."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("fairgate")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
