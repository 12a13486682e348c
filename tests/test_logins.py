"""The throttle of the account forms on its own, on both storages (Redis, and this process's
memory when there is no Redis): what is counted together, what a success clears, what a bad
setting does. The attacks over real HTTP are in tests/test_security_logins.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

from chat.limits.logins import LoginAttempt, LoginThrottle, address_key, username_key
from chat.limits.refusals import Rejection
from tests.conftest import REDIS_URL
from tests.servers import ROOT, base_env


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def throttle(request: Any, settings: Any, redis_prefix: str) -> AsyncIterator[LoginThrottle]:
    settings.CHAT_LOGIN_RATE_PER_ADDRESS = "5/hour"
    settings.CHAT_LOGIN_RATE_PER_USERNAME = "2/2 seconds;3/hour"
    settings.CHAT_SIGNUP_RATE_PER_ADDRESS = "2/hour"
    made = LoginThrottle(REDIS_URL if request.param == "redis" else "", prefix=redis_prefix)
    yield made
    await made.aclose()


def test_addresses_and_usernames_are_counted_as_one_person_would_be() -> None:
    # One IPv6 subscriber holds a whole /64; an IPv4 address written as IPv6 is itself.
    assert address_key("2001:db8:1:2:aaaa::1") == address_key("2001:db8:1:2:ffff::9")
    assert address_key("2001:db8:1:3::1") != address_key("2001:db8:1:2::1")
    assert address_key("::ffff:192.0.2.7") == address_key("192.0.2.7") == "192.0.2.7"
    assert address_key("not an address") == "not an address"
    # Case and compatibility forms of a name are one name.
    assert username_key("Alice") == username_key("alice") == username_key(" ALICE ")
    fullwidth = "".join(chr(ord(c) + 0xFEE0) for c in "alice")  # fullwidth letters: NFKC folds them
    assert username_key(fullwidth) == username_key("alice")
    assert username_key("alice") != username_key("alice2")


async def test_a_username_is_paused_across_addresses_and_a_success_resumes_it(
    throttle: LoginThrottle,
) -> None:
    first = await throttle.login("192.0.2.1", "alice")
    second = await throttle.login("192.0.2.2", "Alice")
    assert isinstance(first, LoginAttempt) and isinstance(second, LoginAttempt)
    third = await throttle.login("192.0.2.3", "alice")
    assert isinstance(third, Rejection) and third.code == "rate_limited"
    assert third.retry_after is not None and 1 <= third.retry_after <= 2
    assert "for this username" in third.message
    # Another username from the same addresses is not affected.
    assert isinstance(await throttle.login("192.0.2.1", "bob"), LoginAttempt)
    # A success clears the username's count (never the address's).
    await throttle.succeeded(second)
    assert isinstance(await throttle.login("192.0.2.4", "alice"), LoginAttempt)


async def test_the_wait_grows_with_the_longer_windows(throttle: LoginThrottle) -> None:
    # 2/2 seconds;3/hour: the third attempt waits for the short window, the fourth for the hour.
    for n in range(2):
        assert isinstance(await throttle.login(f"192.0.2.{n}", "carol"), LoginAttempt)
    short = await throttle.login("192.0.2.9", "carol")
    assert isinstance(short, Rejection) and short.retry_after is not None
    assert short.retry_after <= 2
    await asyncio.sleep(short.retry_after + 0.2)  # exactly the wait it gave
    assert isinstance(await throttle.login("192.0.2.10", "carol"), LoginAttempt)
    grown = await throttle.login("192.0.2.11", "carol")
    assert isinstance(grown, Rejection) and grown.retry_after is not None
    assert grown.retry_after > 60


async def test_an_address_is_limited_whatever_usernames_it_tries(throttle: LoginThrottle) -> None:
    for n in range(5):
        assert isinstance(await throttle.login("198.51.100.7", f"user{n}"), LoginAttempt)
    refused = await throttle.login("198.51.100.7", "user9")
    assert isinstance(refused, Rejection) and "from your network address" in refused.message
    assert refused.retry_after is not None and refused.retry_after > 60
    # A trusted device is still behind its address's limit.
    assert isinstance(await throttle.login("198.51.100.7", "user9", device="abc"), Rejection)


async def test_a_trusted_device_is_counted_apart_from_its_username(
    throttle: LoginThrottle,
) -> None:
    for n in range(2):
        await throttle.login(f"203.0.113.{n}", "dave")
    assert isinstance(await throttle.login("203.0.113.9", "dave"), Rejection)
    mine = await throttle.login("203.0.113.50", "dave", device="d1")
    assert isinstance(mine, LoginAttempt)


async def test_signups_are_counted_per_address(throttle: LoginThrottle) -> None:
    assert await throttle.signup("192.0.2.10") is None
    assert await throttle.signup("192.0.2.10") is None
    refused = await throttle.signup("192.0.2.10")
    assert isinstance(refused, Rejection) and "accounts were created" in refused.message
    assert await throttle.signup("192.0.2.11") is None


@pytest.mark.parametrize(
    "name",
    ["CHAT_LOGIN_RATE_PER_ADDRESS", "CHAT_LOGIN_RATE_PER_USERNAME", "CHAT_SIGNUP_RATE_PER_ADDRESS"],
)
def test_a_bad_rate_stops_the_process_at_start_up(name: str) -> None:
    def load(value: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", "import chatsite.settings"],
            cwd=ROOT,
            env=base_env(**{name: value}),
            capture_output=True,
            text=True,
        )

    assert load("3/hour").returncode == 0  # the control
    for bad in ("lots", "", "5 per fortnight"):
        result = load(bad)
        assert result.returncode != 0
        assert "ImproperlyConfigured" in result.stderr and name in result.stderr


def test_make_run_has_loose_per_address_defaults_and_production_does_not() -> None:
    # `make run` (DJANGO_DEBUG=1) serves one developer on loopback, whose scripts sign up test
    # users from one address; production keeps "a few signups an hour" per address.
    def defaults(debug: str) -> list[str]:
        env = base_env(DJANGO_DEBUG=debug)
        for name in ("CHAT_LOGIN_RATE_PER_ADDRESS", "CHAT_SIGNUP_RATE_PER_ADDRESS"):
            env.pop(name, None)  # base_env lifts them for the test servers
        code = (
            "from chatsite import settings as s;"
            "print(s.CHAT_LOGIN_RATE_PER_ADDRESS); print(s.CHAT_SIGNUP_RATE_PER_ADDRESS)"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.split()

    assert defaults("0") == ["20/minute;100/hour;300/day", "5/hour;20/day"]
    assert defaults("1") == ["200/minute", "200/hour"]
