"""A JSON document written piece by piece, byte for byte as `json.dumps(indent=2)` writes it
whole: lists marked `Items` are drawn from their iterator as they are written."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any


class Items:
    """A JSON list whose items come from an iterator, one at a time, as it is written."""

    def __init__(self, items: Iterable[Any]) -> None:
        self.items = items


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2)


def pieces(value: Any, level: int = 0) -> Iterator[str]:
    """The text of `value` as json.dumps(value, ensure_ascii=False, indent=2) would write it
    at this nesting level. A JSON string never holds a raw newline, so indenting is safe."""
    pad = "\n" + "  " * level
    if isinstance(value, Items):
        first = True
        for item in value.items:
            yield ("[" if first else ",") + pad + "  "
            yield from pieces(item, level + 1)
            first = False
        yield "[]" if first else pad + "]"
    elif isinstance(value, dict) and any(isinstance(v, Items | dict) for v in value.values()):
        if not value:
            yield "{}"
            return
        for i, (key, item) in enumerate(value.items()):
            yield ("{" if i == 0 else ",") + pad + "  " + _dumps(key) + ": "
            yield from pieces(item, level + 1)
        yield pad + "}"
    else:
        yield _dumps(value).replace("\n", pad)


def chunks(parts: Iterable[str], size: int = 64 * 1024) -> Iterator[bytes]:
    """The pieces as UTF-8, gathered into chunks of about `size` bytes (the last may be less)."""
    buffer: list[bytes] = []
    held = 0
    for part in parts:
        data = part.encode()
        buffer.append(data)
        held += len(data)
        if held >= size:
            yield b"".join(buffer)
            buffer, held = [], 0
    if buffer:
        yield b"".join(buffer)
