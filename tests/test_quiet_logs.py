"""autobahn's debug lines are built only when written (chat/sockets/quiet_logs.py): the lazy
helpers give the same text as autobahn's own, and a frame sent at the usual log level builds
none of them."""

from __future__ import annotations

import pprint
from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest
import txaio
from autobahn import util
from autobahn.twisted import websocket as twisted_websocket
from autobahn.twisted.websocket import WebSocketServerProtocol
from autobahn.websocket import protocol
from twisted.internet.testing import StringTransport
from twisted.logger import formatEvent

from chat.sockets import quiet_logs

txaio.use_twisted()


@pytest.fixture(autouse=True)
def installed() -> None:
    quiet_logs.install()


def test_the_lazy_helpers_write_what_autobahns_write() -> None:
    def method() -> None: ...

    assert str(protocol.hltype(method)) == util.hltype(method)
    assert f"{protocol.hlval(42)}" == util.hlval(42)
    assert "{x:>40}".format(x=twisted_websocket.hlval("peer")) == f"{util.hlval('peer'):>40}"
    config = [("openHandshakeTimeout", 5, "WebSocketServerFactory")] * 30
    assert str(protocol.pformat(config)) == pprint.pformat(config)
    # The one pformat that is not a log argument still returns a str.
    timings = protocol.Timings()
    timings.track("onOpen")
    assert isinstance(str(timings), str) and "onOpen" in str(timings)


def a_socket() -> Any:
    sock = WebSocketServerProtocol()
    sock.transport = StringTransport()
    sock.send_queue = deque()
    sock.state = WebSocketServerProtocol.STATE_OPEN
    sock.trafficStats = SimpleNamespace(outgoingOctetsWireLevel=0)
    sock.peer = "tcp4:127.0.0.1:50000"
    sock.logOctets = False
    return sock


def test_a_frame_sent_builds_no_debug_text(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    for name in ("hltype", "hlval"):
        original = getattr(util, name)
        monkeypatch.setattr(
            util, name, lambda *a, _o=original, _n=name, **k: built.append(_n) or _o(*a, **k)
        )
    # autobahn's modules imported the helpers by name: theirs are the lazy ones now, which call
    # autobahn's (spied on above) only to write a line.
    for module in (protocol, twisted_websocket):
        assert (module.hltype, module.hlval) == (quiet_logs.hltype, quiet_logs.hlval)
    assert protocol.pformat is quiet_logs.pformat
    sock = a_socket()
    sock.sendData(b"\x81\x05hello")
    assert sock.transport.value() == b"\x81\x05hello"
    assert built == []  # autobahn's own sendData built three per frame


def test_at_debug_level_the_line_is_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[dict[str, Any]] = []
    sock = a_socket()
    sock.log = txaio.make_logger()
    monkeypatch.setattr(
        sock.log, "debug", lambda fmt, **kw: events.append(dict(kw, log_format=fmt))
    )
    sock.sendData(b"\x81\x02hi")
    (event,) = events
    assert formatEvent(event) == (
        f"{util.hltype(sock.sendData)} sent {util.hlval(4)} bytes for peer {util.hlval(sock.peer)}"
    )
