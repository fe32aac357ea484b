from decimal import Decimal

from django.core.management.base import CommandError

from config.cli import SubcommandCommand, decimal_arg
from scheduling.engine.model import BackendSpec, Dialect
from scheduling.models import Backend
from scheduling.services import backend_create
from scheduling.upstreams import backend_upstream_check, backend_upstream_shown


class Command(SubcommandCommand):
    help = "Create and list GPU backends / upstream provider accounts."
    verbs = {"create": "register a backend", "list": "list backends"}

    def args_create(self, p):
        p.add_argument("name")
        p.add_argument("--url", required=True)
        p.add_argument("--model", dest="models", action="append", required=True)
        p.add_argument("--slots", type=int, required=True)
        p.add_argument("--tpm", type=int)
        p.add_argument("--rpm", type=int)
        p.add_argument("--input-price-per-1k", type=decimal_arg, default=Decimal("0"))
        p.add_argument("--output-price-per-1k", type=decimal_arg, default=Decimal("0"))
        p.add_argument("--fallback-for")
        p.add_argument("--reserved-slots", type=int, default=0)
        p.add_argument(
            "--embedding-model",
            dest="embedding_models",
            action="append",
            default=[],
            help="one of its --model that embeds",
        )
        p.add_argument("--api-key-env", help="the environment variable holding its API key (the NAME, not the key)")
        p.add_argument(
            "--header",
            dest="headers",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="an extra header on every call; VALUE env:VAR reads it from VAR",
        )
        p.add_argument("--dialect", choices=[d.value for d in Dialect], default=Dialect.OPENAI.value)
        p.add_argument("--deployment", help="azure: the deployment (default: the request's model)")
        p.add_argument("--api-version", help="azure: the api-version, e.g. 2024-06-01")

    def args_list(self, p):
        pass

    def do_create(
        self,
        *,
        name,
        url,
        models,
        slots,
        tpm,
        rpm,
        input_price_per_1k,
        output_price_per_1k,
        fallback_for,
        reserved_slots,
        embedding_models,
        api_key_env=None,
        headers=(),
        dialect=Dialect.OPENAI.value,
        deployment=None,
        api_version=None,
        **_,
    ):
        upstream = backend_upstream_check(
            name=name,
            raw={
                "api_key_env": api_key_env,
                "headers": _header_pairs(headers),
                "dialect": dialect,
                "deployment": deployment,
                "api_version": api_version,
            },
        )
        spec = BackendSpec(
            name=name,
            url=url,
            models=tuple(models),
            slots=slots,
            tpm=tpm,
            rpm=rpm,
            input_price_per_1k=input_price_per_1k,
            output_price_per_1k=output_price_per_1k,
            fallback_for=fallback_for,
            reserved_slots=reserved_slots,
            embedding_models=tuple(embedding_models),
            **upstream,
        )
        backend_create(spec=spec, actor="cli")
        self.stdout.write(f"created backend {name}")

    def do_list(self, **_):
        self.stdout.write(
            f"{'name':<16} {'slots':>5} {'rsv':>4} {'tpm':>9} {'rpm':>6} {'enabled':<7} {'fallback_for':<14} "
            "models / url / upstream"
        )
        for b in Backend.objects.select_related("fallback_for").order_by("name"):
            self.stdout.write(
                f"{b.name:<16} {b.slots:>5} {b.reserved_slots:>4} {b.tpm or '-':>9} {b.rpm or '-':>6} "
                f"{'yes' if b.enabled else 'no':<7} {b.fallback_for.name if b.fallback_for else '-':<14} "
                f"{','.join(b.model_names)} {b.url} {backend_upstream_shown(b)}".rstrip()
            )


def _header_pairs(values: list[str]) -> dict[str, str] | None:
    pairs = {}
    for value in values:
        name, sep, text = value.partition("=")
        if not sep:
            raise CommandError(f"--header {value!r}: expected NAME=VALUE")
        pairs[name.strip()] = text
    return pairs or None
