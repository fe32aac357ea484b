from decimal import Decimal

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.env import env_bool, env_choice, env_decimal, env_int, env_list


def test_bool_accepts_common_spellings(monkeypatch):
    monkeypatch.setenv("X_FLAG", "Yes")
    assert env_bool("X_FLAG") is True
    monkeypatch.setenv("X_FLAG", "off")
    assert env_bool("X_FLAG", True) is False


@pytest.mark.parametrize(
    "helper, raw",
    [
        (env_bool, "maybe"),
        (lambda n: env_int(n, 1), "ten"),
        (lambda n: env_decimal(n, "0"), "1,5"),
        (lambda n: env_choice(n, "a", ("a", "b")), "c"),
        (lambda n: env_int(n, 1, minimum=1), "0"),
    ],
)
def test_bad_values_fail_loudly_naming_the_variable(monkeypatch, helper, raw):
    monkeypatch.setenv("X_VALUE", raw)
    with pytest.raises(ImproperlyConfigured, match="X_VALUE"):
        helper("X_VALUE")


def test_defaults_and_lists(monkeypatch):
    monkeypatch.delenv("X_MISSING", raising=False)
    assert env_int("X_MISSING", 7) == 7
    assert env_decimal("X_MISSING", "0.25") == Decimal("0.25")
    monkeypatch.setenv("X_LIST", "a, b,,c")
    assert env_list("X_LIST", []) == ["a", "b", "c"]
