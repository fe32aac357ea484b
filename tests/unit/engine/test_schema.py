"""The scheduler configuration schema: the example file, round trips, Decimal exactness, errors."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from scheduling.engine.model import (
    AgingPolicy,
    AgingSegment,
    BackendSpec,
    Boost,
    ClassSpec,
    DowngradeRule,
    FairnessMode,
    FairnessPolicy,
    Policy,
    QueuePolicy,
    SchedulerConfig,
    TenantSpec,
)
from scheduling.engine.rules import Facts, classify
from scheduling.engine.schema import (
    ConfigError,
    ConfigIssue,
    config_from_dict,
    config_from_yaml,
    config_to_dict,
    config_to_yaml,
)

EXAMPLE_PATH = Path(__file__).resolve().parents[3] / "config" / "scheduler.example.yaml"
EXAMPLE = EXAMPLE_PATH.read_text(encoding="utf-8")
MINIMAL = """scheduler:
  classes:
    - {name: INTERACTIVE, level: 0, sla_ms: 3000, price_factor: 1.6}
    - {name: BATCH, level: 2, sla_ms: 1800000, price_factor: 0.7}
"""


def load_example():
    return config_from_yaml(EXAMPLE, source=str(EXAMPLE_PATH))


def test_example_file_holds_the_field_report_configuration() -> None:
    config = load_example()
    assert [(c.name, c.level, c.sla_ms, c.price_factor) for c in config.classes] == [
        ("INTERACTIVE", 0, 3000, Decimal("1.6")),
        ("NEAR_RT", 1, 15000, Decimal("1.2")),
        ("BATCH", 2, 1800000, Decimal("0.7")),
        ("RETRY", 3, 3600000, Decimal("0.4")),
    ]
    assert [(s.lo, s.hi, s.boost, s.k) for s in config.aging.segments] == [
        (0.0, 0.5, Boost.NONE, 0.0),
        (0.5, 0.8, Boost.LINEAR, 1.0),
        (0.8, 0.95, Boost.QUADRATIC, 2.2),
        (0.95, None, Boost.PREEMPT, 0.0),
    ]
    assert config.fairness == FairnessPolicy(FairnessMode.WEIGHTED_FAIR_TOKENS, "quota_share", 0.02)
    assert config.queue == QueuePolicy(depth_cap=20000)
    assert config.policy is Policy.FAIRGATE
    assert config.downgrade_rules == (
        DowngradeRule("long-prompt", "class==INTERACTIVE and prompt_tokens>8000", "DOWNGRADE_TO_NEAR_RT", order=1),
        DowngradeRule("batch-network", "class==INTERACTIVE and src_cidr in BATCH_NET", "DOWNGRADE_TO_BATCH", order=2),
    )
    assert config.networks["BATCH_NET"] == ("10.20.0.0/16",)
    assert 5 <= len(config.tenants) <= 6 and sum(t.vip for t in config.tenants) == 1
    (backend,) = config.backends
    assert (backend.name, backend.url, backend.models, backend.slots) == (
        "sim-gpu",
        "http://127.0.0.1:9100/v1",
        ("sim-llama",),
        8,
    )
    assert (backend.input_price_per_1k, backend.output_price_per_1k) == (Decimal("0.002"), Decimal("0.006"))


def test_example_rules_classify_as_the_field_report_describes() -> None:
    config = load_example()

    def effective(prompt_tokens: int, src_ip: str) -> tuple[str, str | None]:
        facts = Facts("INTERACTIVE", prompt_tokens, None, "support", src_ip)
        return classify(
            declared="INTERACTIVE",
            facts=facts,
            rules=config.downgrade_rules,
            classes=config.classes,
            networks=config.networks,
        )

    assert effective(9000, "192.168.0.2") == ("NEAR_RT", "long-prompt")
    assert effective(100, "10.20.4.4") == ("BATCH", "batch-network")
    assert effective(9000, "10.20.4.4") == ("BATCH", "batch-network")
    assert effective(8000, "192.168.0.2") == ("INTERACTIVE", None)


def test_yaml_round_trip_of_the_example() -> None:
    config = load_example()
    text = config_to_yaml(config)
    assert config_from_yaml(text) == config
    assert config_to_yaml(config_from_yaml(text)) == text
    assert "- {name: INTERACTIVE, level: 0, sla_ms: 3000, price_factor: 1.6}" in text
    assert "!!" not in text and "python" not in text


def test_dict_round_trip_and_dict_shape() -> None:
    config = load_example()
    data = config_to_dict(config)
    assert config_from_dict(data) == config
    assert data["classes"][0] == {"name": "INTERACTIVE", "level": 0, "sla_ms": 3000, "price_factor": Decimal("1.6")}
    assert data["downgrade_check"][1]["if"] == "class==INTERACTIVE and src_cidr in BATCH_NET"


def test_decimals_are_read_from_the_text_never_through_a_float() -> None:
    config = config_from_yaml(
        MINIMAL.replace("1.6", "1.1").replace("0.7", "0.30000000000000000001")
        + """
  tenants:
    - {slug: a, quota_share: 0.1, annual_budget: 10000.10}
  backends:
    - {name: b, models: [m], slots: 1, input_price_per_1k: 0.0001, output_price_per_1k: "0.000003"}
"""
    )
    assert str(config.classes[0].price_factor) == "1.1"
    assert config.classes[1].price_factor == Decimal("0.30000000000000000001")
    assert str(config.tenants[0].annual_budget) == "10000.10"
    assert config.backends[0].input_price_per_1k == Decimal("0.0001")
    assert config.backends[0].output_price_per_1k == Decimal("0.000003")
    assert all(isinstance(c.price_factor, Decimal) for c in config.classes)


def test_decimals_are_written_exactly() -> None:
    config = config_from_yaml(MINIMAL.replace("0.7", "0.30000000000000000001").replace("1.6", "2"))
    text = config_to_yaml(config)
    assert "price_factor: 0.30000000000000000001" in text and "price_factor: 2}" in text
    assert config_from_yaml(text) == config


def test_config_from_dict_reads_python_floats_by_their_shortest_text() -> None:
    config = config_from_dict({"classes": [{"name": "A", "level": 0, "sla_ms": 1, "price_factor": 1.6}]})
    assert config.classes[0].price_factor == Decimal("1.6")


def test_defaults_when_sections_are_omitted() -> None:
    config = config_from_yaml(MINIMAL)
    assert config.policy is Policy.FAIRGATE
    assert config.aging == AgingPolicy() and config.queue == QueuePolicy()
    assert config.fairness.mode is FairnessMode.WEIGHTED_FAIR_TOKENS
    assert config.downgrade_rules == () and config.networks == {}
    assert config.tenants is None and config.backends is None
    empty = config_from_yaml(MINIMAL + "  tenants: []\n  backends: []\n")
    assert empty.tenants == () and empty.backends == ()


def test_optional_values_and_defaults() -> None:
    config = config_from_yaml(
        MINIMAL
        + """  tenant_fairness: {mode: weighted_round_robin}
  queue: {single_queue: true, service_ms_prior: 5000}
  policy: strict
  downgrade_check:
    - {if: "prompt_tokens > 5", action: DOWNGRADE_TO_BATCH, enabled: false}
    - {name: second, if: "tenant == 'x y'", action: DOWNGRADE_TO_BATCH}
    - {if: "max_tokens > 5", action: DOWNGRADE_TO_BATCH}
"""
    )
    assert config.fairness.mode is FairnessMode.WEIGHTED_ROUND_ROBIN
    assert config.queue.single_queue and config.queue.service_ms_prior == 5000
    assert config.policy is Policy.STRICT
    assert [(r.name, r.order, r.enabled) for r in config.downgrade_rules] == [
        ("rule-1", 1, False),
        ("second", 2, True),
        ("rule-3", 3, True),
    ]
    assert config_from_yaml(config_to_yaml(config)) == config


def test_prediction_keys_are_read_beside_the_depth_limit_and_written_back_when_set() -> None:
    # predicted admission is the default (issue 48); fast-fail stays off unless configured
    assert (QueuePolicy().admission, QueuePolicy().fast_fail) == ("predicted", False)
    config = config_from_yaml(MINIMAL + "  queue: {admission: predicted, predict_margin: 0.75, fast_fail: true}\n")
    assert (config.queue.admission, config.queue.predict_margin, config.queue.fast_fail) == ("predicted", 0.75, True)
    assert config_from_yaml(config_to_yaml(config)) == config
    depth = config_from_yaml(MINIMAL + "  queue: {admission: depth}\n")
    assert depth.queue.admission == "depth" and config_to_dict(depth)["queue"]["admission"] == "depth"
    assert config_from_yaml(config_to_yaml(depth)) == depth
    without = config_from_yaml(MINIMAL + "  queue: {depth_cap: 5}\n")  # a configuration from before: the default
    assert without.queue.admission == "predicted" and "admission" not in config_to_dict(without)["queue"]


def test_prior_weight_and_margin_after_are_read_and_written_back_when_set() -> None:
    assert (QueuePolicy().prior_weight, QueuePolicy().margin_after_ms) == (0, 0)  # off unless configured
    config = config_from_yaml(MINIMAL + "  queue: {admission: predicted, prior_weight: 30, margin_after_ms: 60000}\n")
    assert (config.queue.prior_weight, config.queue.margin_after_ms) == (30, 60000)
    assert config_from_yaml(config_to_yaml(config)) == config
    assert "prior_weight" not in config_to_dict(config_from_yaml(MINIMAL + "  queue: {depth_cap: 5}\n"))["queue"]


def test_inactive_and_disabled_entries_survive_a_round_trip() -> None:
    config = config_from_yaml(
        MINIMAL.replace("price_factor: 0.7}", "price_factor: 0.7, active: false}")
        + """
  tenants:
    - {slug: gone, quota_share: 1, active: false, classes: [BATCH]}
  backends:
    - {name: main, models: [m1, m2], slots: 4, tpm: 1000, rpm: 60, reserved_slots: 4}
    - {name: spare, url: "https://api.example.com/v1", models: [m1], slots: 1, fallback_for: main, enabled: false}
"""
    )
    assert config.classes[1].active is False and config.tenants[0].active is False
    assert config.backends[1].fallback_for == "main" and config.backends[1].enabled is False
    assert config_from_yaml(config_to_yaml(config)) == config
    assert config_from_dict(config_to_dict(config)) == config


def test_network_cidrs_are_normalised() -> None:
    config = config_from_yaml(MINIMAL + "  networks:\n    V6: ['2001:DB8:0:0::/32', 10.0.0.7]\n")
    assert config.networks == {"V6": ("2001:db8::/32", "10.0.0.7/32")}


def test_issue_and_error_render_file_line_field_and_message() -> None:
    issue = ConfigIssue("a.yaml", 7, "scheduler.queue.depth_cap", "must be an integer >= 1, got 0")
    assert str(issue) == "a.yaml:7: scheduler.queue.depth_cap: must be an integer >= 1, got 0"
    assert str(ConfigIssue("<dict>", None, "scheduler", "x")) == "<dict>: scheduler: x"
    error = ConfigError([issue, issue._replace(line=9)])
    assert str(error).splitlines() == [str(issue), str(issue._replace(line=9))]


def test_every_problem_is_reported_at_once_in_line_order() -> None:
    bad = (
        EXAMPLE.replace("sla_ms: 3000,", "sla_ms: -5,")
        .replace("min_share: 0.02", "min_share: 2")
        .replace("DOWNGRADE_TO_BATCH}", "DOWNGRADE_TO_BULK}")
        .replace("[10.20.0.0/16]", "[10.20.0.0/33]")
    )
    with pytest.raises(ConfigError) as caught:
        config_from_yaml(bad, source="deploy.yaml")
    fields = [i.field for i in caught.value.issues]
    assert fields == [
        "scheduler.classes[0].sla_ms",
        "scheduler.tenant_fairness.min_share",
        "scheduler.networks.BATCH_NET[0]",
        "scheduler.downgrade_check[1].action",
    ]
    lines = [i.line for i in caught.value.issues]
    assert lines == sorted(lines) and all(lines)
    assert all(line.startswith("deploy.yaml:") for line in str(caught.value).splitlines())


def test_config_from_dict_errors_have_no_line_numbers() -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"classes": [{"name": "a", "level": 0, "sla_ms": 1, "price_factor": 1}]})
    (issue,) = caught.value.issues
    assert (issue.source, issue.line, issue.field) == ("<dict>", None, "scheduler.classes[0].name")


def test_loading_never_runs_arbitrary_yaml_tags() -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_yaml(MINIMAL + "  policy: !!python/object/apply:os.system ['true']\n")
    assert caught.value.issues[0].line == 5


def test_output_is_plain_yaml_that_a_safe_loader_reads() -> None:
    data = yaml.safe_load(config_to_yaml(load_example()))
    assert data["scheduler"]["classes"][0]["price_factor"] == 1.6
    assert data["scheduler"]["aging"]["segments"][3]["wait_ratio"] == ">=0.95"


# --- every invalid case is refused, naming field and line ------------------------------


def with_class(entry: str) -> str:  # the entry is on line 3
    return (
        f"scheduler:\n  classes:\n    - {entry}\n    - {{name: BATCH, level: 2, sla_ms: 1800000, price_factor: 0.7}}\n"
    )


def add(snippet: str) -> str:  # the snippet starts on line 5
    return MINIMAL + snippet


def segments(*entries: str) -> str:  # entry i is on line 7 + i
    return add("  aging:\n    segments:\n" + "".join(f"      - {e}\n" for e in entries))


def rules(*entries: str) -> str:  # entry i is on line 8 + i
    return add(
        "  networks:\n    BATCH_NET: [10.20.0.0/16]\n  downgrade_check:\n" + "".join(f"    - {e}\n" for e in entries)
    )


def listing(section: str, *entries: str) -> str:  # entry i is on line 6 + i
    return add(f"  {section}:\n" + "".join(f"    - {e}\n" for e in entries))


OK_SEGMENT = '{wait_ratio: "0-0.5", boost: 0}'
OPEN_SEGMENT = '{wait_ratio: ">=0.5", boost: preempt}'
OK_RULE = '{if: "prompt_tokens > 1", action: DOWNGRADE_TO_BATCH}'
BACKEND = "{name: main, models: [m], slots: 2"
S, A, Q, T, B, R = (
    "scheduler",
    "scheduler.aging",
    "scheduler.queue",
    "scheduler.tenants",
    "scheduler.backends",
    "scheduler.downgrade_check",
)

INVALID = [
    # document and sections
    ("yaml-syntax", add("  queue: {depth_cap: 1\n"), "(yaml)", 6, "expected ',' or '}'"),
    ("no-scheduler", "other: 1\n", "other", 1, "unknown top-level key"),
    ("scheduler-not-mapping", "scheduler: [1]\n", S, 1, "must be a mapping"),
    ("unknown-section", add("  colour: red\n"), f"{S}.colour", 5, "unknown key 'colour'"),
    ("duplicate-key", add("  policy: fifo\n  policy: strict\n"), f"{S}.policy", 6, "duplicate key"),
    ("classes-missing", "scheduler:\n  policy: fifo\n", f"{S}.classes", 1, "is required"),
    ("classes-empty", "scheduler:\n  classes: []\n", f"{S}.classes", 2, "must not be empty"),
    ("section-null", add("  tenants:\n"), T, 5, "must be a list"),
    ("policy", add("  policy: greedy\n"), f"{S}.policy", 5, "'greedy' is not one of: fairgate"),
    # classes
    (
        "class-lowercase",
        with_class("{name: gold, level: 0, sla_ms: 1, price_factor: 1}"),
        f"{S}.classes[0].name",
        3,
        "uppercase identifier",
    ),
    (
        "class-duplicate-name",
        with_class("{name: BATCH, level: 0, sla_ms: 1, price_factor: 1}"),
        f"{S}.classes[1].name",
        4,
        "duplicate class name 'BATCH'",
    ),
    (
        "class-duplicate-level",
        with_class("{name: GOLD, level: 2, sla_ms: 1, price_factor: 1}"),
        f"{S}.classes[1].level",
        4,
        "duplicate class level 2",
    ),
    (
        "class-negative-level",
        with_class("{name: GOLD, level: -1, sla_ms: 1, price_factor: 1}"),
        f"{S}.classes[0].level",
        3,
        ">= 0",
    ),
    (
        "class-level-not-int",
        with_class("{name: GOLD, level: top, sla_ms: 1, price_factor: 1}"),
        f"{S}.classes[0].level",
        3,
        "must be an integer",
    ),
    (
        "class-negative-sla",
        with_class("{name: GOLD, level: 0, sla_ms: -5, price_factor: 1}"),
        f"{S}.classes[0].sla_ms",
        3,
        ">= 1, got -5",
    ),
    (
        "class-zero-sla",
        with_class("{name: GOLD, level: 0, sla_ms: 0, price_factor: 1}"),
        f"{S}.classes[0].sla_ms",
        3,
        ">= 1",
    ),
    (
        "class-fraction-sla",
        with_class("{name: GOLD, level: 0, sla_ms: 1.5, price_factor: 1}"),
        f"{S}.classes[0].sla_ms",
        3,
        "must be an integer",
    ),
    (
        "class-zero-price",
        with_class("{name: GOLD, level: 0, sla_ms: 1, price_factor: 0}"),
        f"{S}.classes[0].price_factor",
        3,
        "must be > 0",
    ),
    (
        "class-negative-price",
        with_class("{name: GOLD, level: 0, sla_ms: 1, price_factor: -0.5}"),
        f"{S}.classes[0].price_factor",
        3,
        "must be > 0",
    ),
    (
        "class-price-text",
        with_class("{name: GOLD, level: 0, sla_ms: 1, price_factor: cheap}"),
        f"{S}.classes[0].price_factor",
        3,
        "must be a decimal number",
    ),
    (
        "class-price-inf",
        with_class("{name: GOLD, level: 0, sla_ms: 1, price_factor: .inf}"),
        f"{S}.classes[0].price_factor",
        3,
        "must be a decimal number",
    ),
    (
        "class-missing-price",
        with_class("{name: GOLD, level: 0, sla_ms: 1}"),
        f"{S}.classes[0].price_factor",
        3,
        "is required",
    ),
    (
        "class-unknown-key",
        with_class("{name: GOLD, level: 0, sla_ms: 1, price_factor: 1, colour: red}"),
        f"{S}.classes[0].colour",
        3,
        "unknown key",
    ),
    (
        "class-active-not-bool",
        with_class("{name: GOLD, level: 0, sla_ms: 1, price_factor: 1, active: 2}"),
        f"{S}.classes[0].active",
        3,
        "true or false",
    ),
    # aging
    ("aging-mode", add("  aging: {mode: exponential}\n"), f"{A}.mode", 5, "'exponential' is not one of"),
    (
        "aging-not-from-zero",
        segments('{wait_ratio: "0.1-0.5", boost: 0}', OPEN_SEGMENT),
        f"{A}.segments[0].wait_ratio",
        7,
        "must start at 0",
    ),
    (
        "aging-gap",
        segments(OK_SEGMENT, '{wait_ratio: ">=0.6", boost: preempt}'),
        f"{A}.segments[1].wait_ratio",
        8,
        "gap after 0.5",
    ),
    (
        "aging-overlap",
        segments(OK_SEGMENT, '{wait_ratio: ">=0.4", boost: preempt}'),
        f"{A}.segments[1].wait_ratio",
        8,
        "overlaps the previous segment",
    ),
    (
        "aging-reversed",
        segments('{wait_ratio: "0.5-0", boost: 0}', OPEN_SEGMENT),
        f"{A}.segments[0].wait_ratio",
        7,
        "with a < b",
    ),
    ("aging-malformed", segments('{wait_ratio: "half", boost: 0}'), f"{A}.segments[0].wait_ratio", 7, '"a-b"'),
    ("aging-ratio-number", segments("{wait_ratio: 0.5, boost: 0}"), f"{A}.segments[0].wait_ratio", 7, '"a-b"'),
    ("aging-last-closed", segments(OK_SEGMENT), f"{A}.segments[0].wait_ratio", 7, "last segment must be open"),
    (
        "aging-open-in-middle",
        segments('{wait_ratio: ">=0", boost: 0}', OPEN_SEGMENT),
        f"{A}.segments[0].wait_ratio",
        7,
        "only the last segment may be open",
    ),
    (
        "aging-boost",
        segments('{wait_ratio: ">=0", boost: turbo}'),
        f"{A}.segments[0].boost",
        7,
        "'turbo' is not one of: 0, none, linear, quadratic, preempt",
    ),
    (
        "aging-linear-without-k",
        segments('{wait_ratio: ">=0", boost: linear}'),
        f"{A}.segments[0].k",
        7,
        "is required for boost 'linear'",
    ),
    ("aging-negative-k", segments('{wait_ratio: ">=0", boost: quadratic, k: -1}'), f"{A}.segments[0].k", 7, ">= 0"),
    (
        "aging-k-on-preempt",
        segments('{wait_ratio: ">=0", boost: preempt, k: 2}'),
        f"{A}.segments[0].k",
        7,
        "only applies to linear and quadratic",
    ),
    (
        "aging-weakening",
        segments('{wait_ratio: "0-0.5", boost: preempt}', '{wait_ratio: ">=0.5", boost: linear, k: 1}'),
        f"{A}.segments[1].boost",
        8,
        "must not weaken",
    ),
    # fairness, queue
    ("fairness-mode", add("  tenant_fairness: {mode: lottery}\n"), f"{S}.tenant_fairness.mode", 5, "not one of"),
    (
        "fairness-weight",
        add("  tenant_fairness: {weight_source: headcount}\n"),
        f"{S}.tenant_fairness.weight_source",
        5,
        "'headcount' is not one of: quota_share",
    ),
    (
        "min-share-high",
        add("  tenant_fairness:\n    min_share: 1.5\n"),
        f"{S}.tenant_fairness.min_share",
        6,
        "0 <= min_share <= 1",
    ),
    (
        "min-share-negative",
        add("  tenant_fairness: {min_share: -0.1}\n"),
        f"{S}.tenant_fairness.min_share",
        5,
        "between 0 and 1",
    ),
    ("depth-cap-zero", add("  queue:\n    depth_cap: 0\n"), f"{Q}.depth_cap", 6, ">= 1, got 0"),
    (
        "depth-formula",
        add("  queue: {depth_formula: 'rpm * 2'}\n"),
        f"{Q}.depth_formula",
        5,
        "only 'throughput_1m * sla_sec' is supported",
    ),
    ("on-full", add("  queue: {on_full: REJECT_503}\n"), f"{Q}.on_full", 5, "REJECT_429_QUEUE_FULL"),
    (
        "on-timeout",
        add("  queue: {on_timeout: REJECT_429_QUEUE_FULL}\n"),
        f"{Q}.on_timeout",
        5,
        "REJECT_504_QUEUE_TIMEOUT",
    ),
    ("queue-flag", add("  queue: {single_queue: sometimes}\n"), f"{Q}.single_queue", 5, "true or false"),
    ("queue-prior", add("  queue: {service_ms_prior: 0}\n"), f"{Q}.service_ms_prior", 5, ">= 1"),
    ("admission", add("  queue: {admission: guessed}\n"), f"{Q}.admission", 5, "not one of: depth, predicted"),
    ("margin-zero", add("  queue: {predict_margin: 0}\n"), f"{Q}.predict_margin", 5, "0 < predict_margin <= 1"),
    ("margin-high", add("  queue: {predict_margin: 1.2}\n"), f"{Q}.predict_margin", 5, "0 < predict_margin <= 1"),
    ("fast-fail-flag", add("  queue: {fast_fail: soon}\n"), f"{Q}.fast_fail", 5, "true or false"),
    ("prior-weight", add("  queue: {prior_weight: -1}\n"), f"{Q}.prior_weight", 5, ">= 0"),
    ("margin-after", add("  queue: {margin_after_ms: 1.5}\n"), f"{Q}.margin_after_ms", 5, "must be an integer"),
    # networks
    ("network-bad-cidr", add("  networks:\n    LAB: [10.0.0.0/33]\n"), f"{S}.networks.LAB[0]", 6, "not a valid CIDR"),
    (
        "network-host-bits",
        add("  networks:\n    LAB: [10.20.1.0/16]\n"),
        f"{S}.networks.LAB[0]",
        6,
        "did you mean 10.20.0.0/16",
    ),
    ("network-name", add("  networks:\n    lab: [10.0.0.0/8]\n"), f"{S}.networks.lab", 6, "uppercase identifier"),
    ("network-empty", add("  networks:\n    LAB: []\n"), f"{S}.networks.LAB", 6, "must not be empty"),
    # downgrade rules
    (
        "rule-syntax",
        rules('{if: "prompt_tokens >", action: DOWNGRADE_TO_BATCH}'),
        f"{R}[0].if",
        8,
        "column 16: expected an integer",
    ),
    (
        "rule-unknown-class",
        rules('{if: "class == GOLD", action: DOWNGRADE_TO_BATCH}'),
        f"{R}[0].if",
        8,
        "unknown class 'GOLD'",
    ),
    (
        "rule-unknown-network",
        rules('{if: "src_cidr in LAB_NET", action: DOWNGRADE_TO_BATCH}'),
        f"{R}[0].if",
        8,
        "unknown network 'LAB_NET'",
    ),
    (
        "rule-unknown-action",
        rules('{if: "prompt_tokens > 1", action: DOWNGRADE_TO_NEAR_RT}'),
        f"{R}[0].action",
        8,
        "unknown action 'DOWNGRADE_TO_NEAR_RT'",
    ),
    (
        "rule-bare-class-action",
        rules('{if: "prompt_tokens > 1", action: BATCH}'),
        f"{R}[0].action",
        8,
        "expected DOWNGRADE_TO_<class>",
    ),
    (
        "rule-reserved-name",
        rules('{name: budget, if: "prompt_tokens > 1", action: DOWNGRADE_TO_BATCH}'),
        f"{R}[0].name",
        8,
        "'budget' is reserved",
    ),
    (
        "rule-reserved-undeclared",
        rules('{name: undeclared, if: "max_tokens > 1", action: DOWNGRADE_TO_BATCH}'),
        f"{R}[0].name",
        8,
        "reserved",
    ),
    (
        "rule-duplicate-name",
        rules('{name: rule-2, if: "max_tokens > 1", action: DOWNGRADE_TO_BATCH}', OK_RULE),
        f"{R}[1].name",
        9,
        "duplicate rule name 'rule-2'",
    ),
    ("rule-missing-if", rules("{action: DOWNGRADE_TO_BATCH}"), f"{R}[0].if", 8, "is required"),
    (
        "rule-enabled",
        rules('{if: "max_tokens > 1", action: DOWNGRADE_TO_BATCH, enabled: maybe}'),
        f"{R}[0].enabled",
        8,
        "true or false",
    ),
    ("rules-not-list", add("  downgrade_check: {if: x}\n"), R, 5, "must be a list"),
    # tenants
    (
        "tenant-zero-share",
        listing("tenants", "{slug: a, quota_share: 0}"),
        f"{T}[0].quota_share",
        6,
        "0 < quota_share <= 1",
    ),
    (
        "tenant-big-share",
        listing("tenants", "{slug: a, quota_share: 1.01}"),
        f"{T}[0].quota_share",
        6,
        "0 < quota_share <= 1",
    ),
    ("tenant-missing-share", listing("tenants", "{slug: a}"), f"{T}[0].quota_share", 6, "is required"),
    (
        "tenant-unknown-class",
        listing("tenants", "{slug: a, quota_share: 0.5, classes: [BATCH, GOLD]}"),
        f"{T}[0].classes[1]",
        6,
        "unknown class 'GOLD'",
    ),
    (
        "tenant-duplicate",
        listing("tenants", "{slug: a, quota_share: 0.5}", "{slug: a, quota_share: 0.5}"),
        f"{T}[1].slug",
        7,
        "duplicate tenant slug 'a'",
    ),
    ("tenant-slug", listing("tenants", "{slug: 'a b', quota_share: 0.5}"), f"{T}[0].slug", 6, "is not valid"),
    (
        "tenant-budget",
        listing("tenants", "{slug: a, quota_share: 0.5, annual_budget: -1}"),
        f"{T}[0].annual_budget",
        6,
        ">= 0",
    ),
    ("tenant-vip", listing("tenants", "{slug: a, quota_share: 0.5, vip: 3}"), f"{T}[0].vip", 6, "true or false"),
    # backends
    (
        "backend-no-models",
        listing("backends", "{name: main, models: [], slots: 2}"),
        f"{B}[0].models",
        6,
        "at least one model",
    ),
    ("backend-missing-models", listing("backends", "{name: main, slots: 2}"), f"{B}[0].models", 6, "is required"),
    ("backend-zero-slots", listing("backends", "{name: main, models: [m], slots: 0}"), f"{B}[0].slots", 6, ">= 1"),
    (
        "backend-reserved",
        listing("backends", BACKEND + ", reserved_slots: 3}"),
        f"{B}[0].reserved_slots",
        6,
        "between 0 and 2",
    ),
    (
        "backend-fallback-unknown",
        listing("backends", BACKEND + ", fallback_for: other}"),
        f"{B}[0].fallback_for",
        6,
        "must name another backend",
    ),
    (
        "backend-fallback-self",
        listing("backends", BACKEND + ", fallback_for: main}"),
        f"{B}[0].fallback_for",
        6,
        "must name another backend",
    ),
    (
        "backend-duplicate",
        listing("backends", BACKEND + "}", BACKEND + "}"),
        f"{B}[1].name",
        7,
        "duplicate backend name 'main'",
    ),
    (
        "backend-price",
        listing("backends", BACKEND + ", output_price_per_1k: -0.01}"),
        f"{B}[0].output_price_per_1k",
        6,
        ">= 0",
    ),
    ("backend-url", listing("backends", BACKEND + ", url: 'ftp://host'}"), f"{B}[0].url", 6, "http:// or https://"),
    ("backend-tpm", listing("backends", BACKEND + ", tpm: 0}"), f"{B}[0].tpm", 6, ">= 1"),
    (
        "backend-embedding-model-not-served",
        listing("backends", BACKEND + ", embedding_models: [other]}"),
        f"{B}[0].embedding_models[0]",
        6,
        "must be one of this backend's models",
    ),
]


@pytest.mark.parametrize(
    "text, field, line, fragment", [case[1:] for case in INVALID], ids=[case[0] for case in INVALID]
)
def test_invalid_configuration_is_refused_naming_field_and_line(
    text: str, field: str, line: int, fragment: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_yaml(text, source="bad.yaml")
    matching = [i for i in caught.value.issues if i.field == field and fragment in i.message]
    assert matching, str(caught.value)
    assert matching[0].line == line, str(caught.value)
    assert f"bad.yaml:{line}: {field}: " in str(caught.value)


# --- property: any valid configuration survives YAML and dict round trips ---------------

money = st.decimals(min_value=Decimal("0"), max_value=Decimal("100000"), places=4)
positive_money = st.decimals(min_value=Decimal("0.0001"), max_value=Decimal("100"), places=18)
words = st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True)


@st.composite
def configs(draw: st.DrawFn) -> SchedulerConfig:
    names = draw(st.lists(st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True), min_size=1, max_size=5, unique=True))
    levels = draw(st.lists(st.integers(0, 50), min_size=len(names), max_size=len(names), unique=True))
    classes = tuple(
        ClassSpec(n, lv, draw(st.integers(1, 10**8)), draw(positive_money), draw(st.booleans()))
        for n, lv in zip(names, levels)
    )
    bounds = [0.0, *sorted(draw(st.sets(st.floats(0.001, 100), max_size=4)))]
    ranks = sorted(
        draw(st.lists(st.sampled_from(list(Boost)), min_size=len(bounds), max_size=len(bounds))), key=list(Boost).index
    )
    segments = tuple(
        AgingSegment(
            lo,
            bounds[i + 1] if i + 1 < len(bounds) else None,
            boost,
            draw(st.floats(0, 1e6)) if boost in (Boost.LINEAR, Boost.QUADRATIC) else 0.0,
        )
        for i, (lo, boost) in enumerate(zip(bounds, ranks))
    )
    networks = draw(
        st.dictionaries(
            st.sampled_from(["BATCH_NET", "ETL", "V6"]),
            st.lists(
                st.sampled_from(["10.20.0.0/16", "192.168.1.0/24", "fd00::/8", "10.0.0.1/32"]), min_size=1, max_size=2
            ).map(tuple),
        )
    )
    conditions = [f"class == {n} and prompt_tokens > 10" for n in names] + [f"src_cidr in {n}" for n in networks]
    rules = tuple(
        DowngradeRule(
            f"r{i}",
            draw(st.sampled_from(conditions)),
            "DOWNGRADE_TO_" + draw(st.sampled_from(names)),
            draw(st.booleans()),
            i + 1,
        )
        for i in range(draw(st.integers(0, 3)))
    )
    tenants = draw(
        st.none()
        | st.lists(
            st.builds(
                TenantSpec,
                words,
                st.floats(0, 1, exclude_min=True),
                st.sampled_from(["", "Finance", "R&D: lab #2"]),
                st.none() | money,
                st.lists(st.sampled_from(names), unique=True).map(tuple),
                st.booleans(),
                st.booleans(),
            ),
            max_size=3,
            unique_by=lambda t: t.slug,
        ).map(tuple)
    )
    return SchedulerConfig(
        classes=classes,
        aging=AgingPolicy(draw(st.sampled_from(["piecewise", "linear", "none"])), segments),
        fairness=FairnessPolicy(draw(st.sampled_from(list(FairnessMode))), "quota_share", draw(st.floats(0, 1))),
        queue=QueuePolicy(
            depth_cap=draw(st.integers(1, 10**6)),
            single_queue=draw(st.booleans()),
            honour_cancel=draw(st.booleans()),
            service_ms_prior=draw(st.integers(1, 10**6)),
            admission=draw(st.sampled_from(["depth", "predicted"])),
            predict_margin=draw(st.floats(0, 1, exclude_min=True)),
            fast_fail=draw(st.booleans()),
            prior_weight=draw(st.integers(0, 100)),
            margin_after_ms=draw(st.integers(0, 10**6)),
        ),
        downgrade_rules=rules,
        networks=networks,
        policy=draw(st.sampled_from(list(Policy))),
        tenants=tenants,
        backends=draw(st.none() | backends()),
    )


@st.composite
def backends(draw: st.DrawFn) -> tuple[BackendSpec, ...]:
    names = draw(st.lists(words, max_size=3, unique=True))
    specs = []
    for name in names:
        slots = draw(st.integers(1, 64))
        models = tuple(draw(st.lists(words, min_size=1, max_size=2, unique=True)))
        specs.append(
            BackendSpec(
                name,
                models,
                slots,
                draw(st.sampled_from(["", "http://127.0.0.1:9100/v1", "https://api.example.com/v1?x=1"])),
                draw(st.none() | st.integers(1, 10**7)),
                draw(st.none() | st.integers(1, 10**5)),
                draw(money),
                draw(money),
                draw(st.none() | st.sampled_from([n for n in names if n != name] or [None])),
                draw(st.integers(0, slots)),
                draw(st.booleans()),
                tuple(m for m in models if draw(st.booleans())),
            )
        )
    return tuple(specs)


@settings(max_examples=150, deadline=None)
@given(configs())
def test_any_valid_configuration_round_trips(config: SchedulerConfig) -> None:
    assert config_from_dict(config_to_dict(config)) == config
    assert config_from_yaml(config_to_yaml(config)) == config


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5) | st.decimals(),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "classes",
                    "name",
                    "level",
                    "sla_ms",
                    "price_factor",
                    "aging",
                    "segments",
                    "wait_ratio",
                    "boost",
                    "k",
                    "networks",
                    "BATCH_NET",
                    "downgrade_check",
                    "if",
                    "action",
                    "tenants",
                    "slug",
                    "quota_share",
                    "backends",
                    "models",
                    "slots",
                    "fallback_for",
                    "x",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "classes",
                "aging",
                "queue",
                "networks",
                "downgrade_check",
                "tenants",
                "backends",
                "policy",
                "tenant_fairness",
                "x",
            ]
        ),
        json_like,
        max_size=5,
    )
)
@example({"classes": None, "backends": [{"name": []}]})  # found by Hypothesis: an unhashable backend name
def test_arbitrary_data_is_accepted_or_refused_with_config_error(data: dict) -> None:
    try:
        config = config_from_dict(data)
    except ConfigError as exc:
        assert exc.issues and all(issue.field.startswith("scheduler") for issue in exc.issues)
    else:
        assert config_from_dict(config_to_dict(config)) == config


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(max_size=80),
        st.lists(
            st.sampled_from(
                [
                    "scheduler:",
                    "\n  ",
                    "classes:",
                    "- ",
                    "{name: A, level: 0, sla_ms: 1, price_factor: 1}",
                    "&a ",
                    "*a",
                    "[",
                    "]",
                    "{",
                    "}",
                    ": ",
                    "!!binary",
                    "1.5",
                    "~",
                    "tenants",
                    "\n",
                ]
            ),
            max_size=25,
        ).map("".join),
    )
)
def test_arbitrary_text_is_accepted_or_refused_with_config_error(text: str) -> None:
    try:
        config_from_yaml(text)
    except ConfigError as exc:
        assert exc.issues
