"""The downgrade-rule language: parsing, rendering, evaluation and classification."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.engine.model import ClassSpec, DowngradeRule
from scheduling.engine.rules import (
    And,
    Compare,
    Facts,
    InNetwork,
    Not,
    Or,
    RuleSyntaxError,
    classify,
    compile_rules,
    condition_names,
    evaluate,
    parse_condition,
    parse_networks,
    render,
)

CLASSES = (
    ClassSpec("INTERACTIVE", 0, 3000, price_factor=1),
    ClassSpec("NEAR_RT", 1, 15000, price_factor=1),
    ClassSpec("BATCH", 2, 1_800_000, price_factor=1),
    ClassSpec("RETRY", 3, 3_600_000, price_factor=1),
)
NETWORKS = {"BATCH_NET": ("10.20.0.0/16",), "V6_NET": ("fd00:30::/64",)}
A = Compare("class", "==", "A")
B = Compare("tenant", "!=", "b")
C = Compare("prompt_tokens", ">", 5)


def facts(
    cls: str = "INTERACTIVE",
    *,
    prompt: int = 100,
    max_tokens: int | None = 256,
    tenant: str = "finance",
    ip: str | None = "192.168.1.5",
) -> Facts:
    return Facts(declared_class=cls, prompt_tokens=prompt, max_tokens=max_tokens, tenant=tenant, src_ip=ip)


def rule(name: str, condition: str, target: str, *, order: int = 0, enabled: bool = True) -> DowngradeRule:
    return DowngradeRule(name, condition, f"DOWNGRADE_TO_{target}", enabled=enabled, order=order)


# --- parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, tree",
    [
        ("class==A", A),
        ("class == A or tenant != b and prompt_tokens > 5", Or((A, And((B, C))))),
        ("(class == A or tenant != b) and prompt_tokens > 5", And((Or((A, B)), C))),
        ("not class == A and tenant != b", And((Not(A), B))),
        ("not (class == A and tenant != b)", Not(And((A, B)))),
        ("class==A and tenant!=b and prompt_tokens>5", And((A, B, C))),
        ("(class==A and tenant!=b) and prompt_tokens>5", And((A, B, C))),
        ("class == A or (tenant != b or prompt_tokens > 5)", Or((A, B, C))),
        ("not not class == A", Not(Not(A))),
        ("src_cidr in BATCH_NET", InNetwork("BATCH_NET")),
        ("src_ip in BATCH_NET", InNetwork("BATCH_NET")),
        ("src_cidr not in BATCH_NET", Not(InNetwork("BATCH_NET"))),
        ("tenant == 'data team'", Compare("tenant", "==", "data team")),
        ('tenant == "or"', Compare("tenant", "==", "or")),
        ("tenant == data-team", Compare("tenant", "==", "data-team")),
        ("max_tokens <= 0", Compare("max_tokens", "<=", 0)),
        ("  prompt_tokens>=8000  ", Compare("prompt_tokens", ">=", 8000)),
    ],
)
def test_parse_builds_the_expected_tree(text: str, tree: object) -> None:
    assert parse_condition(text) == tree


def test_the_field_report_conditions_parse() -> None:
    assert parse_condition("class==INTERACTIVE and prompt_tokens>8000") == And(
        (Compare("class", "==", "INTERACTIVE"), Compare("prompt_tokens", ">", 8000))
    )
    assert parse_condition("class==INTERACTIVE and src_cidr in BATCH_NET") == And(
        (Compare("class", "==", "INTERACTIVE"), InNetwork("BATCH_NET"))
    )


@pytest.mark.parametrize(
    "text, position, fragment",
    [
        ("", 0, "empty condition"),
        ("class == ", 9, "expected a name or quoted string"),
        ("prompt_tokens > abc", 16, "expected an integer"),
        ("class = A", 6, "compare with '=='"),
        ("(class == A", 11, "expected ')'"),
        ("class == A)", 10, "expected 'and', 'or' or end of condition"),
        ("class == A and", 14, "expected a condition"),
        ("colour == red", 0, "expected a condition"),
        ("tenant < b", 7, "can only be compared with == or !="),
        ("class A", 6, "expected a comparison operator"),
        ("src_cidr BATCH_NET", 9, "expected 'in'"),
        ("src_cidr in 'BATCH_NET'", 12, "expected a network name"),
        ("tenant == 'abc", 10, "unterminated string"),
        ("class == A && tenant != b", 11, "use 'and'"),
        ("class == A and tenant == or", 25, "expected a name or quoted string"),
        ("prompt_tokens > 5.5", 17, "unexpected character '.'"),
        ("(" * 40 + "class == A" + ")" * 40, 32, "nested deeper"),
    ],
)
def test_syntax_errors_name_the_position_and_what_was_expected(text: str, position: int, fragment: str) -> None:
    with pytest.raises(RuleSyntaxError) as caught:
        parse_condition(text)
    assert caught.value.position == position
    assert fragment in str(caught.value)
    assert f"column {position + 1}" in str(caught.value)


def test_condition_names_lists_classes_and_networks() -> None:
    expr = parse_condition("class == A or (class != B and src_cidr in N1) or not src_ip in N2 or tenant == C")
    assert condition_names(expr) == ({"A", "B"}, {"N1", "N2"})


# --- rendering and robustness (Hypothesis) ---------------------------------------------


def _join(kind: type, items: list) -> object:
    flat = [part for item in items for part in (item.items if isinstance(item, kind) else (item,))]
    return kind(tuple(flat))


names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,8}", fullmatch=True)
texts = st.one_of(names, st.text(st.characters(blacklist_characters="'\"", blacklist_categories=("Cs",)), max_size=8))
leaves = st.one_of(
    st.builds(Compare, st.sampled_from(["class", "tenant"]), st.sampled_from(["==", "!="]), texts),
    st.builds(
        Compare,
        st.sampled_from(["prompt_tokens", "max_tokens"]),
        st.sampled_from(["==", "!=", "<", "<=", ">", ">="]),
        st.integers(0, 10**9),
    ),
    st.builds(InNetwork, names.filter(lambda n: n not in ("and", "or", "not", "in"))),
)
trees = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.builds(Not, inner),
        st.lists(inner, min_size=2, max_size=4).map(lambda xs: _join(And, xs)),
        st.lists(inner, min_size=2, max_size=4).map(lambda xs: _join(Or, xs)),
    ),
    max_leaves=12,
)


@given(trees)
def test_render_then_parse_gives_the_same_tree(tree: object) -> None:
    assert parse_condition(render(tree)) == tree


TOKENS = [
    "class",
    "tenant",
    "prompt_tokens",
    "max_tokens",
    "src_cidr",
    "src_ip",
    "in",
    "and",
    "or",
    "not",
    "==",
    "!=",
    "<",
    "<=",
    ">",
    ">=",
    "=",
    "(",
    ")",
    "'x'",
    '"',
    "A",
    "8000",
    "-",
    ".",
    " ",
    "!",
]


@settings(max_examples=300)
@given(st.one_of(st.text(max_size=60), st.lists(st.sampled_from(TOKENS), max_size=20).map(" ".join)))
def test_arbitrary_text_either_parses_or_raises_rule_syntax_error(text: str) -> None:
    try:
        tree = parse_condition(text)
    except RuleSyntaxError as exc:
        assert 0 <= exc.position <= len(text)
    else:
        assert parse_condition(render(tree)) == tree


# --- evaluation ------------------------------------------------------------------------

NETS = parse_networks(NETWORKS)


@pytest.mark.parametrize("op", ["==", "!=", "<", "<=", ">", ">="])
def test_comparisons_with_an_absent_max_tokens_are_false(op: str) -> None:
    expr = parse_condition(f"max_tokens {op} 100")
    assert evaluate(expr, facts(max_tokens=None), NETS) is False
    assert evaluate(Not(expr), facts(max_tokens=None), NETS) is True


@pytest.mark.parametrize(
    "condition, expected",
    [
        ("prompt_tokens > 8000", True),
        ("prompt_tokens >= 8001", True),
        ("prompt_tokens > 8001", False),
        ("prompt_tokens < 8001", False),
        ("max_tokens == 256", True),
        ("max_tokens != 256", False),
        ("class == INTERACTIVE", True),
        ("class != INTERACTIVE", False),
        ("tenant == 'finance'", True),
        ("tenant == finance and not prompt_tokens <= 8000", True),
        ("tenant == hr or class == BATCH", False),
    ],
)
def test_evaluate_comparisons(condition: str, expected: bool) -> None:
    assert evaluate(parse_condition(condition), facts(prompt=8001), NETS) is expected


@pytest.mark.parametrize(
    "ip, expected",
    [
        ("10.20.3.4", True),
        ("10.21.0.1", False),
        ("::ffff:10.20.0.9", True),
        ("fd00:30::1", False),
        ("not-an-ip", False),
        ("", False),
        (None, False),
    ],
)
def test_source_network_membership(ip: str | None, expected: bool) -> None:
    assert evaluate(parse_condition("src_cidr in BATCH_NET"), facts(ip=ip), NETS) is expected


def test_evaluate_accepts_cidr_strings_as_well_as_parsed_networks() -> None:
    assert evaluate(parse_condition("src_cidr in BATCH_NET"), facts(ip="10.20.0.1"), NETWORKS) is True


def test_ipv4_address_against_ipv6_network_and_unknown_network_do_not_match() -> None:
    assert evaluate(parse_condition("src_cidr in V6_NET"), facts(ip="10.20.0.1"), NETS) is False
    assert evaluate(parse_condition("src_cidr in V6_NET"), facts(ip="fd00:30::5"), NETS) is True
    assert evaluate(parse_condition("src_cidr in NOWHERE"), facts(ip="10.20.0.1"), NETS) is False


# --- classification --------------------------------------------------------------------


def run(declared: str, rules: list[DowngradeRule], *, allowed: tuple[str, ...] = (), **kw: object) -> tuple:
    return classify(
        declared=declared, facts=facts(declared, **kw), rules=rules, classes=CLASSES, networks=NETWORKS, allowed=allowed
    )


@pytest.mark.parametrize(
    "declared, allowed, expected",
    [
        ("INTERACTIVE", ("NEAR_RT", "BATCH"), ("NEAR_RT", "undeclared")),
        ("NEAR_RT", ("INTERACTIVE", "BATCH"), ("BATCH", "undeclared")),  # never raised to INTERACTIVE
        ("BATCH", ("INTERACTIVE",), ("BATCH", None)),  # only better classes allowed: keep the cheaper one
        ("BATCH", ("BATCH", "RETRY"), ("BATCH", None)),
        ("INTERACTIVE", (), ("INTERACTIVE", None)),  # empty means every class is allowed
    ],
)
def test_undeclared_class_is_lowered_to_the_best_allowed_class_below_it(
    declared: str, allowed: tuple, expected: tuple
) -> None:
    assert run(declared, [], allowed=allowed) == expected


def test_the_lowest_class_wins_whatever_the_rule_order() -> None:
    rules = [
        rule("to-batch", "prompt_tokens > 10", "BATCH", order=1),
        rule("to-near", "prompt_tokens > 10", "NEAR_RT", order=2),
        rule("to-retry", "prompt_tokens > 10", "RETRY", order=3),
        rule("no-match", "prompt_tokens > 99999", "RETRY", order=4),
    ]
    assert run("INTERACTIVE", rules, prompt=50) == ("RETRY", "to-retry")
    assert run("INTERACTIVE", list(reversed(rules)), prompt=50) == ("RETRY", "to-retry")


def test_on_a_tie_the_first_rule_in_order_is_named() -> None:
    rules = [
        rule("second", "prompt_tokens > 10", "BATCH", order=2),
        rule("first", "tenant == finance", "BATCH", order=1),
    ]
    assert run("INTERACTIVE", rules, prompt=50) == ("BATCH", "first")


def test_disabled_rules_are_ignored() -> None:
    rules = [rule("off", "prompt_tokens > 10", "RETRY", enabled=False), rule("on", "prompt_tokens > 10", "NEAR_RT")]
    assert run("INTERACTIVE", rules, prompt=50) == ("NEAR_RT", "on")


def test_a_rule_never_raises_the_class() -> None:
    rules = [rule("up", "class == BATCH", "INTERACTIVE"), rule("same", "class == BATCH", "BATCH")]
    assert run("BATCH", rules) == ("BATCH", None)


def test_rules_see_the_class_after_the_undeclared_step() -> None:
    rules = [
        rule("interactive-only", "class == INTERACTIVE", "RETRY"),
        rule("near-rt", "class == NEAR_RT and tenant == finance", "BATCH"),
    ]
    assert run("INTERACTIVE", rules, allowed=("NEAR_RT", "BATCH")) == ("BATCH", "near-rt")
    assert run("INTERACTIVE", rules[:1], allowed=("NEAR_RT",)) == ("NEAR_RT", "undeclared")


@pytest.mark.parametrize(
    "ip, expected",
    [
        ("10.20.7.7", ("BATCH", "batch-network")),
        ("10.99.0.1", ("INTERACTIVE", None)),
        ("fd00::1", ("INTERACTIVE", None)),
        (None, ("INTERACTIVE", None)),
    ],
)
def test_source_network_rule_match_and_miss(ip: str | None, expected: tuple) -> None:
    rules = [rule("batch-network", "class==INTERACTIVE and src_cidr in BATCH_NET", "BATCH")]
    assert run("INTERACTIVE", rules, ip=ip) == expected


def test_unknown_classes_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown class 'GOLD'"):
        run("GOLD", [])
    with pytest.raises(ValueError, match="unknown target class 'GOLD'"):
        compile_rules([rule("r", "prompt_tokens > 1", "GOLD")], NETWORKS, CLASSES)


def test_compiled_rules_accept_parsed_networks_and_match_classify() -> None:
    rules = [rule("long", "class==INTERACTIVE and prompt_tokens>8000", "NEAR_RT", order=1)]
    compiled = compile_rules(rules, {"BATCH_NET": [ipaddress.ip_network("10.20.0.0/16")]}, CLASSES)
    assert compiled.classify(declared="INTERACTIVE", facts=facts(prompt=9000)) == ("NEAR_RT", "long")
    assert compiled.classify(declared="INTERACTIVE", facts=facts(prompt=8000)) == ("INTERACTIVE", None)


LEVELS = {c.name: c.level for c in CLASSES}
CONDITIONS = [
    "prompt_tokens > 100",
    "class == INTERACTIVE",
    "src_cidr in BATCH_NET",
    "max_tokens < 50",
    "tenant == hr or class == NEAR_RT",
    "not class == RETRY",
]


@given(
    declared=st.sampled_from(list(LEVELS)),
    allowed=st.lists(st.sampled_from(list(LEVELS)), max_size=3, unique=True),
    rules=st.lists(
        st.builds(
            rule,
            st.sampled_from(["a", "b", "c"]),
            st.sampled_from(CONDITIONS),
            st.sampled_from(list(LEVELS)),
            order=st.integers(0, 5),
            enabled=st.booleans(),
        ),
        max_size=5,
    ),
    prompt=st.integers(0, 300),
    max_tokens=st.one_of(st.none(), st.integers(0, 100)),
    ip=st.sampled_from([None, "10.20.1.1", "10.1.1.1", "fd00:30::2", "junk"]),
)
def test_classify_never_raises_a_class_and_names_a_reason_for_every_change(
    declared: str, allowed: list[str], rules: list[DowngradeRule], prompt: int, max_tokens: int | None, ip: str | None
) -> None:
    effective, reason = classify(
        declared=declared,
        rules=rules,
        classes=CLASSES,
        networks=NETWORKS,
        allowed=allowed,
        facts=facts(declared, prompt=prompt, max_tokens=max_tokens, ip=ip),
    )
    assert LEVELS[effective] >= LEVELS[declared]
    assert (reason is None) == (effective == declared)
    if reason not in (None, "undeclared"):
        assert any(r.name == reason and r.enabled and r.target_class == effective for r in rules)
