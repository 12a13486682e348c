"""The resume storm (fifth hostile review, docs/security.md): tabs of one user reconnecting and
resuming a long streaming answer from its start, in a loop, slowed every other user's answers.
Every `resume` now counts against CHAT_RESUME_RATE per user, and one over it is refused —
of a streaming answer too, which used to be followed whatever the rate said — with a
`rate_limited` error naming the answer and when to ask again.

Attacked from outside: many sockets of one user reconnecting and resuming (in-process with
Redis and without, and over a real daphne), resume frames re-spelled every way JSON allows,
two users (one over the rate does not refuse the other), a refused resume asked again after
its `retry_after` gets the answer whole, and normal use — ten tabs all reconnecting at once
after a restart, each resuming once — is never refused at the default rate.

The answer is held mid-way by a real TCP hop in front of the demo model
(tests/held_upstream.py), so it is streaming, with its blocks made, for as long as a test needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from chat.demo_upstream.answers import tokenize
from chat.turns.registry import registry
from chat.turns.turn import Turn
from tests.conftest import REDIS_URL, assistant_mid
from tests.held_upstream import HeldAnswers, held_answers
from tests.respelled_frames import fuzz_settings, spelled_string, unknown_keys, white
from tests.servers import ROOT, base_env, running_chatsite, signup
from tests.test_daphne import chat_socket, next_json, ready, send_prompt
from tests.test_resume_replay import Seen, receive_until

pytestmark = pytest.mark.usefixtures("chat_settings")

# An answer of a few hundred blocks, held eight events before its end.
HEADINGS = 300
LONG = "# h\n" * HEADINGS + "The end."
HELD_BACK = 8
DEFAULT_RESUME_RATE = "30/minute"  # docs/configuration.md
DEFAULT_SOCKET_RATE = "60/minute"
CLOSE_TOO_MANY_SOCKETS = 4429


def resume(mid: str, after: int = -1) -> str:
    return json.dumps({"type": "resume", "mid": mid, "after": after})


@pytest.fixture
def held(demo_upstream: str, chat_settings: Any) -> Iterator[HeldAnswers]:
    with held_answers(demo_upstream, len(tokenize(LONG)) - HELD_BACK) as proxy:
        chat_settings.LLM_BASE_URL = proxy.url
        proxy.arm()
        yield proxy


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def backend(request: Any, settings: Any, redis_prefix: str) -> str:
    """Counted in this process, or in Redis (shared by every instance)."""
    if request.param == "redis":
        settings.REDIS_URL = REDIS_URL
    return str(request.param)


async def held_answer(connect: Any, user: Any, held: HeldAnswers) -> tuple[Any, str, Turn]:
    """A tab of `user` that asked for the long answer, its mid and its turn, once the answer
    is held mid-way with its blocks made."""
    asking = await connect(user)
    # Counted before the prompt: the answer may be held before its shell is read here, and a
    # count taken after it waited for one answer more than would ever come (CI, under load).
    before = held.held
    await asking.send_to(text_data=json.dumps({"type": "prompt", "text": "/echo " + LONG}))
    mid = assistant_mid(await asking.receive_from(timeout=10))
    await asyncio.to_thread(held.wait_held, before + 1)
    turn = registry.get(mid)
    assert turn is not None
    for _ in range(500):
        if len(turn.block_frames) >= HEADINGS - 10:
            return asking, mid, turn
        await asyncio.sleep(0.02)
    raise AssertionError(f"{len(turn.block_frames)} blocks of {HEADINGS}")


async def verdict(comm: Any, mid: str, raw: str | None = None) -> dict[str, Any] | Seen:
    """Send a resume of `mid` (`raw`: as spelled); the error it got, or what it replayed
    (every block so far) if it was let through."""
    await comm.send_to(text_data=raw if raw is not None else resume(mid))
    seen = Seen(mid)
    turn = registry.get(mid)
    assert turn is not None
    while True:
        text = await comm.receive_from(timeout=20)
        if text.startswith('{"type": "error"'):
            return dict(json.loads(text))
        seen.take(text)
        last = max(seen.chunks, default=-1)
        if len(seen.blocks) >= len(turn.block_frames) and last == len(turn.chunks) - 1:
            return seen


def assert_refused(got: dict[str, Any] | Seen, mid: str) -> dict[str, Any]:
    assert isinstance(got, dict), "a resume over the rate was replayed"
    assert got["type"] == "error" and got["code"] == "rate_limited", got
    assert got["mid"] == mid and got["retry_after"] >= 1 and got["reset_at"] > 0
    assert "goes on by itself" in got["message"]
    return got


# --- one user, many sockets ------------------------------------------------------------------


async def test_tabs_of_one_user_reconnecting_and_resuming_are_refused_over_the_rate(
    connect: Any, owner: Any, settings: Any, held: HeldAnswers, backend: str
) -> None:
    settings.CHAT_RESUME_RATE = "5/minute"
    asking, mid, turn = await held_answer(connect, owner, held)
    shown = "".join(turn.chunks)
    got = []
    for _ in range(12):  # the storm: a new socket each time, resuming from the start
        tab = await connect(owner)
        got.append(await verdict(tab, mid))
        await tab.disconnect()
    replayed = [g for g in got if isinstance(g, Seen)]
    assert len(replayed) == 5 and all(s.text == shown for s in replayed)
    for refusal in got[5:]:
        assert_refused(refusal, mid)
    # Several at once, on sockets open together: still refused, each told so.
    tabs = [await connect(owner) for _ in range(8)]
    for refusal in await asyncio.gather(*(verdict(tab, mid) for tab in tabs)):
        assert_refused(refusal, mid)
    # The refused tabs stay usable (a stop needs no rate), and the tab that was following the
    # answer all along still gets it whole: refusing a resume takes nothing from anyone.
    await tabs[0].send_to(text_data=json.dumps({"type": "stop", "mid": "1-none-00"}))
    assert json.loads(await tabs[0].receive_from(timeout=10))["code"] == "not_found"
    seen = Seen(mid)
    held.release()
    await receive_until(asking, seen, lambda: seen.done is not None)
    assert seen.done is not None and seen.done["status"] == "complete"
    assert "".join(seen.chunks[i] for i in sorted(seen.chunks)).endswith("The end.")


async def test_a_tab_already_following_keeps_following_when_its_resume_is_refused(
    connect: Any, owner: Any, settings: Any, held: HeldAnswers
) -> None:
    settings.CHAT_RESUME_RATE = "1/minute"
    _asking, mid, _turn = await held_answer(connect, owner, held)
    tab = await connect(owner)
    first = await verdict(tab, mid)
    assert isinstance(first, Seen)  # following it now
    assert_refused(await verdict(tab, mid), mid)  # a gap re-ask, say: over the rate
    held.release()  # the rest still comes to this tab, live
    await receive_until(tab, first, lambda: first.done is not None)
    assert first.done is not None and first.text == LONG


async def test_a_refused_resume_asked_again_after_retry_after_gets_the_answer_whole(
    connect: Any, owner: Any, settings: Any, held: HeldAnswers, backend: str
) -> None:
    settings.CHAT_RESUME_RATE = "2 per 2 seconds"
    _asking, mid, turn = await held_answer(connect, owner, held)
    tab = await connect(owner)
    for _ in range(2):
        assert isinstance(await verdict(tab, mid), Seen)
    refusal = assert_refused(await verdict(tab, mid), mid)
    assert refusal["retry_after"] <= 2
    await asyncio.sleep(refusal["retry_after"])  # what the page waits (docs/protocol.md)
    again = await verdict(tab, mid)
    assert isinstance(again, Seen) and again.text == "".join(turn.chunks)
    held.release()
    await receive_until(tab, again, lambda: again.done is not None)
    assert again.text == LONG and len(again.blocks) == HEADINGS + 1


async def test_a_finished_answer_resent_over_the_rate_is_refused_the_same_way(
    connect: Any, owner: Any, settings: Any
) -> None:
    settings.CHAT_RESUME_RATE = "2/minute"
    tab = await connect(owner)
    await tab.send_to(text_data=json.dumps({"type": "prompt", "text": "/echo finished"}))
    mid = assistant_mid(await tab.receive_from(timeout=10))
    done = Seen(mid)
    await receive_until(tab, done, lambda: done.done is not None)
    for _ in range(2):
        await tab.send_to(text_data=resume(mid))
        again = Seen(mid)
        await receive_until(tab, again, lambda: again.done is not None)  # noqa: B023
    await tab.send_to(text_data=resume(mid))
    while True:  # after the answers resent: their conversation's title and the tokens left
        frame = await tab.receive_from(timeout=10)
        if frame.startswith("{") and json.loads(frame)["type"] != "usage":
            break
    assert_refused(json.loads(frame), mid)


# --- handshakes: the reconnect churn itself -------------------------------------------------


async def refused_handshake(connect: Any, user: Any) -> dict[str, Any]:
    """A socket of `user` that must be refused: the error it is told, then close 4429."""
    comm = await connect(user, expect_ready=False)
    frame = json.loads(await comm.receive_from(timeout=10))
    closed = await comm.receive_output(timeout=10)
    assert closed["type"] == "websocket.close" and closed["code"] == CLOSE_TOO_MANY_SOCKETS
    return dict(frame)


async def test_one_users_tabs_reconnecting_in_a_loop_are_refused_over_the_socket_rate(
    connect: Any, owner: Any, other_user: Any, settings: Any, backend: str
) -> None:
    settings.CHAT_SOCKET_RATE = "5/minute"
    for _ in range(5):  # reconnect, reconnect, ...
        tab = await connect(owner)
        await tab.disconnect()
    for _ in range(3):
        frame = await refused_handshake(connect, owner)
        assert frame["type"] == "error" and frame["code"] == "rate_limited", frame
        assert frame["retry_after"] >= 1 and frame["reset_at"] > 0
        assert "connects again by itself" in frame["message"]
    # Several at once: each refused, each told so.
    frames = await asyncio.gather(*(refused_handshake(connect, owner) for _ in range(5)))
    assert {f["code"] for f in frames} == {"rate_limited"}
    # Another user is not refused for it, and has their own five.
    for _ in range(5):
        await connect(other_user)


async def test_a_refused_handshake_takes_no_socket_place(
    connect: Any, owner: Any, settings: Any, backend: str
) -> None:
    """Over the rate, a handshake is refused before it takes a place among the user's open
    sockets: refused tabs never fill CHAT_MAX_SOCKETS_PER_USER for the ones that come in."""
    settings.CHAT_SOCKET_RATE = "2 per 2 seconds"
    settings.CHAT_MAX_SOCKETS_PER_USER = 3
    tabs = [await connect(owner) for _ in range(2)]
    for _ in range(4):  # one place is free, but the rate refuses them
        assert (await refused_handshake(connect, owner))["code"] == "rate_limited"
    await tabs[0].disconnect()
    await asyncio.sleep(2.1)  # the rate's window passed: two places are free, not zero
    await connect(owner)
    await connect(owner)
    await asyncio.sleep(2.1)
    assert (await refused_handshake(connect, owner))["code"] == "too_many_sockets"


async def test_tabs_refused_at_the_socket_cap_do_not_use_up_the_socket_rate(
    connect: Any, owner: Any, settings: Any, backend: str
) -> None:
    """The hostile review: a user some tabs over the cap (each retrying every few seconds) used
    up CHAT_SOCKET_RATE with refusals, so their open tabs could not reconnect for a minute.
    The caps are checked first; only a handshake that gets a place counts against the rate."""
    settings.CHAT_SOCKET_RATE = "4/minute"
    settings.CHAT_MAX_SOCKETS_PER_USER = 2
    tabs = [await connect(owner) for _ in range(2)]  # 2 of the 4
    for _ in range(6):
        assert (await refused_handshake(connect, owner))["code"] == "too_many_sockets"
    await tabs[0].disconnect()
    again = await connect(owner)  # an open tab reconnects: 3 of the 4
    await tabs[1].disconnect()
    await connect(owner)  # 4 of the 4
    # The rate still holds for handshakes that get a place.
    await again.disconnect()
    assert (await refused_handshake(connect, owner))["code"] == "rate_limited"


# --- re-spelled resume frames ----------------------------------------------------------------


@st.composite
def respelled_resume(draw: st.DrawFn, mid: str) -> tuple[str, bool]:
    """A resume of `mid` spelled any way JSON allows: escapes in keys and values, keys in any
    order, white space, unknown keys, sometimes a repeated key. (raw, whether it repeats one)"""
    pairs: list[tuple[str, Any]] = [("type", "resume"), ("mid", mid)]
    if draw(st.booleans()):
        pairs.append(("after", draw(st.sampled_from([-1, 0, 3]))))
    pairs += list(draw(st.dictionaries(unknown_keys, st.integers(0, 9), max_size=2)).items())
    duplicated = draw(st.integers(0, 3)) == 0
    if duplicated:
        key, value = draw(st.sampled_from(pairs))
        pairs.insert(draw(st.integers(0, len(pairs))), (key, draw(st.sampled_from([value, 1]))))
    members = []
    for key, value in draw(st.permutations(pairs)):
        spelled = draw(spelled_string(value)) if isinstance(value, str) else json.dumps(value)
        members.append(
            draw(white) + draw(spelled_string(key)) + draw(white) + ":" + draw(white) + spelled
        )
    return draw(white) + "{" + ",".join(members) + "}" + draw(white), duplicated


async def test_respelled_resume_frames_count_and_are_refused_like_plain_ones(
    connect: Any, owner: Any, settings: Any, held: HeldAnswers
) -> None:
    settings.CHAT_RESUME_RATE = "3/hour"
    _asking, mid, _turn = await held_answer(connect, owner, held)
    tab = await connect(owner)
    # Re-spelled resumes count as plain ones: three of them spend the rate ...
    spelled = '{"mid":"' + "".join(f"\\u{ord(c):04x}" for c in mid) + '","type":"r\\u0065sume"}'
    for raw in (spelled, '{ "after" : -1 ,\n"\\u0074ype":"resume", "mid" : "' + mid + '" }'):
        assert isinstance(await verdict(tab, mid, raw), Seen), raw
    assert isinstance(await verdict(tab, mid, '{"HEADERS":{},' + resume(mid)[1:]), Seen)
    assert_refused(await verdict(tab, mid), mid)  # ... and a plain one is then refused
    loop = asyncio.get_running_loop()
    seen = {"refused": 0, "duplicated": 0}

    @hypothesis_settings(fuzz_settings, max_examples=60)
    @given(case=respelled_resume(mid))
    def run(case: tuple[str, bool]) -> None:
        raw, duplicated = case
        got = asyncio.run_coroutine_threadsafe(verdict(tab, mid, raw), loop).result(30)
        if duplicated:  # a frame that says two things is refused as such, never acted on
            assert isinstance(got, dict) and got["code"] == "bad_request", (raw, got)
            seen["duplicated"] += 1
        else:
            assert_refused(got, mid)
            seen["refused"] += 1

    await asyncio.to_thread(run)
    assert seen["refused"] and seen["duplicated"], seen


# --- other users, normal use ----------------------------------------------------------------


async def test_one_user_over_the_rate_does_not_refuse_another(
    connect: Any, owner: Any, other_user: Any, settings: Any, held: HeldAnswers, backend: str
) -> None:
    settings.CHAT_RESUME_RATE = "3/minute"
    _asking, mid, _turn = await held_answer(connect, owner, held)
    _theirs, other_mid, _other_turn = await held_answer(connect, other_user, held)
    for _ in range(6):
        attacker = await connect(owner)
        await verdict(attacker, mid)
        await attacker.disconnect()
    assert_refused(await verdict(await connect(owner), mid), mid)
    for _ in range(3):  # the other user's own allowance is whole
        assert isinstance(await verdict(await connect(other_user), other_mid), Seen)
    held.release()


async def test_ten_tabs_reconnecting_at_once_each_resuming_once_are_never_refused(
    connect: Any, owner: Any, settings: Any, held: HeldAnswers, backend: str
) -> None:
    """Normal use at the default rates: a server restart drops every tab of a user, and all
    ten come back at once, each resuming the answer it showed. Twice within a minute (a
    second restart, or a network drop): still nobody is refused, handshake or resume."""
    # chat_settings leaves both alone: these are the defaults of chatsite/settings.py
    assert settings.CHAT_RESUME_RATE == DEFAULT_RESUME_RATE
    assert settings.CHAT_SOCKET_RATE == DEFAULT_SOCKET_RATE
    _asking, mid, turn = await held_answer(connect, owner, held)
    shown = "".join(turn.chunks)
    for _ in range(2):
        tabs = await asyncio.gather(*(connect(owner) for _ in range(10)))
        results = await asyncio.gather(*(verdict(tab, mid) for tab in tabs))
        assert all(isinstance(r, Seen) and r.text == shown for r in results), results
        await asyncio.gather(*(tab.disconnect() for tab in tabs))
    held.release()


@pytest.mark.parametrize("name", ["CHAT_RESUME_RATE", "CHAT_SOCKET_RATE"])
def test_a_bad_rate_stops_the_process_at_start_up(name: str) -> None:
    def load(value: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", "import chatsite.settings"],
            cwd=ROOT,
            env=base_env(**{name: value}),
            capture_output=True,
            text=True,
        )

    assert load("3/hour;10/day").returncode == 0  # the control
    for bad in ("lots", "", "5 per fortnight"):
        result = load(bad)
        assert result.returncode != 0
        assert "ImproperlyConfigured" in result.stderr and name in result.stderr


# --- over a real daphne ----------------------------------------------------------------------


async def daphne_verdict(ws: ClientConnection, mid: str) -> dict[str, Any] | Seen:
    await ws.send(resume(mid))
    seen = Seen(mid)
    while True:
        raw = await asyncio.wait_for(ws.recv(), 20)
        assert isinstance(raw, str)
        if raw.startswith('{"type": "error"'):
            return dict(json.loads(raw))
        seen.take(raw)
        if len(seen.blocks) >= HEADINGS - 10 and seen.chunks:
            return seen


async def asked_long(base: str, client: httpx.Client) -> str:
    """Ask for the long answer on a socket of `client` (which then closes); its mid."""
    async with chat_socket(base, client) as ws:
        await ready(ws)
        await send_prompt(ws, "/echo " + LONG)
        while True:
            raw = await asyncio.wait_for(ws.recv(), 20)
            if isinstance(raw, str) and raw.startswith('{"type": "chunk"'):
                return str(json.loads(raw)["mid"])


@pytest.mark.timeout(180)
async def test_over_daphne_a_resume_storm_is_refused_and_normal_tabs_are_not(
    demo_upstream: str,
) -> None:
    with (
        held_answers(demo_upstream, len(tokenize(LONG)) - HELD_BACK) as hop,
        running_chatsite(
            LLM_BASE_URL=hop.url,
            CHAT_RESUME_RATE="12/minute",
            CHAT_SOCKET_RATE=DEFAULT_SOCKET_RATE,
            # Not the cap on open sockets: a closing tab gives its place back a moment after
            # its close, and the counts below are the rate's alone.
            CHAT_MAX_SOCKETS_PER_USER="100",
        ) as base,
    ):
        hop.arm()
        clients = [await asyncio.to_thread(signup, base, name) for name in ("storm", "calm")]
        storm, calm = clients
        mid = await asked_long(base, storm)
        calm_mid = await asked_long(base, calm)
        await asyncio.to_thread(hop.wait_held, 2)
        # The storm: 20 sockets of one user, each resuming from the start, dropping, again.
        # Two handshakes (the asking tab's, and this test's first) are already counted.
        got: list[dict[str, Any] | Seen] = []
        handshakes: list[dict[str, Any]] = []

        async def tab() -> None:
            for _ in range(4):
                async with chat_socket(base, storm) as ws:
                    first = await next_json(ws)
                    if first["type"] == "error":  # refused at the handshake: then 4429
                        handshakes.append(first)
                        with pytest.raises(ConnectionClosed) as closed:
                            await asyncio.wait_for(ws.recv(), 10)
                        assert closed.value.rcvd is not None
                        assert closed.value.rcvd.code == CLOSE_TOO_MANY_SOCKETS
                        continue
                    assert first["type"] == "ready", first
                    got.append(await daphne_verdict(ws, mid))

        await asyncio.gather(*(tab() for _ in range(20)))
        assert len(got) == 59 and len(handshakes) == 21, (len(got), len(handshakes))
        assert {h["code"] for h in handshakes} == {"rate_limited"}
        assert sum(isinstance(g, Seen) for g in got) == 12, got
        for refusal in got:
            if not isinstance(refusal, Seen):
                assert_refused(refusal, mid)
        # Meanwhile another user, with ten tabs all reconnecting at once, is never refused.
        async with contextlib.AsyncExitStack() as stack:
            tabs = await asyncio.gather(
                *(stack.enter_async_context(chat_socket(base, calm)) for _ in range(10))
            )
            await asyncio.gather(*(ready(ws) for ws in tabs))
            results = await asyncio.gather(*(daphne_verdict(ws, calm_mid) for ws in tabs))
        assert all(isinstance(r, Seen) for r in results), results
        hop.release()
        for client in clients:
            client.close()
