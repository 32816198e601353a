"""URL credentials are parsed and masked as a unit, whatever characters the password holds.

Passwords tried: ``@ / : p %`` alone and together. The masked URL must keep the scheme, the user
and everything after the host, and hold no fragment of the password; a one-letter password must
not garble the rest of a message; a URL no parser would read as meant is refused naming the
variable; and a real Redis with such a password is reached with its percent-encoded URL.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from urllib.parse import quote

import pytest
import redis

from tests.support.cli import copy_demo, run_soulfleet
from workers.cli.errors import translate
from workers.fleet.errors import RedisUnavailable
from workers.local.redis_server import RedisServer, free_port
from workers.persona.models.http import redact_url as redact_model_url
from workers.persona.urls import credential_forms, scrub
from workers.settings import Settings, SettingsError, redact_url

PASSWORDS = ["p@ss/w:rd", "p", "@", "/", ":", "%", "p%40ss", "pa:ss@w0rd/x%y", "@@/::%%pp"]
HOST = "127.0.0.1:6390/0"


def _fragments(password: str) -> list[str]:
    """Pieces of the password that must not appear in a message (every 4 characters)."""
    if len(password) < 4:
        return []
    return [password[i : i + 4] for i in range(len(password) - 3)]


@pytest.mark.parametrize("password", PASSWORDS)
def test_redact_url_masks_the_whole_password(password: str) -> None:
    """`redis://[user]:<pw>@host/db` -> `redis://[user]:***@host/db`, exactly, for every pw."""
    assert redact_url(f"redis://:{password}@{HOST}") == f"redis://:***@{HOST}"
    assert redact_url(f"redis://ops:{password}@{HOST}") == f"redis://ops:***@{HOST}"
    if ":" not in password:  # a Redis URL may carry the password alone
        assert redact_url(f"rediss://{password}@{HOST}") == f"rediss://***@{HOST}"
    model_url = redact_model_url(f"https://ops:{password}@api.example.com/v1?key=k")
    assert model_url == "https://api.example.com/v1"


def test_urls_without_credentials_and_secret_query_parameters() -> None:
    """No credentials: the URL is unchanged; a password in the query is masked too."""
    assert redact_url(f"redis://{HOST}") == f"redis://{HOST}"
    assert redact_url("unix:///run/redis.sock?db=2") == "unix:///run/redis.sock?db=2"
    masked = redact_url("redis://127.0.0.1:1/0?password=hunter22&db=1")
    assert masked == "redis://127.0.0.1:1/0?password=***&db=1"


def test_a_one_letter_password_does_not_garble_the_message() -> None:
    """The URL is masked as a unit; the letters of the message stay as they were."""
    url = f"redis://:p@{HOST}"
    message = f"Error connecting to {url}: please check the port"
    assert scrub(message, url) == f"Error connecting to redis://:***@{HOST}: please check the port"


@pytest.mark.parametrize("password", ["p@ss/w:rd", "pa:ss@w0rd/x%y", "a#b", "q?r"])
def test_a_raw_slash_question_mark_or_hash_is_refused_naming_the_variable(password: str) -> None:
    """Such a URL would connect somewhere else (the host parsed out of the password): refused
    with REDIS_URL (or CELERY_BROKER_URL) named and no piece of the password shown."""
    for variable in ("REDIS_URL", "CELERY_BROKER_URL"):
        env = {variable: f"redis://:{password}@{HOST}"}
        with pytest.raises(SettingsError) as caught:
            Settings.from_env(env)
        message = str(caught.value)
        assert message.startswith(variable)
        assert "percent-encode" in message
        for fragment in _fragments(password):
            assert fragment not in message, (fragment, message)


def test_credential_forms_come_from_the_one_parser() -> None:
    """A URL's password as written, decoded and as a Basic credential, split where this
    module splits (the last '@'): urlsplit would have found the password 'p' here and leaked
    the rest. A URL without a password has no forms."""
    raw = "redis://u:p@ss/w%3Ard@127.0.0.1:6390/0"
    basic = base64.b64encode(b"u:p@ss/w:rd").decode()
    assert credential_forms(raw) == ("p@ss/w%3Ard", "p@ss/w:rd", basic)
    assert credential_forms("redis://127.0.0.1:6379/0") == ()


def test_translate_scrubs_decoded_and_raw_passwords() -> None:
    """A library that quotes the decoded password in its error: the CLI line masks it."""
    password = "p@ss/w:rd%p"
    url = f"redis://:{quote(password, safe='')}@{HOST}"
    error = translate(RedisUnavailable(url, f"auth with {password} failed"), redis_url=url)
    assert error is not None
    for fragment in _fragments(password) + _fragments(quote(password, safe="")):
        assert fragment not in error.message, (fragment, error.message)
    assert "redis://:***@127.0.0.1:6390/0" in error.message


@pytest.mark.integration
def test_a_real_redis_with_such_a_password(tmp_path: Path) -> None:
    """requirepass `p@ss/w:rd%p`: the percent-encoded URL works (`status` exits 0); a wrong
    password exits 1 and a raw one exits 2, neither showing any piece of either password."""
    password = "p@ss/w:rd%p"
    fleet_root = copy_demo(tmp_path / "personas")
    with RedisServer(tmp_path / "redis", port=free_port()) as server:
        client = redis.Redis.from_url(server.url)
        client.config_set("requirepass", password)
        client.close()
        port = server.port
        good = f"redis://:{quote(password, safe='')}@127.0.0.1:{port}/0"
        env: dict[str, str | None] = {
            "SOULFLEET_PERSONAS": str(fleet_root), "XDG_DATA_HOME": str(tmp_path / "xdg"),
            "SOULFLEET_KEY_PREFIX": "secrets-test:",
        }  # fmt: skip
        ok = run_soulfleet("status", "--json", env={**env, "REDIS_URL": good}, timeout=60)
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout)["counts"]["dead"] == 0
        wrong_password = "p@ss/w:rd%x"
        wrong = f"redis://:{quote(wrong_password, safe='')}@127.0.0.1:{port}/0"
        raw = f"redis://:{password}@127.0.0.1:{port}/0"
        for url, code in ((wrong, 1), (raw, 2)):
            result = run_soulfleet("status", env={**env, "REDIS_URL": url}, timeout=60)
            assert result.returncode == code, (url, result.stderr)
            shown = result.stdout + result.stderr
            assert "***" in shown
            for secret in (password, wrong_password):
                for form in (secret, quote(secret, safe="")):
                    for fragment in _fragments(form):
                        assert fragment not in shown, (fragment, shown)
