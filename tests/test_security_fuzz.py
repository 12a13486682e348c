"""Malformed input on the chat socket: hypothesis throws hostile frames at one open socket.

Every frame must get either an `error` frame or a normal answer (a `done`), the consumer must
never crash (the same socket answers `/echo ok` after the whole run), and nothing may be
stored for a frame that is not a valid prompt.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from chat.models import Message
from tests.conftest import receive_until_done

pytestmark = pytest.mark.usefixtures("chat_settings")

PROMPT_LIMIT = 24_000  # min(CHAT_MAX_PROMPT_CHARS, LLM_CONTEXT_CHARS): the defaults kept

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
# The protocol's keys with values of any type (and the protocol's types with wrong keys).
protocol_dicts = st.fixed_dictionaries(
    {"type": st.sampled_from(["prompt", "stop", "resume", "regenerate"]) | json_values},
    optional={
        "text": st.text(max_size=60) | json_values,
        "conversation": st.sampled_from(["", None]) | json_values,
        "mid": st.text(max_size=30) | json_values,
        "after": st.integers(min_value=-5, max_value=10**20) | json_values,
        "replaces": st.text(max_size=30) | json_values,
        "HEADERS": json_values,
    },
)


def _nest(depth: int, kind: str) -> str:
    if kind == "list":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


# Deep nesting: far past the JSON decoder's recursion limit, but inside daphne's 1 MiB frame
# limit (a dict level is 6 bytes: 170,000 levels and the widest wrapper are 1,020,050 bytes), so
# a real daphne hands every one of them to the consumer. Frames over the cap are closed 1009 by
# daphne itself: tests/test_daphne.py sends those on purpose.
MAX_DEPTH = 170_000
DEEP_WRAPPERS = [
    "@",
    '{"type": "prompt", "text": @}',
    '{"type": "prompt", "text": "hi", "conversation": @}',
    '{"type": @}',
    '{"type": "resume", "mid": @, "after": 1}',
]
deep = st.builds(
    lambda depth, kind, wrap: wrap.replace("@", _nest(depth, kind)),
    st.integers(min_value=1, max_value=MAX_DEPTH),
    st.sampled_from(["list", "dict"]),
    st.sampled_from(DEEP_WRAPPERS),
)
# Well-formed prompts with random unicode text (whitespace-only ones must be refused).
prompts = st.builds(
    lambda text, conversation: json.dumps(
        {"type": "prompt", "conversation": conversation, "text": text}, ensure_ascii=False
    ),
    st.text(min_size=1, max_size=200),
    st.sampled_from(["", None]),
)
text_frames = (
    prompts
    | json_values.map(json.dumps)
    | protocol_dicts.map(json.dumps)
    | deep
    | st.text(max_size=200)  # random unicode, mostly not JSON at all
)
frames = text_frames.map(lambda text: ("text", text)) | st.binary(max_size=64).map(
    lambda data: ("bytes", data)
)


def expected_outcome(kind: str, raw: str | bytes) -> str:
    """What the protocol (docs/protocol.md) says a frame must get: an answer or an error."""
    if kind == "bytes" or not isinstance(raw, str):
        return "error"
    duplicated: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in items]
        duplicated.extend(key for key in set(keys) if keys.count(key) > 1)
        return dict(items)

    try:
        frame = json.loads(raw, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return "error"
    if duplicated:
        return "error"  # a frame that says two things is refused, not guessed at
    if not isinstance(frame, dict) or frame.get("type") != "prompt":
        return "error"  # stop/resume/regenerate of random ids: not_found or bad_request
    text = frame.get("text")
    if not isinstance(text, str) or not text.strip() or len(text) > PROMPT_LIMIT:
        return "error"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "error"  # unpaired surrogates: not storable text
    if "\x00" in text:
        return "error"  # PostgreSQL cannot store NUL: refused on every database
    if any(frame.get(key) not in (None, "") for key in ("conversation", "replaces")):
        # Absent, null and "" mean "none"; anything else (an empty list or 0 too) is either
        # not an id (bad_request) or not an id of ours (not_found).
        return "error"
    return "answer"


async def answer_to(comm: WebsocketCommunicator) -> tuple[str, dict[str, Any]]:
    """Read until an `error` or a `done` arrives (HTML and chunks in between are skipped)."""
    while True:
        raw = await comm.receive_from(timeout=15)
        if not raw.startswith("{"):
            continue
        frame = json.loads(raw)
        if frame["type"] == "error":
            return "error", frame
        if frame["type"] == "done":
            return "answer", frame


async def check_one_frame(
    comm: WebsocketCommunicator, kind: str, raw: str | bytes, seen: dict[str, int]
) -> None:
    before = await database_sync_to_async(Message.objects.count)()
    # send_input, not send_to: send_to refuses empty frames, which a real client can send.
    await comm.send_input({"type": "websocket.receive", kind: raw})
    outcome, frame = await answer_to(comm)
    seen[outcome] = seen.get(outcome, 0) + 1
    after = await database_sync_to_async(Message.objects.count)()
    assert outcome == expected_outcome(kind, raw), (raw[:200], frame)
    if outcome == "error":
        assert frame["code"] in {"bad_request", "not_found"}, frame
        assert frame["message"]
        assert after == before, "an invalid frame stored something"
    else:
        assert after == before + 2  # the prompt and its answer, nothing else


settings_for_fuzz = hypothesis_settings(
    max_examples=200,
    deadline=None,
    database=None,  # no example database written into the repository
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


async def test_random_and_malformed_frames_never_crash_the_consumer(
    connect: Any, owner: Any, settings: Any
) -> None:
    # A random prompt that happens to be a directive must not stall the run.
    settings.LLM_READ_TIMEOUT = 2.0
    settings.LLM_TOTAL_TIMEOUT = 5.0
    comm = await connect(owner)
    seen: dict[str, int] = {}

    # pytest-asyncio does not drive hypothesis over a fixture that must stay open across
    # examples, so the examples run in a worker thread and hop back onto this loop (where the
    # socket lives) for each frame.
    @settings_for_fuzz
    @given(frame=frames)
    @example(frame=("text", _nest(100_000, "list")))
    @example(frame=("text", '{"type": "prompt", "text": ' + _nest(50_000, "list") + "}"))
    @example(frame=("text", '{"type": ' + _nest(5_000, "dict") + "}"))
    @example(frame=("text", '{"type": "stop", "mid": ' + _nest(900, "list") + "}"))
    @example(frame=("text", '{"type": "prompt", "text": "\\ud800"}'))  # a lone surrogate
    @example(frame=("text", "\x00\ufffe\U0010ffff"))
    @example(frame=("bytes", b"\xff\x00"))
    def run(frame: tuple[str, str | bytes]) -> None:
        async_to_sync(check_one_frame)(comm, *frame, seen)

    await sync_to_async(run, thread_sensitive=False)()
    # Both kinds of frames were exercised, not only the easy refusals.
    assert seen.get("answer", 0) >= 10 and seen.get("error", 0) >= 50, seen
    # Still the same socket, still answering.
    await comm.send_to(
        text_data=json.dumps({"type": "prompt", "conversation": "", "text": "/echo ok"})
    )
    result = await receive_until_done(comm)
    assert result["text"] == "ok"
    assert result["done"]["status"] == "complete"


def test_the_deepest_generated_frame_fits_under_daphnes_one_mib_cap() -> None:
    """The real-daphne fuzz (test_security_fuzz_postgres.py) expects an answer or an error for
    every frame; a frame over 1 MiB is closed 1009 by daphne before the consumer sees it."""
    from tests.test_daphne import ONE_MIB

    widest = max(
        len(wrap.replace("@", _nest(MAX_DEPTH, kind)).encode())
        for wrap in DEEP_WRAPPERS
        for kind in ("list", "dict")
    )
    assert widest < ONE_MIB
