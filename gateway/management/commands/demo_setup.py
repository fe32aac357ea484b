"""`manage.py demo_setup`: what `make demo` needs on a fresh database (idempotent)."""
import os

from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.conf import settings

from gateway.models import User
from scheduling.models import PriorityClass


class Command(BaseCommand):
    help = "Load the example configuration (first start only) and create the demo admin user."

    def handle(self, *args, **opts):
        if not PriorityClass.objects.exists():
            call_command("scheduler_config", "load", settings.FAIRGATE_CONFIG, actor="demo")
        password = os.environ.get("FAIRGATE_DEMO_PASSWORD", "fairgate-demo")
        if not User.objects.filter(username="admin").exists():
            User.objects.create_superuser("admin", "admin@example.invalid", password, role=User.Role.ADMIN)
            self.stdout.write(f"demo admin: user 'admin', password '{password}'")
