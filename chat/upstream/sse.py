"""Incremental Server-Sent Events parser (the WHATWG event stream rules) for upstream reads."""

from __future__ import annotations

import codecs
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event: its type ("message" unless `event:` said otherwise), data, last id."""

    event: str
    data: str
    id: str | None


class SSEParser:
    """Turns raw bytes, cut anywhere by the network, into complete events.

    Feed it every read as it arrives; it keeps whatever is unfinished (half a line, half a
    UTF-8 sequence, a CR whose LF may come next) until the next read. Follows the WHATWG
    rules: CR, LF and CRLF all end a line; a leading BOM is dropped; lines starting with ':'
    are comments (keep-alives); one space after the field's colon is optional; `data:` lines
    join with '\\n'; an event with no data is not dispatched; `id` persists across events; an
    unknown field or a malformed line is ignored. A final event without its blank line is
    discarded, as the spec says, so a stream cut mid-event never yields half an event.
    """

    __slots__ = (
        "_data",
        "_decoder",
        "_event_type",
        "_has_data",
        "_last_id",
        "_partial",
        "_pending_cr",
        "_seen_first_char",
        "retry",
    )

    def __init__(self) -> None:
        # errors="replace": a server that sends invalid UTF-8 gets U+FFFD, as a browser does.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""
        self._pending_cr = False
        self._seen_first_char = False
        self._event_type = ""
        self._data: list[str] = []
        self._has_data = False
        self._last_id = ""
        self.retry: int | None = None

    def feed(self, data: bytes) -> list[SSEEvent]:
        """Parse one read; return the events it completed (often none, sometimes several)."""
        text = self._decoder.decode(data)
        if not text:
            return []
        if not self._seen_first_char:
            self._seen_first_char = True
            if text[0] == "\ufeff":
                text = text[1:]
                if not text:
                    return []
        if self._pending_cr:
            # The previous read ended in CR, which already ended that line: an LF opening this
            # read is the second half of a CRLF, not an empty line.
            self._pending_cr = False
            if text[0] == "\n":
                text = text[1:]
                if not text:
                    return []
        if "\r" in text:
            self._pending_cr = text[-1] == "\r"
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        if "\n" not in text:
            # The common case for tiny reads: no line finished yet.
            self._partial += text
            return []
        lines = text.split("\n")
        if self._partial:
            lines[0] = self._partial + lines[0]
        self._partial = lines.pop()
        return self._process(lines)

    def close(self) -> list[SSEEvent]:
        """End of stream: dispatch an event that lacks only its closing blank line.

        The spec drops such an event; we keep it because some servers end with
        `data: [DONE]` and a single newline, and losing that would look like a cut stream.
        A line with no line ending at all is still dropped: that may be half a line.
        """
        return self._process([""]) if not self._partial else []

    def _process(self, lines: list[str]) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        data = self._data
        for line in lines:
            if not line:
                if self._has_data:
                    events.append(
                        SSEEvent(
                            self._event_type or "message", "\n".join(data), self._last_id or None
                        )
                    )
                    data.clear()
                    self._has_data = False
                self._event_type = ""
                continue
            # Fast path: OpenAI-style streams are almost only "data: {...}" lines.
            if line.startswith("data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(" ") else value)
                self._has_data = True
                continue
            if line[0] == ":":
                continue
            field, colon, value = line.partition(":")
            if colon and value.startswith(" "):
                value = value[1:]
            if field == "data":  # "data" with no colon: an empty data line
                data.append(value)
                self._has_data = True
            elif field == "event":
                self._event_type = value
            elif field == "id" and "\0" not in value:
                self._last_id = value
            elif field == "retry" and value.isascii() and value.isdigit():
                self.retry = int(value)
            # Any other field is ignored, as the spec requires.
        return events
