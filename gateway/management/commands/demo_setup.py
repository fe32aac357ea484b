"""`manage.py demo_setup`: what `make demo` needs on a fresh database, then demo keys to try it.

Idempotent: the example configuration is loaded at first start only, the admin user is created
once. Demo API keys (label "demo") are re-issued on every run, because a key's secret is shown
only when it is created: the previous demo keys are revoked.
"""

import os

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from scheduling.models import PriorityClass
from scheduling.selectors import class_names_active
from tenants.models import ApiKey, Tenant, User
from tenants.services import apikey_create, apikey_revoke

DEMO_LABEL = "demo"
DEMO_KEYS = (  # tenant, class, what it demonstrates
    ("support", "INTERACTIVE", "VIP, interactive chat"),
    ("sales", "INTERACTIVE", "interactive chat"),
    ("finance", "BATCH", "batch jobs"),
)


class Command(BaseCommand):
    help = "Load the example configuration (first start only), create the demo admin user, issue demo keys."

    def add_arguments(self, parser):
        parser.add_argument("--url", default="http://127.0.0.1:8000", help="where the gateway will listen")
        parser.add_argument("--no-keys", action="store_true", help="do not issue demo API keys")

    def handle(self, *args, url: str, no_keys: bool, **opts):
        if not PriorityClass.objects.exists():
            call_command("scheduler_config", "load", settings.FAIRGATE_CONFIG, actor="demo")
        password = os.environ.get("FAIRGATE_DEMO_PASSWORD", "fairgate-demo")
        if not User.objects.filter(username="admin").exists():
            User.objects.create_superuser("admin", "admin@example.invalid", password, role=User.Role.ADMIN)
            self.stdout.write(f"demo admin: user 'admin', password '{password}'")
        if not no_keys:
            self._keys(url.rstrip("/"))

    def _keys(self, url: str) -> None:
        for old in ApiKey.objects.filter(label=DEMO_LABEL, revoked_at__isnull=True):
            apikey_revoke(prefix=old.prefix, actor="demo")
        issued = []
        for slug, cls, demonstrates in DEMO_KEYS:
            if Tenant.objects.filter(slug=slug, active=True).exists():
                issued.append(
                    (
                        slug,
                        cls,
                        demonstrates,
                        apikey_create(
                            tenant_slug=slug,
                            default_class=cls,
                            label=DEMO_LABEL,
                            actor="demo",
                            known_classes=class_names_active(),
                        )[1],
                    )
                )
        if not issued:
            self.stdout.write("no demo tenants (support, sales, finance) in the configuration: no demo keys")
            return
        self.stdout.write("\nDemo API keys (shown once; re-issued by every `make demo`):")
        for slug, cls, demonstrates, key in issued:
            self.stdout.write(f"  {slug:<8} {cls:<12} {demonstrates:<22} {key}")
        self.stdout.write(_example(url, issued[0][3]))


def _example(url: str, key: str) -> str:
    return f"""
Try it (the simulated GPU backend serves the model 'sim-llama'):

  export OPENAI_BASE_URL={url}/v1
  export OPENAI_API_KEY={key}
  python -c "from openai import OpenAI; r = OpenAI().chat.completions.create(model='sim-llama', messages=[{{'role': 'user', 'content': 'Hello'}}], max_tokens=20); print(r.choices[0].message.content)"

  curl -s {url}/v1/chat/completions -H "Authorization: Bearer $OPENAI_API_KEY" \\
       -H "X-Priority-Class: BATCH" -d '{{"model": "sim-llama", "messages": [{{"role": "user", "content": "Hello"}}]}}' -i
  curl -s {url}/v1/queue -H "Authorization: Bearer $OPENAI_API_KEY"     # your waiting and running requests
"""
