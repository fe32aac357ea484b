"""The downgrade-rule language: the ``if:`` conditions of ``downgrade_check``.

A condition is parsed once into a small immutable tree (never ``eval``); ``classify`` turns a
declared class into the effective one (the tenant's allowed classes, then every enabled rule; the
lowest resulting class wins, a rule never raises a class). The grammar: docs/engine.md, "Downgrade
rules".
"""

from __future__ import annotations

import ipaddress
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from scheduling.engine.model import ClassSpec, DowngradeRule

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

TEXT_FIELDS = ("class", "tenant")
NUMBER_FIELDS = ("prompt_tokens", "max_tokens")
ADDRESS_FIELDS = ("src_cidr", "src_ip")  # src_ip is an alias of src_cidr
KEYWORDS = ("and", "or", "not", "in")
MAX_CONDITION_CHARS = 2000
MAX_NESTING = 32
UNDECLARED_RULE = "undeclared"


class RuleSyntaxError(ValueError):
    """A condition that does not parse; ``position`` is the 0-based offset in the text."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(f"column {position + 1}: {message}")
        self.position = position


@dataclass(frozen=True)
class Compare:
    field: str  # one of TEXT_FIELDS or NUMBER_FIELDS
    op: str
    value: str | int


@dataclass(frozen=True)
class InNetwork:
    network: str


@dataclass(frozen=True)
class Not:
    operand: Expr


@dataclass(frozen=True)
class And:
    items: tuple[Expr, ...]  # two or more, none of them an And


@dataclass(frozen=True)
class Or:
    items: tuple[Expr, ...]  # two or more, none of them an Or


Expr = Compare | InNetwork | Not | And | Or


@dataclass(frozen=True)
class Facts:
    declared_class: str
    prompt_tokens: int
    max_tokens: int | None
    tenant: str
    src_ip: str | None


# --- tokenizer -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Token:
    kind: str  # "name", "number", "string", "op", "(", ")", "end"
    text: str
    pos: int


_TOKEN_RE = re.compile(
    r"(?P<space>\s+)|(?P<number>[0-9]+)|(?P<name>[A-Za-z_][A-Za-z0-9_-]*)"
    r"|(?P<string>'[^']*'|\"[^\"]*\")|(?P<op>==|!=|<=|>=|<|>)|(?P<paren>[()])"
)


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN_RE.match(text, pos)
        if match is None:
            raise RuleSyntaxError(_bad_char_message(text, pos), pos)
        kind = match.lastgroup or ""
        if kind == "paren":
            kind = match.group()
        if kind != "space":
            tokens.append(_Token(kind, match.group(), pos))
        pos = match.end()
    tokens.append(_Token("end", "", len(text)))
    return tokens


def _bad_char_message(text: str, pos: int) -> str:
    char = text[pos]
    if char in "'\"":
        return f"unterminated string starting with {char}"
    if char == "=":
        return "unexpected '=' (compare with '==')"
    if char in "&|!":
        return f"unexpected {char!r} (use 'and', 'or', 'not')"
    return f"unexpected character {char!r}"


# --- parser ----------------------------------------------------------------------------


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokenize(text)
        self.index = 0
        self.depth = 0

    @property
    def token(self) -> _Token:
        return self.tokens[self.index]

    def advance(self) -> _Token:
        token = self.token
        self.index += 1
        return token

    def at_keyword(self, word: str) -> bool:
        return self.token.kind == "name" and self.token.text == word

    def fail(self, expected: str) -> RuleSyntaxError:
        found = "end of condition" if self.token.kind == "end" else repr(self.token.text)
        return RuleSyntaxError(f"expected {expected}, found {found}", self.token.pos)

    def parse(self) -> Expr:
        expr = self.or_expr()
        if self.token.kind != "end":
            raise self.fail("'and', 'or' or end of condition")
        return expr

    def or_expr(self) -> Expr:
        items = [self.and_expr()]
        while self.at_keyword("or"):
            self.advance()
            items.append(self.and_expr())
        return _join(Or, items)

    def and_expr(self) -> Expr:
        items = [self.not_expr()]
        while self.at_keyword("and"):
            self.advance()
            items.append(self.not_expr())
        return _join(And, items)

    def not_expr(self) -> Expr:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise RuleSyntaxError(f"nested deeper than {MAX_NESTING} levels", self.token.pos)
        try:
            return self.operand()
        finally:
            self.depth -= 1

    def operand(self) -> Expr:
        if self.at_keyword("not"):
            self.advance()
            return Not(self.not_expr())
        if self.token.kind == "(":
            self.advance()
            expr = self.or_expr()
            if self.token.kind != ")":
                raise self.fail("')'")
            self.advance()
            return expr
        return self.condition()

    def condition(self) -> Expr:
        field = self.token.text if self.token.kind == "name" else ""
        if field in ADDRESS_FIELDS:
            self.advance()
            return self.membership()
        if field not in TEXT_FIELDS + NUMBER_FIELDS:
            raise self.fail("a condition (class, tenant, prompt_tokens, max_tokens, src_cidr)")
        self.advance()
        if self.token.kind != "op":
            raise self.fail(f"a comparison operator after {field!r}")
        op = self.advance().text
        if field in NUMBER_FIELDS:
            return Compare(field, op, self.integer(field))
        if op not in ("==", "!="):
            raise RuleSyntaxError(f"{field!r} can only be compared with == or !=", self.tokens[self.index - 1].pos)
        return Compare(field, op, self.text_value(field))

    def membership(self) -> Expr:
        negated = self.at_keyword("not")
        if negated:
            self.advance()
        if not self.at_keyword("in"):
            raise self.fail("'in' after src_cidr")
        self.advance()
        if self.token.kind != "name" or self.token.text in KEYWORDS:
            raise self.fail("a network name after 'in'")
        node: Expr = InNetwork(self.advance().text)
        return Not(node) if negated else node

    def integer(self, field: str) -> int:
        if self.token.kind != "number":
            raise self.fail(f"an integer to compare {field!r} with")
        return int(self.advance().text)

    def text_value(self, field: str) -> str:
        token = self.token
        if token.kind == "string":
            self.advance()
            return token.text[1:-1]
        if token.kind == "name" and token.text not in KEYWORDS:
            self.advance()
            return token.text
        raise self.fail(f"a name or quoted string to compare {field!r} with")


def _join(kind: type[And] | type[Or], items: list[Expr]) -> Expr:
    if len(items) == 1:
        return items[0]
    flat: list[Expr] = []
    for item in items:
        flat.extend(item.items if isinstance(item, kind) else (item,))
    return kind(tuple(flat))


def parse_condition(text: str) -> Expr:
    """Parse an ``if:`` condition; raises RuleSyntaxError naming the column and what was expected."""
    if not isinstance(text, str):
        raise RuleSyntaxError("the condition must be a string", 0)
    return _parse_cached(text)


@lru_cache(maxsize=1024)
def _parse_cached(text: str) -> Expr:
    if len(text) > MAX_CONDITION_CHARS:
        raise RuleSyntaxError(f"condition longer than {MAX_CONDITION_CHARS} characters", MAX_CONDITION_CHARS)
    if not text.strip():
        raise RuleSyntaxError("empty condition", 0)
    return _Parser(text).parse()


# --- inspection and rendering ----------------------------------------------------------


def _walk(expr: Expr) -> Iterable[Expr]:
    yield expr
    if isinstance(expr, Not):
        yield from _walk(expr.operand)
    elif isinstance(expr, (And, Or)):
        for item in expr.items:
            yield from _walk(item)


def condition_names(expr: Expr) -> tuple[set[str], set[str]]:
    """(class names, network names) that the condition refers to, for validation."""
    classes = {str(n.value) for n in _walk(expr) if isinstance(n, Compare) and n.field == "class"}
    networks = {n.network for n in _walk(expr) if isinstance(n, InNetwork)}
    return classes, networks


_BARE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def render(expr: Expr) -> str:
    """Canonical source text; ``parse_condition(render(e)) == e`` for every parsed tree."""
    if isinstance(expr, Compare):
        return f"{expr.field} {expr.op} {_render_value(expr.value)}"
    if isinstance(expr, InNetwork):
        return f"src_cidr in {expr.network}"
    if isinstance(expr, Not):
        inner = render(expr.operand)
        return f"not ({inner})" if isinstance(expr.operand, (And, Or)) else f"not {inner}"
    if isinstance(expr, And):
        return " and ".join(f"({render(i)})" if isinstance(i, Or) else render(i) for i in expr.items)
    return " or ".join(render(i) for i in expr.items)


def _render_value(value: str | int) -> str:
    if isinstance(value, int):
        return str(value)
    if _BARE_RE.fullmatch(value) and value not in KEYWORDS:
        return value
    return f"'{value}'" if "'" not in value else f'"{value}"'


# --- evaluation ------------------------------------------------------------------------


def parse_networks(networks: Mapping[str, Sequence[str | IpNetwork]]) -> dict[str, tuple[IpNetwork, ...]]:
    """CIDR strings to network objects (already-parsed networks pass through)."""
    return {
        name: tuple(n if not isinstance(n, str) else ipaddress.ip_network(n, strict=False) for n in cidrs)
        for name, cidrs in networks.items()
    }


def _address(src_ip: str | None) -> IpAddress | None:
    if not src_ip:
        return None
    try:
        address = ipaddress.ip_address(src_ip.strip())
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _eval(expr: Expr, facts: Facts, address: IpAddress | None, networks: Mapping[str, Sequence[IpNetwork]]) -> bool:
    if isinstance(expr, Compare):
        value = getattr(facts, "declared_class" if expr.field == "class" else expr.field)
        return value is not None and OPERATORS[expr.op](value, expr.value)
    if isinstance(expr, InNetwork):
        return address is not None and any(address in net for net in networks.get(expr.network, ()))
    if isinstance(expr, Not):
        return not _eval(expr.operand, facts, address, networks)
    if isinstance(expr, And):
        return all(_eval(item, facts, address, networks) for item in expr.items)
    return any(_eval(item, facts, address, networks) for item in expr.items)


def evaluate(expr: Expr, facts: Facts, networks: Mapping[str, Sequence[str | IpNetwork]]) -> bool:
    """True when the facts satisfy the condition. A missing max_tokens or source address,
    an unknown network or an address of the other IP family never match (and never raise)."""
    return _eval(expr, facts, _address(facts.src_ip), parse_networks(networks))


# --- classification --------------------------------------------------------------------


@dataclass(frozen=True)
class CompiledRule:
    name: str
    target: str
    target_level: int
    expr: Expr


class CompiledRules:
    """Rules parsed once, with their networks and class levels, for the gateway's hot path."""

    def __init__(
        self,
        rules: Sequence[DowngradeRule],
        networks: Mapping[str, Sequence[str | IpNetwork]],
        classes: Sequence[ClassSpec],
    ) -> None:
        self.levels = {c.name: c.level for c in classes}
        self.top_level = min(self.levels.values(), default=0)  # the most urgent class's level
        self.networks = parse_networks(networks)
        self.rules = tuple(self._compile(r) for r in sorted(rules, key=lambda r: r.order) if r.enabled)

    def _compile(self, rule: DowngradeRule) -> CompiledRule:
        target = rule.target_class
        if target not in self.levels:
            raise ValueError(f"rule {rule.name!r}: unknown target class {target!r}")
        return CompiledRule(rule.name, target, self.levels[target], parse_condition(rule.condition))

    def classify(self, *, declared: str, facts: Facts, allowed: Sequence[str] = ()) -> tuple[str, str | None]:
        """(effective class, name of the rule that lowered it or None)."""
        if declared not in self.levels:
            raise ValueError(f"unknown class {declared!r}")
        current, reason = self._undeclared(declared, allowed)
        facts = replace(facts, declared_class=current)
        address = _address(facts.src_ip)
        level = self.levels[current]
        for rule in self.rules:
            if rule.target_level > level and _eval(rule.expr, facts, address, self.networks):
                current, reason, level = rule.target, rule.name, rule.target_level
        return current, reason

    def _undeclared(self, declared: str, allowed: Sequence[str]) -> tuple[str, str | None]:
        if not allowed or declared in allowed:
            return declared, None
        floor = self.levels[declared]
        candidates = [(self.levels[c], c) for c in allowed if self.levels.get(c, -1) >= floor]
        if not candidates:  # only better classes are allowed: keep the (cheaper) declared one
            return declared, None
        return min(candidates)[1], UNDECLARED_RULE


def compile_rules(
    rules: Sequence[DowngradeRule], networks: Mapping[str, Sequence[str | IpNetwork]], classes: Sequence[ClassSpec]
) -> CompiledRules:
    return CompiledRules(rules, networks, classes)


def classify(
    *,
    declared: str,
    facts: Facts,
    rules: Sequence[DowngradeRule],
    classes: Sequence[ClassSpec],
    networks: Mapping[str, Sequence[str | IpNetwork]],
    allowed: Sequence[str] = (),
) -> tuple[str, str | None]:
    """Effective class for a request: see docs/engine.md, "Downgrade rules". Parses are cached, but the
    gateway should hold a ``compile_rules(...)`` result instead of calling this per request."""
    return CompiledRules(rules, networks, classes).classify(declared=declared, facts=facts, allowed=allowed)
