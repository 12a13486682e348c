"""The websocket Origin check against a real daphne, with hand-written handshakes: every origin
the hostile review got accepted, and the ways a request may name its own origin."""

from __future__ import annotations

import base64
import os
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.servers import running_chatsite, signup
from tests.test_daphne import new_username


def handshake(base: str, session: str, *, origin: str | None, **headers: str) -> int:
    """The HTTP status daphne answers a websocket upgrade with (101: the socket opened).

    Written by hand so that any Host, Origin or X-Forwarded-Proto can be sent exactly as given.
    """
    address = urlsplit(base)
    fields = {
        "Host": address.netloc,
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
        "Sec-WebSocket-Version": "13",
        "Cookie": f"sessionid={session}",
        **({"Origin": origin} if origin is not None else {}),
        **{name.replace("_", "-"): value for name, value in headers.items()},
    }
    request = "GET /ws/chat/ HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items())
    with socket.create_connection((address.hostname, address.port), timeout=10) as conn:
        conn.sendall((request + "\r\n").encode("latin-1"))
        status_line = conn.makefile("rb").readline().decode("latin-1")
    return int(status_line.split()[1])


@pytest.fixture(scope="module")
def site() -> Iterator[tuple[str, str]]:
    with running_chatsite() as base:
        client = signup(base, new_username())
        yield base, client.cookies["sessionid"]


def test_only_the_exact_origin_of_the_request_opens_a_socket(site: tuple[str, str]) -> None:
    base, session = site
    port = urlsplit(base).port
    assert handshake(base, session, origin=base) == 101  # the control: our own page
    for origin in (
        "http://127.0.0.1:9999",  # our host, another port: another site
        "http://127.0.0.1",  # our host on port 80
        f"https://127.0.0.1:{port}",  # another scheme
        f"ftp://127.0.0.1:{port}",
        f"chrome-extension://127.0.0.1:{port}",
        "chrome-extension://127.0.0.1",
        f"ws://127.0.0.1:{port}",
        f"http://localhost:{port}",  # an allowed host, but not the one this request came to
        f"http://127.0.0.1:{port}.evil.example",
        f"http://127.0.0.1:{port}@evil.example",
        f"{base}/",  # not an origin (browsers never add a path)
        "http://evil.example",
        "null",
        "",
        None,
    ):
        # 400: autobahn itself refuses an Origin it cannot parse; 403: our check refused it.
        assert handshake(base, session, origin=origin) in (400, 403), origin


def test_a_host_outside_allowed_hosts_is_refused_even_with_its_own_origin(
    site: tuple[str, str],
) -> None:
    base, session = site
    # DNS rebinding: evil.example resolves to us; the page's origin matches the Host it sent.
    assert handshake(base, session, origin="http://evil.example", Host="evil.example") == 403
    # The control: another allowed host with its own origin is fine.
    port = urlsplit(base).port
    assert (
        handshake(base, session, origin=f"http://localhost:{port}", Host=f"localhost:{port}") == 101
    )


def test_behind_the_tls_proxy_only_the_https_origin_opens_a_socket() -> None:
    with running_chatsite(DJANGO_BEHIND_PROXY="1") as base:
        session = signup(base, new_username()).cookies["sessionid"]
        secure = base.replace("http://", "https://")
        assert handshake(base, session, origin=secure, X_Forwarded_Proto="https") == 101
        assert handshake(base, session, origin=base, X_Forwarded_Proto="https") == 403
        # Without the proxy's header the request is plain http: the https origin is another.
        assert handshake(base, session, origin=secure) == 403
        assert handshake(base, session, origin=base) == 101


def test_trusted_origins_open_a_socket_and_nothing_like_them_does() -> None:
    trusted = "https://chat.example.com,https://*.apps.example.com"
    with running_chatsite(DJANGO_CSRF_TRUSTED_ORIGINS=trusted) as base:
        session = signup(base, new_username()).cookies["sessionid"]
        for origin in ("https://chat.example.com", "https://team.apps.example.com"):
            assert handshake(base, session, origin=origin) == 101, origin
        for origin in (
            "http://chat.example.com",
            "https://chat.example.com:8443",
            "https://evil-chat.example.com",
            "https://apps.example.com.evil.example",
            "http://team.apps.example.com",
        ):
            assert handshake(base, session, origin=origin) == 403, origin
