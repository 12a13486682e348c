"""The `block` frames of a streaming answer (issue 15): sent once each, the same for every tab.

Through the real ASGI app and the demo model over HTTP: the tab that asked, a tab that resumes
mid-answer on this instance (from the turn), a tab that follows through the stream log (as on
another instance), and a reload (the stored HTML) all get the same blocks, and the final HTML
is exactly those blocks joined, which the final frame says in `data-blocks`.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async

from chat import protocol
from chat.models import Message
from chat.rendering import render_markdown
from chat.turns.feed import Feed
from chat.turns.follow import follow
from chat.turns.live_blocks import INLINE_MAX_CHARS, LiveBlocks
from tests.conftest import assistant_mid

pytestmark = pytest.mark.usefixtures("chat_settings")

ANSWER = (
    "# Plan\n\nSome **bold** words and `code`, with $x^2$.\n\n"
    "- one\n- two\n- three\n\n"
    "```python\ndef f(x):\n    return x * 2\n```\n\n"
    "$$\\frac{a}{b}$$\n\n"
    "> a quote\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nThe end."
)


def prompt(text: str) -> str:
    return json.dumps({"type": "prompt", "conversation": "", "text": text})


async def collect(comm: Any, mid: str | None = None) -> dict[str, Any]:
    """Every frame of one answer until its `done`: chunks, blocks, the final HTML, done."""
    chunks: dict[int, str] = {}
    blocks: list[dict[str, Any]] = []
    html: list[str] = []
    while True:
        raw = await comm.receive_from(timeout=20)
        if not raw.startswith("{"):
            html.append(raw)
            continue
        frame = json.loads(raw)
        if mid is not None and frame.get("mid") not in (None, mid):
            continue
        if frame["type"] == "chunk":
            chunks[frame["seq"]] = frame["text"]
        elif frame["type"] == "block":
            blocks.append(frame)
        elif frame["type"] == "blocks":  # a resume's replay
            blocks.extend(frame["blocks"])
        elif frame["type"] == "done":
            text = "".join(chunks[i] for i in sorted(chunks))
            return {"chunks": chunks, "text": text, "blocks": blocks, "html": html, "done": frame}


def body_of(final_frame: str) -> tuple[str | None, str]:
    """The `data-blocks` of the answer's body in a final frame, and the body's inner HTML.

    The shape is relied on: the page (answers.js `withoutKeptBodies`) cuts a kept body's content
    out of the frame from its opening tag to the last `</div>` before the footer, so nothing may
    stand between the body and the footer."""
    match = re.search(
        r'<div class="body markdown"(?: data-blocks="(\d+)")? aria-busy="false">(.*?)</div>\s*'
        r'<div class="msg-footer">',
        final_frame,
        re.S,
    )
    assert match, final_frame
    return match.group(1), match.group(2)


def check_blocks(blocks: list[dict[str, Any]], text: str) -> str:
    """Indices 0, 1, 2 …, each starting where the one before ended; return their HTML joined."""
    assert [b["index"] for b in blocks] == list(range(len(blocks)))
    position = 0
    for block in blocks:
        assert block["start"] == position
        assert block["end"] > block["start"]
        position = block["end"]
    assert text[position:].strip() == ""  # only blank lines after the last block
    return "".join(b["html"] for b in blocks)


async def test_an_answer_streams_as_blocks_that_add_up_to_its_final_html(
    connect: Any, owner: Any
) -> None:
    comm = await connect(owner)
    await comm.send_to(text_data=prompt("/echo " + ANSWER))
    result = await collect(comm)
    assert result["text"] == ANSWER
    joined = check_blocks(result["blocks"], ANSWER)
    assert len(result["blocks"]) == 8  # heading, paragraph, list, code, math, quote, table, end
    assert joined == render_markdown(ANSWER)
    count, body = body_of(result["html"][-1])
    assert count == str(len(result["blocks"]))
    # A reload shows the stored HTML: the same as the blocks the tab was sent.
    message = await database_sync_to_async(Message.objects.get)(mid=result["done"]["mid"])
    assert message.html == joined
    assert body.strip() == joined.strip()


async def test_each_block_is_sent_once_and_after_the_chunk_that_completes_it(
    connect: Any, owner: Any, settings: Any
) -> None:
    settings.CHAT_COALESCE_MS = 0  # a chunk per token
    comm = await connect(owner)
    await comm.send_to(text_data=prompt("/echo " + ANSWER))
    received = 0
    frames: list[dict[str, Any]] = []
    while True:
        raw = await comm.receive_from(timeout=20)
        if raw.startswith("{"):
            frame = json.loads(raw)
            frames.append(frame)
            if frame["type"] == "done":
                break
    for frame in frames:
        if frame["type"] == "chunk":
            received += len(frame["text"])
        elif frame["type"] == "block":
            # A block covers only text the tab has already been sent.
            assert frame["end"] <= received
    indices = [f["index"] for f in frames if f["type"] == "block"]
    assert indices == sorted(set(indices))


async def test_a_tab_that_resumes_mid_answer_gets_the_same_blocks(
    connect: Any, owner: Any, settings: Any, slow_demo_upstream: str
) -> None:
    settings.LLM_BASE_URL = slow_demo_upstream
    text = "\n\n".join(f"## Part {i}\n\n- a **{i}**\n- b\n- c" for i in range(12))
    first = await connect(owner)
    await first.send_to(text_data=prompt("/echo " + text))
    mid = assistant_mid(await first.receive_from(timeout=10))
    # Wait for a block or two, then another tab asks from the start and one from the middle.
    seen = 0
    while seen < 2:
        frame = json.loads(await first.receive_from(timeout=10))
        seen += frame["type"] == "block"
    second = await connect(owner)
    await second.send_to(text_data=json.dumps({"type": "resume", "mid": mid, "after": -1}))
    third = await connect(owner)
    await third.send_to(text_data=json.dumps({"type": "resume", "mid": mid, "after": 3}))
    whole = await collect(first, mid)
    resumed = await collect(second, mid)
    middle = await collect(third, mid)
    message = await database_sync_to_async(Message.objects.get)(mid=mid)
    assert message.text == text
    assert resumed["text"] == text
    assert sorted(middle["chunks"]) == list(range(4, resumed["done"]["seq"]))
    everything = [b for b in resumed["blocks"]]
    # The first tab saw the first blocks before `collect` started: compare from its first.
    assert everything[-len(whole["blocks"]) :] == whole["blocks"]
    assert middle["blocks"] == everything
    assert check_blocks(everything, text) == message.html
    for result in (resumed, middle):
        assert body_of(result["html"][-1])[0] == str(len(everything))


class Tab:
    """A watcher that keeps what it is pushed (what a socket's outbox would send)."""

    def __init__(self) -> None:
        self.frames: list[str] = []

    def push(self, frame: str) -> None:
        self.frames.append(frame)

    def push_replay(self, frames: Iterator[str]) -> None:
        self.frames.extend(frames)

    def json(self, kind: str) -> list[dict[str, Any]]:
        found = []
        for f in map(json.loads, filter(lambda r: r.startswith("{"), self.frames)):
            if f["type"] == kind:
                found.append(f)
            elif f["type"] == "blocks" and kind == "block":
                found.extend(f["blocks"])
        return found


async def test_a_follower_through_the_stream_log_derives_the_same_blocks(
    connect: Any, owner: Any, settings: Any, slow_demo_upstream: str
) -> None:
    # `follow` is what a tab on another instance runs: it reads the stream log, never the turn.
    settings.LLM_BASE_URL = slow_demo_upstream
    comm = await connect(owner)
    await comm.send_to(text_data=prompt("/echo " + ANSWER))
    mid = assistant_mid(await comm.receive_from(timeout=10))
    follower, late = Tab(), Tab()
    await asyncio.sleep(0.3)  # a few chunks in
    feed, ended = Feed(mid), Feed(mid)
    feed.attach(follower, -1)
    following = asyncio.create_task(follow(mid, feed))
    asked = await collect(comm, mid)
    await asyncio.wait_for(following, 20)
    await follow(mid, ended)  # after the end: the final frames from the database
    ended.attach(late, 2)
    assert follower.json("block") == asked["blocks"]
    assert "".join(c["text"] for c in follower.json("chunk")) == ANSWER
    assert body_of(follower.frames[-2])[0] == str(len(asked["blocks"]))
    assert late.json("block") == []  # nothing to derive: the final HTML is the answer
    assert body_of(late.frames[-2])[0] is None


async def test_a_reference_definition_makes_the_answer_end_with_one_whole_swap(
    connect: Any, owner: Any
) -> None:
    text = "See [the docs][d].\n\n- a\n- b\n\n[d]: https://example.com/docs\n"
    comm = await connect(owner)
    await comm.send_to(text_data=prompt("/echo " + text))
    result = await collect(comm)
    count, body = body_of(result["html"][-1])
    assert count is None  # the blocks joined are not the answer: the page swaps it whole
    assert 'href="https://example.com/docs"' in body
    assert "example.com" not in "".join(b["html"] for b in result["blocks"])


async def test_a_large_block_is_rendered_off_the_event_loop_in_order() -> None:
    sent: list[str] = []
    blocks = LiveBlocks("m1", sent.extend)
    code = "```python\n" + "x = 1\n" * (INLINE_MAX_CHARS // 6 + 10)
    assert blocks.inline("# Title\n")
    blocks.push("# Title\n")
    assert not blocks.inline(code)  # over 4,000 characters with line breaks: a worker's
    blocks.push(code)
    blocks.push("```\n")  # behind the worker, in order, though it is small
    blocks.push("after\n\n")
    blocks.push("the end")
    await blocks.finish()
    frames = [json.loads(f) for f in sent]
    assert [f["index"] for f in frames] == [0, 1, 2, 3]
    assert blocks.final_html == "".join(f["html"] for f in frames)
    assert blocks.final_html == render_markdown(blocks.text)


@pytest.mark.parametrize(
    "formula",
    [
        "$$\\begin{matrix}" + "a&" * 1800 + "b\\end{matrix}$$\n\n",  # 100 ms on the loop
        "$$" + "\\frac{" * 300 + "1" + "}{2}" * 300 + "$$\n\n",
        "Some prose " + "\\(x^{2}\\) " * 300 + "\n\n",
        "$a$ " * 45 + "\n\n",  # 180 characters, 45 formulas: ~50 ms
    ],
)
async def test_a_block_with_math_is_rendered_off_the_event_loop(formula: str) -> None:
    """Hostile review: a math block just under INLINE_MAX_CHARS was rendered on the event
    loop, holding every socket of the process for up to ~100 ms per block (~1 ms a formula).
    Fed as a model streams it (20 characters a chunk), no chunk that completes a line of a
    block with math is rendered on the loop; plain prose of the same size is."""
    assert len(formula) < INLINE_MAX_CHARS
    prose = "word " * (len(formula) // 5) + "\n\n"
    for text, math in ((formula, True), (prose, False)):
        sent: list[str] = []
        blocks = LiveBlocks("m", sent.extend)
        on_loop = []
        for i in range(0, len(text), 20):
            chunk = text[i : i + 20]
            if ("\n" in chunk) and blocks.inline(chunk):
                on_loop.append(blocks._renderer.open_chars if blocks._renderer else 0)
            blocks.push(chunk)
        await blocks.finish()
        assert [json.loads(f)["index"] for f in sent] == [0]
        if math:
            assert on_loop == []
        else:
            assert on_loop  # the control: prose is rendered on the loop


async def test_a_renderer_that_fails_makes_the_answer_end_with_one_swap(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    blocks = LiveBlocks("m2")
    assert await blocks.feed("# One\n") != []

    def broken(text: str) -> list[Any]:
        raise RuntimeError("a bug in the renderer")

    monkeypatch.setattr(blocks._renderer, "feed", broken)
    assert await blocks.feed("## Two\n") == []
    assert await blocks.finish() == []
    assert blocks.final_html is None
    assert "live rendering of m2 failed" in caplog.text


def test_a_block_frame_names_its_answer_place_and_html() -> None:
    frame = json.loads(protocol.block("m", 2, 10, 20, "<p>x</p>"))
    assert frame == {"type": "block", "mid": "m", "index": 2, "start": 10, "end": 20,
                     "html": "<p>x</p>"}  # fmt: skip
