"""Continue (issue 17.3): a stopped, cut or length-limited answer goes on in the same message,
its seqs on from the earlier `done.seq`, exactly once, resumable, and limited like every turn."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from channels.db import database_sync_to_async

from chat.demo_upstream import long_tokens
from chat.models import LENGTH_LIMITED, Message
from tests.conftest import assistant_mid, receive_until_done

pytestmark = pytest.mark.usefixtures("chat_settings")


def ask(text: str, conversation: str = "") -> str:
    return json.dumps({"type": "prompt", "conversation": conversation, "text": text})


def go_on(mid: str) -> str:
    return json.dumps({"type": "continue", "mid": mid})


async def next_json(comm: Any) -> dict[str, Any]:
    while True:
        raw = await comm.receive_from(timeout=10)
        if raw.startswith("{"):
            return json.loads(raw)


async def message(mid: str) -> Message:
    return await database_sync_to_async(Message.objects.get)(mid=mid)


async def continued(comm: Any, mid: str, after: int) -> dict[str, Any]:
    """Send Continue for `mid`; its shell comes first, then chunks from `after + 1`, then done."""
    await comm.send_to(text_data=go_on(mid))
    shell = await comm.receive_from(timeout=10)
    assert f'id="msg-{mid}"' in shell and 'data-status="streaming"' in shell
    assert f'data-next="{after + 1}"' in shell
    return await receive_until_done(comm, mid, after=after)


async def test_a_length_limited_answer_goes_on_in_the_same_message(
    connect: Any, owner: Any
) -> None:
    comm = await connect(owner)
    await comm.send_to(text_data=ask("/length 10 /long 25"))
    first = await receive_until_done(comm)
    mid, seq = first["done"]["mid"], first["done"]["seq"]
    assert first["done"]["status"] == "complete" and first["done"]["error"] == LENGTH_LIMITED
    assert 'class="continue"' in "".join(first["html"])

    second = await continued(comm, mid, seq - 1)
    assert second["done"]["seq"] > seq  # the seqs went on from the earlier done.seq
    third = await continued(comm, mid, second["done"]["seq"] - 1)
    assert third["done"]["status"] == "complete" and "error" not in third["done"]
    saved = await message(mid)
    assert saved.text == first["text"] + second["text"] + third["text"]
    assert saved.text == "".join(long_tokens(25))
    assert saved.status == "complete" and saved.chunk_count == third["done"]["seq"]
    # One message, not three: Continue appends, it does not add answers.
    assert await database_sync_to_async(Message.objects.filter(role="assistant").count)() == 1
    assert saved.completion_tokens == 25


async def test_a_stopped_answer_continues_with_its_old_text_as_a_prefix_and_resumes(
    connect: Any, owner: Any, settings: Any, slow_demo_upstream: str
) -> None:
    settings.LLM_BASE_URL = slow_demo_upstream
    comm = await connect(owner)
    await comm.send_to(text_data=ask("/long 300"))
    mid = assistant_mid(await comm.receive_from(timeout=10))
    first = await next_json(comm)
    await comm.send_to(text_data=json.dumps({"type": "stop", "mid": mid}))
    stopped = await receive_until_done(comm, mid, after=first["seq"])
    assert stopped["done"]["status"] == "stopped"
    old = (await message(mid)).text
    base = stopped["done"]["seq"]

    await comm.send_to(text_data=go_on(mid))
    assert f'data-next="{base}"' in await comm.receive_from(timeout=10)
    live = await next_json(comm)
    assert live["type"] == "chunk" and live["seq"] == base
    # Another tab (a reload) resumes the answer from its first chunk, across the continuation.
    other = await connect(owner)
    await other.send_to(text_data=json.dumps({"type": "resume", "mid": mid, "after": -1}))
    replay = await receive_until_done(other, mid)
    rest = await receive_until_done(comm, mid, after=base)
    saved = await message(mid)
    assert saved.status == "complete"
    assert saved.text.startswith(old) and len(saved.text) > len(old)
    assert saved.text == old + live["text"] + rest["text"]
    assert replay["text"] == saved.text
    assert saved.text == "".join(long_tokens(300))


async def test_a_cut_answer_can_be_continued(connect: Any, owner: Any) -> None:
    comm = await connect(owner)
    await comm.send_to(text_data=ask("/cut 12"))
    cut = await receive_until_done(comm)
    mid = cut["done"]["mid"]
    assert cut["done"]["status"] == "failed" and cut["text"]
    result = await continued(comm, mid, cut["done"]["seq"] - 1)
    assert result["done"]["status"] == "complete"
    assert (await message(mid)).text == "".join(long_tokens(12))


async def test_only_stopped_cut_or_length_limited_answers_continue(
    connect: Any, owner: Any
) -> None:
    comm = await connect(owner)
    await comm.send_to(text_data=ask("/echo done and dusted"))
    done = await receive_until_done(comm)
    assert 'class="continue"' not in "".join(done["html"])
    await comm.send_to(text_data=go_on(done["done"]["mid"]))
    error = await next_json(comm)
    assert error["code"] == "bad_request" and error["mid"] == done["done"]["mid"]
    assert (await message(done["done"]["mid"])).text == "done and dusted"


async def test_only_the_last_answer_of_the_conversation_continues(connect: Any, owner: Any) -> None:
    # An earlier stopped answer that a later exchange follows: going on with it would rewrite
    # what the later prompt was answered from (the new user's review found the button there).
    comm = await connect(owner)
    await comm.send_to(text_data=ask("/cut 12"))
    cut = await receive_until_done(comm)
    earlier = cut["done"]["mid"]
    conversation = (await message(earlier)).conversation_id
    await comm.send_to(text_data=ask("/echo second", str(conversation)))
    await receive_until_done(comm)

    await comm.send_to(text_data=go_on(earlier))
    error = await next_json(comm)
    assert error["code"] == "bad_request" and error["mid"] == earlier
    assert "last answer" in error["message"]
    stored = await message(earlier)
    assert stored.status == Message.Status.FAILED
    assert stored.text == cut["text"]


async def test_a_conversation_stored_without_a_leaf_continues_its_newest_answer(
    connect: Any, owner: Any
) -> None:
    # Conversations stored before leaves were have none: the newest message is the last one.
    comm = await connect(owner)
    await comm.send_to(text_data=ask("/cut 12"))
    cut = await receive_until_done(comm)
    mid = cut["done"]["mid"]

    def forget_leaf() -> None:
        conversation = Message.objects.get(mid=mid).conversation
        type(conversation).objects.filter(pk=conversation.pk).update(leaf=None)

    await database_sync_to_async(forget_leaf)()
    result = await continued(comm, mid, cut["done"]["seq"] - 1)
    assert result["done"]["status"] == "complete"


async def test_two_continues_at_once_go_on_exactly_once(
    connect: Any, owner: Any, settings: Any, slow_demo_upstream: str
) -> None:
    settings.LLM_BASE_URL = slow_demo_upstream
    comm = await connect(owner)
    await comm.send_to(text_data=ask("/length 5 /long 40"))
    first = await receive_until_done(comm)
    mid = first["done"]["mid"]
    await comm.send_to(text_data=go_on(mid))
    await comm.send_to(text_data='{"mid": "' + mid + '", "type": "\\u0063ontinue"}')
    frames: list[dict[str, Any]] = []
    while not any(f.get("type") == "done" for f in frames):
        raw = await comm.receive_from(timeout=10)
        if raw.startswith("{"):
            frames.append(json.loads(raw))
    errors = [f for f in frames if f["type"] == "error"]
    assert [e["code"] for e in errors] == ["bad_request"]
    saved = await message(mid)
    assert saved.text == "".join(long_tokens(10))  # five, then five more: once


@pytest.mark.parametrize(
    "spelling",
    ['{"type": "continue", "mid": "%s"}', '{"\\u0074ype": "\\u0063ontinue", "mid": "%s"}'],
)
async def test_continue_is_rate_limited_however_spelled(
    connect: Any, owner: Any, settings: Any, spelling: str
) -> None:
    settings.CHAT_RATE_LIMIT = "1/minute"
    comm = await connect(owner)
    await comm.send_to(text_data=ask("/length 3 /long 10"))
    first = await receive_until_done(comm)
    mid = first["done"]["mid"]
    await comm.send_to(text_data=spelling % mid)
    refusal = await next_json(comm)
    assert refusal["code"] == "rate_limited" and refusal["retry_after"] > 0
    assert (await message(mid)).text == first["text"]


async def test_continue_is_refused_past_the_daily_quota(
    connect: Any, owner: Any, settings: Any
) -> None:
    settings.CHAT_DAILY_TOKENS = 60
    comm = await connect(owner)
    await comm.send_to(text_data=ask("/length 40 /long 80"))
    first = await receive_until_done(comm)
    mid = first["done"]["mid"]
    await comm.send_to(text_data=go_on(mid))
    refusal = await next_json(comm)
    assert refusal["code"] == "quota_exceeded"
    assert (await message(mid)).text == first["text"]


async def test_continue_waits_for_a_stream_slot(
    connect: Any, owner: Any, settings: Any, slow_demo_upstream: str
) -> None:
    settings.LLM_BASE_URL = slow_demo_upstream
    settings.CHAT_MAX_CONCURRENT_STREAMS = 1
    comm = await connect(owner)
    await comm.send_to(text_data=ask("/length 3 /long 10"))
    first = await receive_until_done(comm)
    mid = first["done"]["mid"]
    await comm.send_to(text_data=ask("/long 3000"))  # takes the one slot
    running = assistant_mid(await comm.receive_from(timeout=10))
    await comm.send_to(text_data=go_on(mid))
    refusal = await next_json(comm)
    while refusal["type"] != "error":
        refusal = await next_json(comm)
    assert refusal["code"] == "too_many_streams"
    await comm.send_to(text_data=json.dumps({"type": "stop", "mid": running}))
    assert (await message(mid)).text == first["text"]
    assert re.fullmatch(r"[^\x00]+", first["text"])


async def test_a_stopped_then_continued_answer_counts_the_whole_answer_once(
    connect: Any, owner: Any, settings: Any, slow_demo_upstream: str
) -> None:
    """New-user review: a stopped `/long 400` said "518 out (estimated)" for fewer tokens than
    that, and after Continue the count was the estimate plus the rest, without "(estimated)".
    A stopped answer is estimated from the text deltas the model streamed (about one token
    each; never more than the ~4 chars rule), and the whole answer's count stays an estimate."""
    settings.LLM_BASE_URL = slow_demo_upstream
    comm = await connect(owner)
    await comm.send_to(text_data=ask("/long 300"))
    mid = assistant_mid(await comm.receive_from(timeout=10))
    first = await next_json(comm)
    for _ in range(5):
        first = await next_json(comm)
    await comm.send_to(text_data=json.dumps({"type": "stop", "mid": mid}))
    stopped = await receive_until_done(comm, mid, after=first["seq"])
    saved = await message(mid)
    streamed = next(n for n in range(301) if "".join(long_tokens(n)) == saved.text)
    assert 0 < streamed < 300
    # The demo's words are ~6.5 characters a token: the rule alone says more than it streamed.
    assert len(saved.text) / 4 > streamed
    assert saved.completion_tokens == streamed and saved.usage_estimated
    assert stopped["done"]["usage"]["completion_tokens"] == streamed

    rest = await continued(comm, mid, stopped["done"]["seq"] - 1)
    saved = await message(mid)
    assert saved.text == "".join(long_tokens(300))
    # The whole answer: what was streamed before Stop plus what the model counted after it.
    assert saved.completion_tokens == 300 == rest["done"]["usage"]["completion_tokens"]
    assert saved.usage_estimated  # part of it was estimated
