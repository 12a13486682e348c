"""Test support: every frame that starts a turn, spelled on the wire in every way JSON allows,
and the setup and checks the re-spelling fuzz (tests/test_security_respelled.py, in-process on
SQLite; tests/test_security_respelled_postgres.py, a real daphne on PostgreSQL and Redis) shares.

The kinds: a prompt (new chat or an existing conversation), an edit (a prompt that `replaces`
an earlier one), a regeneration, a retry (a `regenerate` of a failed answer: what the page's
Retry sends) and a continue of a stopped answer. Each is spelled with `\\uXXXX` escapes in keys
and values, its keys in any order, white space between every token, unknown keys, and
sometimes a repeated key (refused as `bad_request`: a frame that says two things).

A tab is reached through a `Tab` (send a text frame, receive the next one), the database
through a `Snapshot` (every message: role, status, conversation, parent, text length), and the
upstream through tests/recording_upstream.py: the checks are the same on both servers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, Phase
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from tests.recording_upstream import Gate, Recorded

# A request whose last user message holds this is held by the recording upstream's gate: its
# answer streams (holding a stream slot) for as long as the test needs.
HOLD = "/echo hold"
# What a tab over each limit must be told.
SCENARIO_CODES = {"rate": "rate_limited", "streams": "too_many_streams", "quota": "quota_exceeded"}
# The limits of each scenario (CHAT_RATE_LIMIT, CHAT_MAX_CONCURRENT_STREAMS,
# CHAT_DAILY_TOKENS). The setup takes three turns: at "3/hour" the rate is then spent. A refused
# turn still counts against the rate (docs/decisions), so the other scenarios have room for it.
SCENARIO_LIMITS = {
    "rate": ("3/hour", 20, 0),
    "streams": ("100000/hour", 1, 0),
    "quota": ("100000/hour", 20, 400),
}
KNOWN_KEYS = frozenset({"type", "text", "conversation", "replaces", "model", "mid", "after"})

fuzz_settings = hypothesis_settings(
    deadline=None,
    # No shrinking: the examples share one socket and one user, so a frame that slipped through
    # leaves a turn behind that fails every later example; the first failure is the culprit.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    report_multiple_bugs=False,
    database=None,  # no example database written into the repository
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass(frozen=True)
class Targets:
    """Real messages of the user under test, so a frame that slipped through would start a
    real turn (an edit, a regeneration, a retry, a continue), not a `not_found`."""

    conversation: str
    prompt: str  # the first prompt: what an edit replaces
    answer: str  # its complete answer: what a regeneration asks again
    failed: str  # a failed answer: what Retry regenerates
    stopped: str  # a stopped answer: what Continue goes on with


KINDS = ("prompt", "edit", "regenerate", "retry", "continue")


@st.composite
def turn_frame(draw: st.DrawFn, targets: Targets) -> tuple[str, list[tuple[str, Any]]]:
    """(kind, the frame's keys and values in their plain order), every kind as often."""
    kind = draw(st.sampled_from(KINDS))
    said = draw(st.sampled_from(["/echo re-spelled", "/long 5000", "Hello there"]))
    if kind == "prompt":
        conversation = draw(st.sampled_from(["", None, targets.conversation]))
        return kind, [("type", "prompt"), ("conversation", conversation), ("text", said)]
    if kind == "edit":
        return kind, [
            ("type", "prompt"),
            ("conversation", targets.conversation),
            ("text", said),
            ("replaces", targets.prompt),
        ]
    if kind == "regenerate":
        return kind, [("type", "regenerate"), ("mid", targets.answer)]
    if kind == "retry":
        return kind, [("type", "regenerate"), ("mid", targets.failed)]
    return kind, [("type", "continue"), ("mid", targets.stopped)]


white = st.text(alphabet=" \t\n\r", max_size=3)
unknown_keys = (
    st.sampled_from(["HEADERS", "x", "Type", "TYPE", "type ", " type", "mid2", "_", "text_"])
    | st.text(max_size=8)
).filter(lambda key: key not in KNOWN_KEYS)
# No floats: NaN would make the generator's own check (the frame reads back as meant) fail.
unknown_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children)
    ),
    max_leaves=6,
) | st.just({"HX-Request": "true", "HX-Trigger": "composer"})


@st.composite
def spelled_string(draw: st.DrawFn, value: str) -> str:
    """A JSON string for `value`, each character plain or escaped (`\\u0070`, `\\u0050`, `\\/`)."""
    out = ['"']
    for ch in value:
        how = draw(st.sampled_from(["plain", "escape"]))
        if how == "escape" and ord(ch) <= 0xFFFF:
            code = f"{ord(ch):04x}"
            out.append("\\u" + (code.upper() if draw(st.booleans()) else code))
        elif ch == "/" and draw(st.booleans()):
            out.append("\\/")
        else:
            out.append(json.dumps(ch, ensure_ascii=False)[1:-1])
    out.append('"')
    return "".join(out)


@st.composite
def spelled_value(draw: st.DrawFn, value: Any) -> str:
    if isinstance(value, str):
        return str(draw(spelled_string(value)))
    return json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class Spelled:
    """One generated frame: its kind, the text sent, what it means, and whether it repeats a
    key (then it must be refused as `bad_request`, whatever it says)."""

    kind: str
    raw: str
    meant: dict[str, Any]
    duplicated: bool


@st.composite
def respelled(draw: st.DrawFn, targets: Targets) -> Spelled:
    kind, pairs = draw(turn_frame(targets))
    extra = draw(st.dictionaries(unknown_keys, unknown_values, max_size=3))
    pairs = pairs + list(extra.items())
    meant = dict(pairs)
    duplicated = draw(st.integers(min_value=0, max_value=4)) == 0
    if duplicated:
        key, value = draw(st.sampled_from(pairs))
        again = draw(st.sampled_from([value, "stop", "resume", None, 1]))
        pairs.insert(draw(st.integers(0, len(pairs))), (key, again))
    ordered = draw(st.permutations(pairs))
    members = [
        draw(white)
        + draw(spelled_string(key))
        + draw(white)
        + ":"
        + draw(white)
        + draw(spelled_value(value))
        + draw(white)
        for key, value in ordered
    ]
    raw = draw(white) + "{" + ",".join(members) + "}" + draw(white)
    return Spelled(kind, raw, meant, duplicated)


def reads_back(spelled: Spelled) -> bool:
    """The generator's own check: the text parses to what it meant, and repeats a key exactly
    when it says so (by a parser other than the product's)."""
    repeats: list[bool] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        repeats.append(len(items) != len({key for key, _ in items}))
        return dict(items)

    parsed = json.loads(spelled.raw, object_pairs_hook=pairs)
    repeated = any(repeats)
    return repeated == spelled.duplicated and (repeated or parsed == spelled.meant)


# --- a tab, the database, the setup --------------------------------------------------------


@dataclass
class Tab:
    """One socket, whichever client drives it: send a text frame, receive the next frame."""

    send: Callable[[str], Awaitable[None]]
    receive: Callable[[], Awaitable[str]]


Snapshot = Callable[[], Awaitable[dict[str, tuple[Any, ...]]]]


def frame(kind: str, **values: Any) -> str:
    return json.dumps({"type": kind, **values})


async def done_of(tab: Tab) -> dict[str, Any]:
    """The next `done` (HTML and chunks are skipped); fails on an error first."""
    while True:
        raw = await tab.receive()
        if not raw.startswith("{"):
            continue
        got = json.loads(raw)
        assert got["type"] != "error", got
        if got["type"] == "done":
            return dict(got)


async def streaming_answer(snapshot: Snapshot, known: set[str]) -> str:
    """The mid of the answer that started streaming after `known` (it is held at the gate)."""
    for _ in range(200):
        rows = await snapshot()
        new = [mid for mid, row in rows.items() if mid not in known and row[1] == "streaming"]
        if new:
            return new[0]
        await asyncio.sleep(0.05)
    raise AssertionError("no answer started streaming")


async def hold_an_answer(
    tab: Tab, snapshot: Snapshot, recorded: Recorded, conversation: str
) -> str:
    """Start an answer that the gate holds (its request has reached the gate); its mid. At the
    stream cap a slot freed by a `done` a moment ago may not be given back yet: tried again
    until it is."""
    for _ in range(100):
        known = set(await snapshot())
        asked = _held_requests(recorded)
        await tab.send(frame("prompt", conversation=conversation, text=HOLD))
        raw = await tab.receive()
        if raw.startswith("{") and json.loads(raw).get("code") == "too_many_streams":
            await asyncio.sleep(0.05)
            continue
        mid = await streaming_answer(snapshot, known)
        # The answer is stored before its request goes out: count requests only after it did.
        for _ in range(200):
            if _held_requests(recorded) > asked:
                return mid
            await asyncio.sleep(0.05)
        raise AssertionError("the held answer's request never reached the model")
    raise AssertionError("the stream slot never came back")


def _held_requests(recorded: Recorded) -> int:
    return sum(held(request) for request in recorded.snapshot())


async def prepare(tab: Tab, snapshot: Snapshot, recorded: Recorded, scenario: str) -> Targets:
    """Make the user's messages (three turns), then put the user over the scenario's limit:
    "rate" is over at three turns; "streams" holds an answer in flight at a cap of one;
    "quota" spends what is left with a long answer, which ends `stopped` with nothing left."""
    await tab.send(frame("prompt", conversation="", text="/echo first"))
    answer = (await done_of(tab))["mid"]
    conversation, prompt = (await snapshot())[answer][2:4]
    await tab.send(frame("prompt", conversation=conversation, text="/fail 503"))
    failed = await done_of(tab)
    assert failed["status"] == "failed", failed
    stopped = await hold_an_answer(tab, snapshot, recorded, conversation)
    await tab.send(frame("stop", mid=stopped))
    assert (await done_of(tab))["status"] == "stopped"
    if scenario == "streams":
        await hold_an_answer(tab, snapshot, recorded, "")
    elif scenario == "quota":
        await tab.send(frame("prompt", conversation="", text="/long 5000"))
        spent = await done_of(tab)
        assert spent["status"] == "stopped" and spent["tokens_left"] == 0, spent
    return Targets(conversation, prompt, answer, failed["mid"], stopped)


async def first_frame(tab: Tab) -> dict[str, Any]:
    """The first frame the tab gets after a frame was sent: it must be JSON (an HTML frame
    is the bubble of a turn that started)."""
    raw = await tab.receive()
    assert raw.startswith("{"), f"a turn started: {raw[:300]}"
    return dict(json.loads(raw))


async def check_refused(
    tab: Tab, snapshot: Snapshot, recorded: Recorded, raw: str, code: str
) -> dict[str, Any]:
    """Send `raw`: the tab must get an `error` with `code`, the database must not change and
    the upstream must get no request."""
    before, asked = await snapshot(), len(recorded.snapshot())
    await tab.send(raw)
    got = await first_frame(tab)
    assert got["type"] == "error" and got["code"] == code, (raw, got)
    assert got["message"]
    assert await snapshot() == before, ("a refused frame changed the messages", raw)
    assert len(recorded.snapshot()) == asked, ("a refused frame reached the model", raw)
    return got


def expected_code(spelled: Spelled, scenario: str) -> str:
    return "bad_request" if spelled.duplicated else SCENARIO_CODES[scenario]


def held(request: dict[str, Any]) -> bool:
    """The gate's rule: hold a request whose last user message asks for it."""
    users = [m for m in request.get("messages", []) if m.get("role") == "user"]
    return bool(users) and str(users[-1].get("content", "")).startswith(HOLD)


def holding_gate() -> Gate:
    return Gate(matches=held, hold_seconds=300)
