"""The service-bound layers really are the services in CI (these fail there rather than skip)."""

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import connection


@pytest.mark.postgres
@pytest.mark.django_db
def test_database_is_postgresql_when_configured():
    assert connection.vendor == "postgresql"
    with connection.cursor() as cur:
        cur.execute("select 1")
        assert cur.fetchone() == (1,)


@pytest.mark.redis
def test_channel_layer_round_trip_through_redis():
    layer = get_channel_layer()
    assert type(layer).__module__.startswith("channels_redis")
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.send)(channel, {"type": "probe", "n": 1})
    assert async_to_sync(layer.receive)(channel) == {"type": "probe", "n": 1}
