from decimal import Decimal

from config.cli import SubcommandCommand, decimal_arg
from scheduling.engine.model import BackendSpec
from scheduling.models import Backend
from scheduling.services import backend_create


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
        **_,
    ):
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
        )
        backend_create(spec=spec, actor="cli")
        self.stdout.write(f"created backend {name}")

    def do_list(self, **_):
        self.stdout.write(
            f"{'name':<16} {'slots':>5} {'rsv':>4} {'tpm':>9} {'rpm':>6} {'enabled':<7} {'fallback_for':<14} "
            "models / url"
        )
        for b in Backend.objects.select_related("fallback_for").order_by("name"):
            self.stdout.write(
                f"{b.name:<16} {b.slots:>5} {b.reserved_slots:>4} {b.tpm or '-':>9} {b.rpm or '-':>6} "
                f"{'yes' if b.enabled else 'no':<7} {b.fallback_for.name if b.fallback_for else '-':<14} "
                f"{','.join(b.model_names)} {b.url}"
            )
