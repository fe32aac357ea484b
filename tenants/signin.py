"""Company sign-in: which tenant and role a user's identity-provider claims map to, the rules'
YAML round trip, and the user a sign-in creates or updates (docs/sign-in.md)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import yaml
from django.db import transaction

from tenants.models import SignInRule, Tenant, User

ROLES = tuple(User.Role.values)
USERNAME_PREFIX = "sso-"


class SignInRuleError(ValueError):
    """A rules file or form that cannot be applied; the message names what is wrong."""


@dataclass(frozen=True)
class Mapped:
    tenant: Tenant | None
    role: str
    rule: str  # the claim value that matched


def claim_values(claims: dict, claim: str) -> list[str]:
    """The values of ``claim`` in ``claims``: a list of strings, or one string."""
    found = claims.get(claim)
    if isinstance(found, str):
        return [found]
    if isinstance(found, list | tuple):
        return [value for value in found if isinstance(value, str)]
    return []


def mapped(claims: dict, claim: str) -> Mapped | None:
    """The first rule (by position) whose value ``claims[claim]`` holds; None if none does."""
    values = set(claim_values(claims, claim))
    for rule in SignInRule.objects.select_related("tenant"):
        if rule.claim_value in values and (rule.tenant is None or rule.tenant.active):
            return Mapped(rule.tenant, rule.role, rule.claim_value)
    return None


def username_for(subject: str) -> str:
    """The local username of a provider's subject: its own namespace, so a provider account never
    takes over a local login of the same name."""
    name = USERNAME_PREFIX + subject
    if len(name) <= 150:
        return name
    return USERNAME_PREFIX + hashlib.sha256(subject.encode()).hexdigest()


def signed_in(subject: str, claims: dict, found: Mapped) -> User:
    """The user of ``subject``, created or updated from ``claims`` and its mapping (applied at every
    sign-in, so a changed rule takes effect at the next one)."""
    user, _ = User.objects.get_or_create(username=username_for(subject), defaults={"is_active": True})
    user.email = str(claims.get("email") or "")[:254]
    user.first_name = str(claims.get("name") or claims.get("preferred_username") or "")[:150]
    user.tenant = found.tenant
    user.role = found.role
    user.set_unusable_password()
    user.save()
    return user


def rules_as_dict() -> dict:
    return {
        "signin": {
            "rules": [
                {"value": r.claim_value, "tenant": r.tenant.slug if r.tenant else None, "role": r.role}
                for r in SignInRule.objects.select_related("tenant")
            ]
        }
    }


def rules_dump() -> str:
    return yaml.safe_dump(rules_as_dict(), sort_keys=False, allow_unicode=True)


def _parsed(raw: object) -> list[tuple[str, str | None, str]]:
    if not isinstance(raw, dict) or not isinstance(raw.get("signin"), dict):
        raise SignInRuleError("the file must have a top-level `signin:` mapping")
    rules = raw["signin"].get("rules", [])
    if not isinstance(rules, list):
        raise SignInRuleError("`signin.rules` must be a list")
    parsed: list[tuple[str, str | None, str]] = []
    for number, rule in enumerate(rules, start=1):
        if not isinstance(rule, dict) or set(rule) - {"value", "tenant", "role"}:
            raise SignInRuleError(f"rule {number}: give `value`, `tenant` and `role` only")
        value, tenant, role = rule.get("value"), rule.get("tenant"), rule.get("role", User.Role.MEMBER)
        parsed.append(rule_checked(value, tenant, role, where=f"rule {number}"))
    values = [value for value, _, _ in parsed]
    if len(values) != len(set(values)):
        raise SignInRuleError("each claim value may appear in one rule only")
    return parsed


def rule_checked(value: object, tenant: object, role: object, *, where: str) -> tuple[str, str | None, str]:
    """One rule's fields, checked: a non-empty value, a known role, and a tenant for members."""
    if not isinstance(value, str) or not value.strip() or len(value) > 200:
        raise SignInRuleError(f"{where}: `value` must be a claim value of 1-200 characters")
    if role not in ROLES:
        raise SignInRuleError(f"{where}: `role` must be one of {', '.join(ROLES)}")
    if tenant in ("", None):
        if role == User.Role.MEMBER:
            raise SignInRuleError(f"{where}: a member rule names its tenant")
        return value.strip(), None, str(role)
    if not isinstance(tenant, str) or not Tenant.objects.filter(slug=tenant).exists():
        raise SignInRuleError(f"{where}: no tenant {tenant!r}")
    return value.strip(), tenant, str(role)


@transaction.atomic
def rules_replace(parsed: list[tuple[str, str | None, str]]) -> int:
    """Replaces every rule by ``parsed``, in its order; returns how many there are."""
    tenants = {t.slug: t for t in Tenant.objects.all()}
    SignInRule.objects.all().delete()
    SignInRule.objects.bulk_create(
        SignInRule(position=index, claim_value=value, tenant=tenants[slug] if slug else None, role=role)
        for index, (value, slug, role) in enumerate(parsed)
    )
    return len(parsed)


def rules_load(path: str | Path) -> int:
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise SignInRuleError(f"{path}: {exc}") from None
    return rules_replace(_parsed(raw))
