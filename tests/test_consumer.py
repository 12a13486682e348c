"""The chat socket through Channels' WebsocketCommunicator, with the demo model over real HTTP."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

import pytest
from channels.db import database_sync_to_async

from chat import protocol
from chat.models import Conversation, Message
from chat.upstream.errors import SERVER_TROUBLE_MESSAGE
from tests.conftest import PHONE_UA, assistant_mid, receive_until_done

pytestmark = pytest.mark.usefixtures("chat_settings")


def prompt(text: str, conversation: str = "") -> dict[str, Any]:
    return {"type": "prompt", "conversation": conversation, "text": text}


def conversation_of(turn: dict[str, Any]) -> str:
    """The id of the conversation a first prompt created (its HTML frame gives it to the tab)."""
    match = re.search(r'id="conversation-id" value="([^"]+)"', "".join(turn["html"]))
    assert match, turn["html"]
    return match.group(1)


async def first_json(comm: Any, timeout: float = 10) -> dict[str, Any]:
    while True:
        raw = await comm.receive_from(timeout=timeout)
        if raw.startswith("{"):
            return json.loads(raw)


async def test_a_socket_without_a_session_is_refused(connect: Any) -> None:
    comm = await connect(None, expect_ready=False)
    assert not comm.connected


async def test_a_socket_from_a_foreign_origin_is_refused(connect: Any, owner: Any) -> None:
    comm = await connect(owner, origin="http://evil.example", expect_ready=False)
    assert not comm.connected


async def test_the_first_frame_says_tier_model_and_instance(
    connect: Any, owner: Any, settings: Any
) -> None:
    comm = await connect(owner)
    assert comm.ready["tier"] == "full"
    assert comm.ready["model"] == settings.CHAT_MODEL_FULL
    assert comm.ready["instance"] == settings.CHAT_INSTANCE_ID


async def test_a_phone_gets_the_lite_model(connect: Any, owner: Any, settings: Any) -> None:
    comm = await connect(owner, user_agent=PHONE_UA)
    assert comm.ready["tier"] == "lite"
    await comm.send_to(text_data=json.dumps(prompt("/echo small and fast")))
    result = await receive_until_done(comm)
    message = await database_sync_to_async(Message.objects.get)(mid=result["done"]["mid"])
    assert (message.tier, message.model) == ("lite", settings.CHAT_MODEL_LITE)


async def test_a_prompt_streams_its_answer_in_order_then_done(connect: Any, owner: Any) -> None:
    comm = await connect(owner)
    await comm.send_to(text_data=json.dumps(prompt("/echo Hello <b>world</b>, 你好!")))
    result = await receive_until_done(comm)
    # The first frame is HTML: the user's bubble (escaped) and the assistant's shell.
    assert result["order"][0] == "html"
    first = result["html"][0]
    assert "Hello &lt;b&gt;world&lt;/b&gt;, 你好!" in first
    assert 'data-status="streaming"' in first
    assert result["text"] == "Hello <b>world</b>, 你好!"
    done = result["done"]
    assert done["status"] == "complete"
    assert done["seq"] == len([t for t in result["order"] if t == "chunk"])
    assert done["usage"]["completion_tokens"] > 0
    # The final answer comes rendered and sanitised, replacing the shell.
    final = result["html"][-1]
    assert 'data-status="complete"' in final and "<b>" not in final
    message = await database_sync_to_async(Message.objects.get)(mid=done["mid"])
    assert message.status == "complete"
    assert message.text == "Hello <b>world</b>, 你好!"
    assert message.ttft_ms is not None
    assert re.fullmatch(r"\d{13}-[\w.]+-\d\d", message.mid)


async def test_the_first_prompt_creates_a_titled_conversation(connect: Any, owner: Any) -> None:
    comm = await connect(owner)
    await comm.send_to(text_data=json.dumps(prompt("/echo hi\nWhat is the capital of France?")))
    result = await receive_until_done(comm)
    conv = await database_sync_to_async(Conversation.objects.get)(user=owner)
    assert conv.title.startswith("/echo hi What is")
    assert f'value="{conv.id}"' in result["html"][0]  # the tab learns its conversation id
    # A second prompt continues the same conversation, with the history sent upstream.
    await comm.send_to(text_data=json.dumps(prompt("/echo again", str(conv.id))))
    await receive_until_done(comm)
    count = await database_sync_to_async(Message.objects.filter(conversation=conv).count)()
    assert count == 4


async def test_a_markdown_answer_arrives_rendered_at_the_end(connect: Any, owner: Any) -> None:
    comm = await connect(owner)
    await comm.send_to(text_data=json.dumps(prompt("hello")))
    result = await receive_until_done(comm)
    final = result["html"][-1]
    assert "<li>" in final and "<pre" in final
    assert result["order"][-2:] == ["html", "done"]


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("not json", "bad_request"),
        ("[1, 2]", "bad_request"),
        (json.dumps({"type": "dance"}), "bad_request"),
        (json.dumps({"type": "prompt"}), "bad_request"),
        (json.dumps(prompt("   ")), "bad_request"),
        (json.dumps(prompt("x" * 32_001)), "bad_request"),
        (json.dumps({"type": "prompt", "conversation": 7, "text": "hi"}), "bad_request"),
        (json.dumps(prompt("hi", "not-a-uuid")), "not_found"),
        (json.dumps(prompt("hi", "1b4e28ba-2fa1-11d2-883f-0016d3cca427")), "not_found"),
        (json.dumps({"type": "stop", "mid": "nope"}), "not_found"),
        (json.dumps({"type": "resume", "mid": "nope", "after": -1}), "not_found"),
        (json.dumps({"type": "resume", "mid": "x", "after": -2}), "bad_request"),
        (json.dumps({"type": "resume", "mid": "x", "after": "3"}), "bad_request"),
    ],
)
async def test_bad_frames_get_a_clear_error_and_the_socket_stays_usable(
    connect: Any, owner: Any, frame: str, code: str
) -> None:
    comm = await connect(owner)
    await comm.send_to(text_data=frame)
    error = await first_json(comm)
    assert error["type"] == "error"
    assert error["code"] == code
    assert error["message"]
    await comm.send_to(text_data=json.dumps(prompt("/echo still here")))
    assert (await receive_until_done(comm))["text"] == "still here"


async def test_someone_elses_conversation_is_not_found(
    connect: Any, owner: Any, other_user: Any
) -> None:
    theirs = await database_sync_to_async(Conversation.objects.create)(user=other_user)
    comm = await connect(owner)
    await comm.send_to(text_data=json.dumps(prompt("hi", str(theirs.id))))
    error = await first_json(comm)
    assert error["code"] == "not_found"
    assert await database_sync_to_async(Message.objects.count)() == 0


async def test_an_upstream_error_fails_the_answer_with_its_message(
    connect: Any, owner: Any
) -> None:
    comm = await connect(owner)
    await comm.send_to(text_data=json.dumps(prompt("/fail 500")))
    result = await receive_until_done(comm)
    assert result["done"]["status"] == "failed"
    # Plain words for the kind of failure; the model server's own text goes to the log only.
    assert result["done"]["error"] == SERVER_TROUBLE_MESSAGE
    assert "Retry" in result["html"][-1]
    message = await database_sync_to_async(Message.objects.get)(mid=result["done"]["mid"])
    assert message.status == "failed" and message.error == SERVER_TROUBLE_MESSAGE


async def test_a_dropped_upstream_keeps_the_partial_answer(connect: Any, owner: Any) -> None:
    comm = await connect(owner)
    await comm.send_to(text_data=json.dumps(prompt("/cut 7")))
    result = await receive_until_done(comm)
    assert result["done"]["status"] == "failed"
    assert result["text"], "the tokens before the drop were delivered"
    message = await database_sync_to_async(Message.objects.get)(mid=result["done"]["mid"])
    assert message.status == "failed"
    assert message.text == result["text"]
    # The prompt is kept too: nothing the user typed is lost.
    user_msg = await database_sync_to_async(
        Message.objects.filter(role="user", conversation_id=message.conversation_id).get
    )()
    assert user_msg.text == "/cut 7"


async def test_a_stalled_upstream_times_out_with_a_clear_message(
    connect: Any, owner: Any, settings: Any
) -> None:
    settings.LLM_READ_TIMEOUT = 0.3
    comm = await connect(owner)
    await comm.send_to(text_data=json.dumps(prompt("/stall 3")))
    result = await receive_until_done(comm)
    assert result["done"]["status"] == "failed"
    assert "took longer" in result["done"]["error"] or "time" in result["done"]["error"].lower()


async def test_stop_ends_a_long_answer_and_keeps_what_was_said(
    connect: Any, owner: Any, settings: Any, slow_demo_upstream: str
) -> None:
    settings.LLM_BASE_URL = slow_demo_upstream
    comm = await connect(owner)
    await comm.send_to(text_data=json.dumps(prompt("/long 5000")))
    shell = await comm.receive_from(timeout=10)
    mid = assistant_mid(shell)
    first = await first_json(comm)
    assert first["type"] == "chunk"
    await comm.send_to(text_data=json.dumps({"type": "stop", "mid": mid}))
    result = await receive_until_done(comm, mid, after=first["seq"])
    assert result["done"]["status"] == "stopped"
    message = await database_sync_to_async(Message.objects.get)(mid=mid)
    assert message.status == "stopped"
    assert message.text == first["text"] + result["text"]
    assert 0 < message.completion_tokens < 5000


async def test_a_dropped_socket_does_not_stop_the_answer_and_resume_completes_it(
    connect: Any, owner: Any, settings: Any, slow_demo_upstream: str
) -> None:
    settings.LLM_BASE_URL = slow_demo_upstream
    comm = await connect(owner)
    await comm.send_to(text_data=json.dumps(prompt("/long 400")))  # ~4 s at 100 tokens/s
    mid = assistant_mid(await comm.receive_from(timeout=10))
    seen: list[str] = []
    while len(seen) < 3:
        frame = await first_json(comm)
        if frame["type"] == "block":
            continue  # a paragraph of the answer, rendered: the text is in the chunks
        assert frame["seq"] == len(seen)
        seen.append(frame["text"])
    await comm.disconnect()  # the tab goes away mid-answer
    again = await connect(owner)
    await again.send_to(text_data=json.dumps({"type": "resume", "mid": mid, "after": 2}))
    rest = await receive_until_done(again, mid, after=2)
    message = await database_sync_to_async(Message.objects.get)(mid=mid)
    assert message.status == "complete"
    # Each character exactly once, in order: what we had plus what resume sent is the answer.
    assert rest["order"][0] == "chunk"
    assert "".join(seen) + rest["text"] == message.text
    assert len(message.text.split()) == 400


async def test_resume_of_a_finished_answer_sends_it_whole_then_done(
    connect: Any, owner: Any
) -> None:
    comm = await connect(owner)
    await comm.send_to(text_data=json.dumps(prompt("/echo all done")))
    done = (await receive_until_done(comm))["done"]
    await comm.send_to(text_data=json.dumps({"type": "resume", "mid": done["mid"], "after": -1}))
    html = await comm.receive_from(timeout=10)
    assert "all done" in html and 'data-status="complete"' in html
    again = json.loads(await comm.receive_from(timeout=10))
    assert again["type"] == "done" and again["status"] == "complete"
    assert again["seq"] == done["seq"]


async def test_a_finished_answer_resumed_brings_its_title_and_tokens_left(
    connect: Any, owner: Any, settings: Any
) -> None:
    # The new user's review: an answer that ended while the tab was offline came back
    # complete, but its title and the usage meter stayed stale: the `title` and `usage`
    # frames sent at its end went to no socket of that tab. A finished answer's resume (how
    # a tab comes back) now brings both.
    settings.CHAT_DAILY_TOKENS = 100_000
    comm = await connect(owner)
    await comm.send_to(text_data=json.dumps(prompt("/echo the answer")))
    ended = await receive_until_done(comm)
    mid, conversation = ended["done"]["mid"], conversation_of(ended)
    await comm.disconnect()
    await database_sync_to_async(Conversation.objects.filter(pk=conversation).update)(
        title="A title made while away"
    )
    back = await connect(owner, showing=conversation)
    await back.send_to(text_data=json.dumps({"type": "resume", "mid": mid, "after": -1}))
    final = await back.receive_from(timeout=10)
    assert "the answer" in final and 'data-status="complete"' in final
    assert json.loads(await back.receive_from(timeout=10))["type"] == "done"
    title = await back.receive_from(timeout=10)
    assert "A title made while away" in title and 'id="chat-title"' in title
    usage = json.loads(await back.receive_from(timeout=10))
    assert usage["type"] == "usage" and 0 < usage["tokens_left"] < 100_000


async def test_resume_of_another_users_answer_is_not_found(
    connect: Any, owner: Any, other_user: Any
) -> None:
    mine = await connect(owner)
    await mine.send_to(text_data=json.dumps(prompt("/echo private")))
    mid = (await receive_until_done(mine))["done"]["mid"]
    theirs = await connect(other_user)
    for frame in ({"type": "resume", "mid": mid, "after": -1}, {"type": "stop", "mid": mid}):
        await theirs.send_to(text_data=json.dumps(frame))
        error = await first_json(theirs)
        assert error["code"] == "not_found"


async def test_a_second_tab_sees_the_same_answer_live(
    connect: Any, owner: Any, settings: Any, slow_demo_upstream: str
) -> None:
    settings.LLM_BASE_URL = slow_demo_upstream
    first_tab = await connect(owner)
    await first_tab.send_to(text_data=json.dumps(prompt("/echo hello")))
    conversation = conversation_of(await receive_until_done(first_tab))
    second_tab = await connect(owner, showing=conversation)  # its page shows it
    await first_tab.send_to(text_data=json.dumps(prompt("/long 60", conversation)))
    # The other tab is told about the exchange, marked to be watched, and follows it.
    shell = await second_tab.receive_from(timeout=10)
    assert 'data-watch="1"' in shell
    mid = assistant_mid(shell)
    await second_tab.send_to(text_data=json.dumps({"type": "resume", "mid": mid, "after": -1}))
    theirs, ours = await asyncio.gather(
        receive_until_done(second_tab, mid), receive_until_done(first_tab, mid)
    )
    assert theirs["text"] == ours["text"]
    assert theirs["done"]["status"] == ours["done"]["status"] == "complete"


async def test_a_tab_showing_another_conversation_gets_only_what_its_list_needs(
    connect: Any, owner: Any
) -> None:
    # Every HTML fragment sent must find its target on the tab's page: htmx logs an error
    # (htmx:oobErrorNoTarget) for one that does not.
    first_tab = await connect(owner)
    await first_tab.send_to(text_data=json.dumps(prompt("/echo one")))
    elsewhere = await connect(owner, showing=conversation_of(await receive_until_done(first_tab)))
    new_chat = await connect(owner)  # a new chat: it shows no conversation

    # A new conversation, started in a third tab: the others list it, and get nothing else.
    third_tab = await connect(owner)
    await third_tab.send_to(text_data=json.dumps(prompt("/echo two")))
    second = conversation_of(await receive_until_done(third_tab))
    for tab in (elsewhere, new_chat):
        html = await tab.receive_from(timeout=10)
        assert 'hx-swap-oob="afterbegin:#conversation-list"' in html
        assert f'id="conv-{second}"' in html
        assert "#messages" not in html and "msg-assistant" not in html
        assert await tab.receive_nothing(timeout=0.3)

    # A turn in an existing conversation that a tab does not show: nothing at all for it.
    await third_tab.send_to(text_data=json.dumps(prompt("/echo three", second)))
    await receive_until_done(third_tab)
    assert await elsewhere.receive_nothing(timeout=0.5)
    assert await new_chat.receive_nothing(timeout=0.5)


async def test_a_logged_out_session_cannot_send_prompts(connect: Any, owner: Any) -> None:
    from django.contrib.sessions.models import Session

    comm = await connect(owner)
    await database_sync_to_async(Session.objects.all().delete)()  # logged out elsewhere
    await comm.send_to(text_data=json.dumps(prompt("/echo sneaky")))
    error = await first_json(comm)
    assert error["code"] == "unauthenticated"
    assert (await comm.receive_output(timeout=5))["type"] == "websocket.close"
    assert await database_sync_to_async(Message.objects.count)() == 0


async def test_resume_of_an_answer_whose_instance_died_shows_it_failed_with_its_text(
    connect: Any, owner: Any
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from chat import conversations as services

    def orphan() -> str:
        exchange = services.do_start_exchange(owner.pk, None, "hello", model="m", tier="full")
        services.do_checkpoint(exchange.answer.mid, "half an ans", 2)
        # Its instance died: nobody extends the lease any more.
        Message.objects.filter(mid=exchange.answer.mid).update(
            owner="web9", lease_until=timezone.now() - timedelta(seconds=1)
        )
        return exchange.answer.mid

    mid = await database_sync_to_async(orphan)()
    comm = await connect(owner)
    await comm.send_to(text_data=json.dumps({"type": "resume", "mid": mid, "after": -1}))
    html = await comm.receive_from(timeout=10)
    assert 'data-status="failed"' in html and "half an ans" in html
    done = json.loads(await comm.receive_from(timeout=10))
    assert done["type"] == "done" and done["status"] == "failed"
    assert "interrupted" in done["error"]


async def test_a_socket_whose_send_fails_is_closed_not_left_silent_and_the_answer_is_kept(
    connect: Any, owner: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from channels.generic.websocket import AsyncWebsocketConsumer

    comm = await connect(owner)
    original = AsyncWebsocketConsumer.send

    async def failing_send(self: Any, text_data: str | None = None, **kwargs: Any) -> None:
        if text_data and '"chunk"' in text_data:
            raise RuntimeError("the server's send broke")  # what daphne/autobahn may raise
        await original(self, text_data, **kwargs)

    monkeypatch.setattr(AsyncWebsocketConsumer, "send", failing_send)
    await comm.send_to(text_data=json.dumps(prompt("/echo kept anyway")))
    closed = None
    async with asyncio.timeout(10):
        while closed is None:
            output = await comm.receive_output(timeout=10)
            if output["type"] == "websocket.close":
                closed = output
    assert closed["code"] == 1011
    assert "socket send failed; closing it" in caplog.text

    def answer() -> Message:
        return Message.objects.filter(role="assistant").latest("id")

    for _ in range(200):  # the turn outlives its socket and saves its answer
        message = await database_sync_to_async(answer)()
        if message.status != "streaming":
            break
        await asyncio.sleep(0.05)
    assert message.status == "complete" and message.text == "kept anyway"


async def test_a_client_gone_while_we_send_is_one_info_line_not_an_error(
    connect: Any, owner: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The hostile review closed resuming tabs mid-replay: each logged an ERROR with a
    # traceback, so any user could flood the error log. autobahn raises Disconnected then.
    from autobahn.exception import Disconnected
    from channels.generic.websocket import AsyncWebsocketConsumer

    comm = await connect(owner)
    original = AsyncWebsocketConsumer.send

    async def gone(self: Any, text_data: str | None = None, **kwargs: Any) -> None:
        if text_data and '"chunk"' in text_data:
            raise Disconnected("Attempt to send on a closed protocol")
        await original(self, text_data, **kwargs)

    monkeypatch.setattr(AsyncWebsocketConsumer, "send", gone)
    caplog.set_level(logging.INFO, logger="chat.sockets.outbox")
    await comm.send_to(text_data=json.dumps(prompt("/echo kept anyway")))
    async with asyncio.timeout(10):
        while (await comm.receive_output(timeout=10))["type"] != "websocket.close":
            pass
    records = [r for r in caplog.records if r.name == "chat.sockets.outbox"]
    assert [r.levelno for r in records] == [logging.INFO]
    assert "closed by the client" in records[0].getMessage() and records[0].exc_info is None


async def test_a_turn_whose_database_trip_fails_still_sends_done(
    connect: Any, owner: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import chat.turns.turn

    def unreachable(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the database went away")  # what a broken connection would raise

    monkeypatch.setattr(chat.turns.turn, "_save_answer", unreachable)
    comm = await connect(owner)
    await comm.send_to(text_data=json.dumps(prompt("/echo still told")))
    result = await receive_until_done(comm)
    assert result["text"] == "still told" and result["done"]["status"] == "complete"
    assert "could not reach the database to finish" in caplog.text


def test_the_conversation_a_socket_shows_is_read_as_an_id_or_nothing() -> None:
    uid = "0b3e5d8e-5a4f-4c2e-9d0a-2f6f2d1c9a11"
    assert protocol.shown_conversation(f"conversation={uid}".encode()) == uid
    assert protocol.shown_conversation(f"conversation={uid.upper()}") == uid
    for junk in (b"", b"conversation=", b"conversation=%3Cscript%3E", b"x=1", b"conversation=1"):
        assert protocol.shown_conversation(junk) == ""


async def test_a_consumer_killed_while_the_orm_thread_works_lets_go_of_its_socket(
    connect: Any, owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Daphne kills an application that has not ended some seconds after its tab left; the
    consumer was then in `database_sync_to_async`, whose cancellation asgiref swallows (it waits
    for the thread and returns). The consumer went on forever: its socket still counted, its
    turns still fed it (hostile review: 24 dead sockets, an instance slow for 15 minutes).

    The slow ORM call is a stand-in (a sleep before the real check): a thread busy at the moment
    of the kill cannot be timed here otherwise."""
    from chat.sockets import consumers, draining

    real = consumers._checked_message

    def slow_check(*args: Any) -> Any:
        import time

        time.sleep(1.5)
        return real(*args)

    monkeypatch.setattr(consumers, "_checked_message", slow_check)
    comm = await connect(owner)
    assert len(draining.sockets) == 1
    await comm.send_to(text_data=json.dumps({"type": "stop", "mid": "1796000000000-vm-00"}))
    await asyncio.sleep(0.3)  # the stop's check is in the ORM thread now
    comm.future.cancel()  # what daphne does to an application that outstayed its close
    done, _ = await asyncio.wait([comm.future], timeout=10)
    assert done, "the consumer went on after it was killed"
    assert comm.future.cancelled()
    assert len(draining.sockets) == 0


async def test_a_prompt_longer_than_the_model_reads_is_refused_not_cut(
    connect: Any, owner: Any, settings: Any
) -> None:
    """Hostile review: with CHAT_MAX_PROMPT_CHARS (32,000) over LLM_CONTEXT_CHARS (24,000), a
    long prompt reached the model without its beginning, and nobody was told. The limit is the
    smaller of the two, said in the error and in the prompt box's maxlength."""
    from django.test import Client

    settings.CHAT_MAX_PROMPT_CHARS = 32_000
    settings.LLM_CONTEXT_CHARS = 1_000
    comm = await connect(owner)
    await comm.send_to(text_data=json.dumps(prompt("/echo " + "x" * 1_500)))
    frame = json.loads(await comm.receive_from(timeout=10))
    assert frame["type"] == "error" and frame["code"] == "bad_request"
    assert "the limit is 1,000" in frame["message"]
    assert await database_sync_to_async(Message.objects.count)() == 0

    def page() -> str:
        client = Client()
        client.force_login(owner)
        return client.get("/").content.decode()

    assert 'maxlength="1000"' in await database_sync_to_async(page)()
    await comm.send_to(text_data=json.dumps(prompt("/echo " + "x" * 900)))
    done = await receive_until_done(comm, timeout=15)
    assert done["text"] == "x" * 900
