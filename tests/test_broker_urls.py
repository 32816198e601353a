"""One Redis URL in kombu's spelling and in redis-py's."""

from __future__ import annotations

import pytest

from workers.broker_urls import kombu_url, redis_py_url
from workers.settings import Settings


def test_a_unix_socket_url_becomes_kombus_socket_url_with_the_database_as_virtual_host() -> None:
    """kombu has no ``unix://`` transport and reads the database from ``virtual_host``."""
    assert (
        kombu_url("unix:///run/redis.sock?db=2") == "redis+socket:///run/redis.sock?virtual_host=2"
    )
    assert kombu_url("unix:///run/redis.sock") == "redis+socket:///run/redis.sock"


def test_credentials_and_other_parameters_are_kept_both_ways() -> None:
    """A password (even one holding ``@`` encoded) and unrelated query keys survive."""
    url = "unix://user:p%40ss@/run/redis.sock?db=3&socket_timeout=5"
    kombu = kombu_url(url)
    assert kombu == "redis+socket://user:p%40ss@/run/redis.sock?virtual_host=3&socket_timeout=5"
    assert redis_py_url(kombu) == url


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:6379/0", "rediss://:pw@cache:6380/1", "amqp://guest@mq//"],
)
def test_tcp_and_other_urls_pass_through_unchanged(url: str) -> None:
    """Only the socket spellings differ between the two libraries."""
    assert kombu_url(url) == url
    assert redis_py_url(url) == url


def test_settings_give_the_broker_the_kombu_spelling_of_a_unix_redis_url() -> None:
    """REDIS_URL stays as written (redis-py reads it); the broker URL derived from it, or a
    ``unix://`` CELERY_BROKER_URL, is kombu's."""
    settings = Settings.from_env({"REDIS_URL": "unix:///run/redis.sock?db=1"})
    assert settings.redis_url == "unix:///run/redis.sock?db=1"
    assert settings.broker_url == "redis+socket:///run/redis.sock?virtual_host=1"
    explicit = Settings.from_env({"CELERY_BROKER_URL": "unix:///run/broker.sock"})
    assert explicit.broker_url == "redis+socket:///run/broker.sock"
