"""``gateway.db.db_call`` against a PostgreSQL that goes away and comes back, in process, through a
`PgProxy` (the shared server is never stopped): a connection that broke while idle is replaced on
the first call after, without an error; during an outage every call raises one of
``DATABASE_UNAVAILABLE``; the first call after the outage is served."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from asgiref.sync import async_to_sync
from django.db import connection

from gateway.db import DATABASE_UNAVAILABLE, db_call
from tests.support.pgproxy import PgProxy

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def proxy() -> Iterator[PgProxy]:
    """The test database's connection goes through a PgProxy (db_call runs on this thread here:
    thread-sensitive code inside async_to_sync runs in the calling thread)."""
    params = connection.settings_dict
    direct = params["HOST"], params["PORT"]
    running = PgProxy(direct[0] or "127.0.0.1", int(direct[1] or 5432)).start()
    connection.close()
    params["HOST"], params["PORT"] = "127.0.0.1", running.port
    try:
        yield running
    finally:
        running.restore()
        connection.close()
        params["HOST"], params["PORT"] = direct
        running.stop()


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def call(fn):
    return async_to_sync(db_call(fn))()


def test_a_connection_that_broke_while_idle_is_replaced_on_the_first_call(proxy):
    before = call(_backend_pid)
    proxy.cut()
    proxy.restore()  # the server is reachable again; the idle connection is gone for good
    assert call(_backend_pid) != before


def test_an_outage_raises_database_unavailable_and_the_first_call_after_it_is_served(proxy):
    call(_backend_pid)
    with proxy.outage():
        for _ in range(2):  # the broken connection, then a new one that cannot be made
            with pytest.raises(DATABASE_UNAVAILABLE):
                call(_backend_pid)
    assert call(_backend_pid) > 0
