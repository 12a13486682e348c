"""The SSE parser: the same events however the network cuts the bytes, per the WHATWG rules."""

from __future__ import annotations

import asyncio
import json

import pytest
from httpx_sse._decoders import SSEDecoder, SSELineDecoder
from hypothesis import given, settings
from hypothesis import strategies as st

from chat.demo_upstream import DemoModel
from chat.upstream.sse import SSEEvent, SSEParser
from tests.demo_server import call_demo_app

ECHO_TEXT = "Grüße, 世界! 🎉 naïve café\nsecond line\n\n```python\nprint('ok')\n```"


def _demo_stream() -> bytes:
    """A real OpenAI-style stream, as the demo model sends it (multibyte UTF-8 included)."""
    payload = {
        "model": "demo-full",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "/echo " + ECHO_TEXT}],
    }
    app = DemoModel(ttfb_ms=0, tokens_per_second=0)
    response = asyncio.run(call_demo_app(app, "POST", "/v1/chat/completions", payload))
    assert response.status == 200 and response.finished
    return response.body


REAL_STREAM = _demo_stream()

# Everything else the spec allows, in one stream: a BOM, comments, event and id fields,
# multi-line data, a field without a space after the colon, retry, unknown fields.
RICH_STREAM = (
    "\ufeff: keep-alive\n"
    "event: delta\nid: 1\ndata: first\n\n"
    "data:no space\n\ndata:  two spaces\n\n"
    ": another comment\n"
    "retry: 2500\nunknown: ignored\ndata: after unknown\n\n"
    "event: multi\ndata: line one\ndata: line two\ndata\n\n"
    'id: 7\ndata: {"x": "ü€𝄞"}\n\n'
).encode()


def _parse_whole(data: bytes) -> list[SSEEvent]:
    return SSEParser().feed(data)


def _parse_pieces(data: bytes, cuts: list[int]) -> list[SSEEvent]:
    parser = SSEParser()
    events: list[SSEEvent] = []
    start = 0
    for cut in [*sorted(cuts), len(data)]:
        events += parser.feed(data[start:cut])
        start = cut
    return events


def test_a_real_demo_stream_parses_into_its_chunks() -> None:
    events = _parse_whole(REAL_STREAM)
    assert events[-1] == SSEEvent("message", "[DONE]", None)
    chunks = [json.loads(e.data) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == ECHO_TEXT
    assert chunks[-1]["usage"]["completion_tokens"] > 0


@pytest.mark.parametrize("stream", [REAL_STREAM, RICH_STREAM], ids=["demo", "rich"])
def test_every_single_cut_of_a_stream_gives_the_same_events(stream: bytes) -> None:
    expected = _parse_whole(stream)
    for cut in range(len(stream) + 1):
        assert _parse_pieces(stream, [cut]) == expected, cut


@pytest.mark.parametrize("stream", [REAL_STREAM, RICH_STREAM], ids=["demo", "rich"])
def test_byte_by_byte_reads_give_the_same_events(stream: bytes) -> None:
    assert _parse_pieces(stream, list(range(len(stream)))) == _parse_whole(stream)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), ending=st.sampled_from(["\n", "\r\n", "\r"]))
def test_any_cuts_with_any_line_ending_give_the_same_events(
    data: st.DataObject, ending: str
) -> None:
    stream = data.draw(st.sampled_from([REAL_STREAM, RICH_STREAM]))
    stream = stream.replace(b"\n", ending.encode())
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=40))
    assert _parse_pieces(stream, cuts) == _parse_whole(stream.replace(ending.encode(), b"\n"))


def test_the_rich_stream_follows_the_spec() -> None:
    parser = SSEParser()
    assert parser.feed(RICH_STREAM) == [
        SSEEvent("delta", "first", "1"),
        SSEEvent("message", "no space", "1"),  # the id persists until changed
        SSEEvent("message", " two spaces", "1"),  # only one space is optional
        SSEEvent("message", "after unknown", "1"),
        SSEEvent("multi", "line one\nline two\n", "1"),  # bare "data" is an empty data line
        SSEEvent("message", '{"x": "ü€𝄞"}', "7"),
    ]
    assert parser.retry == 2500


def test_a_cr_at_the_end_of_one_read_and_lf_at_the_start_of_the_next_is_one_line_end() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\r") == []
    # Were the LF taken as a second line end, this would be an empty line: a dispatch.
    assert parser.feed(b"\ndata: b\r") == []
    assert parser.feed(b"\n\r\n") == [SSEEvent("message", "a\nb", None)]


def test_a_lone_cr_ends_a_line() -> None:
    assert SSEParser().feed(b"data: a\r\rdata: b\r\r") == [
        SSEEvent("message", "a", None),
        SSEEvent("message", "b", None),
    ]


def test_comments_and_keep_alives_produce_no_events() -> None:
    parser = SSEParser()
    assert parser.feed(b": ping\n\n:\n\n: ping\r\n\r\n") == []
    assert parser.feed(b"data: x\n: inside an event\n\n") == [SSEEvent("message", "x", None)]


def test_malformed_and_unknown_lines_are_ignored() -> None:
    stream = b"garbage line\nDATA: wrong case\nretry: soon\nid: a\x00b\n\xffdata: x\ndata: y\n\n"
    parser = SSEParser()
    # "\xffdata" is not the field "data" (after replacement it is "\ufffddata"): ignored.
    assert parser.feed(stream) == [SSEEvent("message", "y", None)]
    assert parser.retry is None


def test_an_event_without_data_is_not_dispatched() -> None:
    assert SSEParser().feed(b"event: ping\nid: 3\n\n") == []


def test_an_empty_data_field_is_an_event_with_empty_data() -> None:
    assert SSEParser().feed(b"data:\n\n") == [SSEEvent("message", "", None)]


def test_a_bom_is_dropped_only_at_the_very_start() -> None:
    bom = "\ufeff".encode()
    parser = SSEParser()
    assert parser.feed(bom[:1]) == []
    assert parser.feed(bom[1:] + b"data: a\n\n" + bom + b"data: b\n\n") == [
        SSEEvent("message", "a", None)
        # The second BOM starts a line "\ufeffdata: b": an unknown field, ignored.
    ]


def test_a_multibyte_character_split_across_reads_is_kept_whole() -> None:
    payload = "data: 𝄞é\n\n".encode()
    parser = SSEParser()
    events = [event for byte in payload for event in parser.feed(bytes([byte]))]
    assert events == [SSEEvent("message", "𝄞é", None)]


def test_invalid_utf8_becomes_the_replacement_character() -> None:
    assert SSEParser().feed(b"data: a\xffb\n\n") == [SSEEvent("message", "a\ufffdb", None)]


def test_an_unfinished_event_is_not_dispatched_until_its_blank_line() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: [DONE]\n") == []
    assert parser.feed(b"\n") == [SSEEvent("message", "[DONE]", None)]


def test_close_dispatches_an_event_missing_only_its_blank_line() -> None:
    parser = SSEParser()
    parser.feed(b"data: [DONE]\n")
    assert parser.close() == [SSEEvent("message", "[DONE]", None)]


def test_close_drops_a_line_cut_in_the_middle() -> None:
    parser = SSEParser()
    parser.feed(b'data: {"choices": [')
    assert parser.close() == []


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["", "delta", "error"]),
            st.lists(
                st.text(
                    st.characters(exclude_characters="\r\n\x00", exclude_categories=("Cs",)),
                    max_size=20,
                ),
                min_size=1,
                max_size=3,
            ),
        ),
        max_size=8,
    )
)
def test_it_agrees_with_httpx_sse_on_well_formed_streams(
    events: list[tuple[str, list[str]]],
) -> None:
    # A differential check against httpx-sse's decoder, on the streams both handle the same
    # (every event has data; no BOM).
    stream = ""
    for event_type, lines in events:
        if event_type:
            stream += f"event: {event_type}\n"
        stream += "".join(f"data: {line}\n" for line in lines) + "\n"
    line_decoder, decoder = SSELineDecoder(), SSEDecoder()
    theirs = []
    for line in line_decoder.decode(stream):
        sse = decoder.decode(line)
        if sse is not None:
            theirs.append((sse.event or "message", sse.data))
    ours = [(e.event, e.data) for e in SSEParser().feed(stream.encode())]
    assert ours == theirs
