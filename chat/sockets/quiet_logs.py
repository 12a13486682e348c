"""autobahn's debug lines, formatted only when they are written.

autobahn (daphne's websocket protocol) logs at debug level on every frame it sends and every
connection it makes, and builds the lines' arguments first: `hltype`/`hlval` (which colour
their text with click when it is installed) on each frame, a `pformat` of its whole
configuration on each connection. The log calls themselves are no-ops below txaio's level
(info), so the arguments are built for nothing: ~6 µs a frame and ~120 µs a connection
(docs/decisions/performance.md). Here the two modules get lazy versions of the three helpers,
which do the same work if and when a line is written; nothing else of autobahn changes.
"""

from __future__ import annotations

from collections.abc import Callable
from pprint import pformat as _pformat
from typing import Any

from autobahn import util
from autobahn.twisted import websocket as twisted_websocket
from autobahn.websocket import protocol


class Lazy:
    """A log argument made by `fn(*args)` once it is formatted."""

    __slots__ = ("_args", "_fn")

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self._fn = fn
        self._args = args

    def __str__(self) -> str:
        return str(self._fn(*self._args))

    __repr__ = __str__

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def hltype(obj: Any) -> Lazy:
    return Lazy(util.hltype, obj)


def hlval(val: Any, color: str = "white", bold: bool = True) -> Lazy:
    return Lazy(util.hlval, val, color, bold)


def pformat(obj: Any) -> Lazy:
    return Lazy(_pformat, obj)


def _timings_str(self: Any) -> str:
    return _pformat(self._timings)


def install() -> None:
    """Swap in the lazy helpers (idempotent)."""
    for module in (protocol, twisted_websocket):
        module.hltype = hltype  # type: ignore[attr-defined]
        module.hlval = hlval  # type: ignore[attr-defined]
    protocol.pformat = pformat  # type: ignore[assignment]
    # The one use of pformat in that module that is not a log argument: a str it returns.
    protocol.Timings.__str__ = _timings_str  # type: ignore[method-assign]
