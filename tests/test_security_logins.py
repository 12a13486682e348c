"""Password guessing and account farming, the way the hostile review did them (issue 13.5,
13.14): real HTTP to real daphne instances on PostgreSQL and Redis, from many client
addresses (127.0.0.0/8 is all loopback: each client binds its own), with every header a
client could use to pretend to be someone else.

Two instances share one PostgreSQL database and one Redis, so a count split between them is
still one count. The windows are short where a test must see one free up (it waits exactly
until the Retry-After it was given), and an hour where it must see the wait grow.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

from tests.servers import ROOT, base_env, running_chatsite
from tests.test_daphne import fresh_postgres_database, query_one, redis_prefix

pytestmark = pytest.mark.redis

PASSWORD = "a-long-test-passphrase-42"
REDIS_URL = "redis://127.0.0.1:6379/0"
# Headers a client may send to look like another address: none of them may count.
SPOOFS = ("X-Forwarded-For", "X-Real-IP", "True-Client-IP", "CF-Connecting-IP", "Client-IP")
ADDRESS_RATE = "6/hour"
USERNAME_RATE = "3/10 seconds;5/hour"
SIGNUP_RATE = "3/hour"
_addresses = iter(range(2, 250))


@dataclass(frozen=True)
class Site:
    web1: str
    web2: str
    database_url: str


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    with fresh_postgres_database() as database_url, redis_prefix() as prefix:
        code = (
            "from django.contrib.auth.models import User\n"
            f"User.objects.create_user('staffer', password={PASSWORD!r}, is_staff=True)\n"
            f"for name in ('victim', 'bystander', 'parallel'):\n"
            f"    User.objects.create_user(name, password={PASSWORD!r})\n"
        )
        subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", code],
            cwd=ROOT,
            env=base_env(DATABASE_URL=database_url),
            check=True,
            capture_output=True,
        )
        env = {
            "REDIS_URL": REDIS_URL,
            "CHAT_REDIS_PREFIX": prefix,
            "CHAT_LOGIN_RATE_PER_ADDRESS": ADDRESS_RATE,
            "CHAT_LOGIN_RATE_PER_USERNAME": USERNAME_RATE,
            "CHAT_SIGNUP_RATE_PER_ADDRESS": SIGNUP_RATE,
        }
        with (
            running_chatsite(database_url=database_url, **env) as web1,
            running_chatsite(database_url=database_url, **env) as web2,
        ):
            yield Site(web1, web2, database_url)


def new_address() -> str:
    """A loopback address no other test of this module uses."""
    return f"127.0.0.{next(_addresses)}"


def spoofed(n: int) -> dict[str, str]:
    """Every header that claims another client address, each time a different one."""
    return {name: f"203.0.113.{n % 250 + 1}" for name in SPOOFS} | {
        "Forwarded": f"for=198.51.100.{n % 250 + 1}"
    }


def browser_at(base: str, address: str) -> httpx.Client:
    """A client whose connections come from `address`."""
    return httpx.Client(
        base_url=base,
        transport=httpx.HTTPTransport(local_address=address),
        timeout=60,
        trust_env=False,
    )


def post_form(
    client: httpx.Client, path: str, data: dict[str, str], headers: dict[str, str] | None = None
) -> httpx.Response:
    """GET the form (for its CSRF cookie), then POST it as the page would."""
    if "csrftoken" not in client.cookies:
        client.get(path).raise_for_status()
    token = client.cookies["csrftoken"]
    return client.post(path, data={**data, "csrfmiddlewaretoken": token}, headers=headers or {})


def log_in(
    base: str,
    address: str,
    username: str,
    password: str,
    *,
    path: str = "/accounts/login/",
    n: int = 0,
    client: httpx.Client | None = None,
) -> httpx.Response:
    own = client is None
    client = client or browser_at(base, address)
    try:
        return post_form(
            client, path, {"username": username, "password": password}, headers=spoofed(n)
        )
    finally:
        if own:
            client.close()


def assert_throttled(response: httpx.Response, words: str) -> int:
    """A 429 with Retry-After, the reason on the page; returns the wait in seconds."""
    assert response.status_code == 429, response.text[:300]
    wait = int(response.headers["Retry-After"])
    assert wait >= 1
    assert words in response.text
    assert "sessionid" not in response.cookies
    return wait


def test_the_admin_login_is_limited_per_address_whatever_the_headers_say(site: Site) -> None:
    attacker = new_address()
    with browser_at(site.web1, attacker) as client:
        # Six wrong passwords, each for another username (so only the address limit can
        # apply), each claiming another address in every forwarding header.
        for n in range(6):
            response = log_in(
                site.web1, attacker, f"admin{n}", "guess", path="/admin/login/", n=n, client=client
            )
            assert response.status_code == 200
            assert "Please enter the correct username and password" in response.text
        refused = log_in(
            site.web1, attacker, "admin9", "guess", path="/admin/login/", n=9, client=client
        )
    wait = assert_throttled(refused, "Too many login attempts from your network address")
    assert wait > 60  # the window is an hour
    # Through the other instance too, and with the right password: the password is not even
    # checked from that address.
    right = log_in(site.web2, attacker, "staffer", PASSWORD, path="/admin/login/", n=10)
    assert_throttled(right, "Too many login attempts from your network address")
    # The same staff member from their own address logs in at once.
    with browser_at(site.web2, new_address()) as own:
        ok = post_form(own, "/admin/login/", {"username": "staffer", "password": PASSWORD})
        assert ok.status_code == 302
        assert own.get("/admin/", follow_redirects=False).status_code == 200


def test_a_username_is_limited_across_addresses_with_a_growing_wait(site: Site) -> None:
    # The victim logged in before from their own browser, which now has its device cookie.
    home = new_address()
    with browser_at(site.web1, home) as browser:
        assert log_in(site.web1, home, "victim", PASSWORD, client=browser).status_code == 302
        device = browser.cookies["chat_login_device"]

    # Three guesses at once from three addresses (the burst the short window allows), split
    # between the two instances, one in another case of the name.
    with ThreadPoolExecutor(3) as pool:
        names = ("victim", "VICTIM", "victim")
        bases = (site.web1, site.web2, site.web1)
        burst = list(
            pool.map(
                lambda i: log_in(bases[i], new_address(), names[i], f"guess{i}", n=i), range(3)
            )
        )
    assert [r.status_code for r in burst] == [200, 200, 200]
    assert all("did not match" in r.text for r in burst)
    # A fourth from a fresh address that never tried: the username is paused.
    fourth = log_in(site.web2, new_address(), "victim", "guess3", n=3)
    first_wait = assert_throttled(fourth, "Too many login attempts for this username")
    assert first_wait <= 10
    # The short window frees when it said (a real wait: the test sleeps exactly that long)...
    time.sleep(first_wait + 0.5)
    for n in (4, 5):
        response = log_in(site.web1, new_address(), "victim", f"guess{n}", n=n)
        assert response.status_code == 200 and "did not match" in response.text
    # ...and after five in the hour the wait has grown from seconds to the hour's.
    sixth = log_in(site.web2, new_address(), "victim", "guess6", n=6)
    grown = assert_throttled(sixth, "Too many login attempts for this username")
    assert grown > 600 and grown > first_wait
    # The right password from a new browser is refused too: the attacker cannot learn it.
    assert_throttled(log_in(site.web1, new_address(), "victim", PASSWORD), "for this username")

    # The victim's own browser (its device cookie, no session) still logs them in...
    with browser_at(site.web1, home) as browser:
        browser.cookies.set("chat_login_device", device)
        ok = log_in(site.web1, home, "victim", PASSWORD, client=browser)
        assert ok.status_code == 302 and ok.headers["Location"] == "/"
        assert browser.get("/").status_code == 200
    # ...a forged or altered device cookie counts for nothing...
    for forged in (device[:-2] + "xy", "victim", device.replace(":", ";", 1)):
        with browser_at(site.web2, new_address()) as other:
            other.cookies.set("chat_login_device", forged)
            attempt = log_in(site.web2, "", "victim", "guess7", client=other)
            assert_throttled(attempt, "for this username")
    # ...and other users log in as usual, from any address.
    assert log_in(site.web2, new_address(), "bystander", PASSWORD).status_code == 302


def test_parallel_guesses_on_two_instances_get_exactly_the_allowed_password_checks(
    site: Site,
) -> None:
    def guess(i: int) -> httpx.Response:
        base = site.web1 if i % 2 else site.web2
        return log_in(base, new_address(), "parallel", f"guess{i}", n=i)

    addresses_needed = 20
    with ThreadPoolExecutor(addresses_needed) as pool:
        responses = list(pool.map(guess, range(addresses_needed)))
    checked = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 429]
    # The count is taken before the password is checked, atomically in Redis: no more than
    # the burst of three reaches the password check, however the requests interleave.
    assert len(checked) == 3 and len(refused) == addresses_needed - 3
    assert all("did not match" in r.text for r in checked)
    assert all("for this username" in r.text for r in refused)


def test_signups_are_limited_per_address_and_only_accounts_made_count(site: Site) -> None:
    farm = new_address()

    def signup(client: httpx.Client, name: str, confirm: str, n: int) -> httpx.Response:
        data = {"username": name, "password1": PASSWORD, "password2": confirm}
        return post_form(client, "/accounts/signup/", data, headers=spoofed(n))

    with browser_at(site.web1, farm) as client:
        # A mistyped confirmation is not an account: it is not counted.
        for n in range(2):
            typo = signup(client, f"farm{n}", PASSWORD + "x", n)
            assert typo.status_code == 200 and "password fields didn" in typo.text
    made, refused = [], []
    for n in range(10):
        # A fresh client each time (no session: a signed-in browser is sent home), on either
        # instance, every forwarding header claiming another address.
        with browser_at(site.web1 if n % 2 else site.web2, farm) as client:
            response = signup(client, f"farm{n}", PASSWORD, n)
        (made if response.status_code == 302 else refused).append(response)
    assert len(made) == 3 and len(refused) == 7
    for response in refused:
        assert_throttled(response, "Too many accounts were created from your network address")
    count = query_one(
        site.database_url, "SELECT count(*) FROM auth_user WHERE username LIKE 'farm%%'"
    )
    assert count == (3,)
    # Someone at another address signs up as usual.
    with browser_at(site.web2, new_address()) as client:
        assert signup(client, "neighbour", PASSWORD, 99).status_code == 302
