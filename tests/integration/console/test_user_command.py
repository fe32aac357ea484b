"""`manage.py user create`: users for scripting; bad input exits 2 with one clear line."""

from __future__ import annotations

import io
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tenants.models import User


def run(*args: str, stdin: str = "") -> str:
    out = io.StringIO()
    old, sys.stdin = sys.stdin, io.StringIO(stdin)
    try:
        call_command("user", *args, stdout=out)
    finally:
        sys.stdin = old
    return out.getvalue()


def test_create_member_with_password_from_stdin(world):
    assert "created member carol of tenant support" in run(
        "create", "carol", "--role", "member", "--tenant", "support", "--password-stdin", stdin="s3cret-pass\n"
    )
    user = User.objects.get(username="carol")
    assert user.role == "member" and user.tenant.slug == "support" and user.check_password("s3cret-pass")


def test_create_finance_without_tenant_has_no_usable_password(world):
    run("create", "fran", "--role", "finance")
    assert not User.objects.get(username="fran").has_usable_password()


@pytest.mark.parametrize(
    "args, message",
    [
        (("create", "m1", "--role", "member"), "a member belongs to a tenant"),
        (("create", "m2", "--role", "member", "--tenant", "nope"), "no tenant 'nope'"),
        (("create", "fay", "--role", "admin"), "already exists"),
    ],
)
def test_bad_input_exits_2_with_a_clear_line(world, finance, args, message):
    with pytest.raises(CommandError) as err:
        run(*args)
    assert err.value.returncode == 2 and message in str(err.value)


def test_empty_password_on_stdin_is_refused(world):
    with pytest.raises(CommandError) as err:
        run("create", "p1", "--role", "admin", "--password-stdin", stdin="\n")
    assert err.value.returncode == 2 and "no password" in str(err.value)


def test_unknown_role_exits_2(world):
    import subprocess

    done = subprocess.run(
        [sys.executable, "manage.py", "user", "create", "x", "--role", "boss"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "invalid choice: 'boss'" in done.stderr
