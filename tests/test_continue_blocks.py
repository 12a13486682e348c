"""Continue and live rendering (issues 15 and 17.3): an answer stopped mid-paragraph goes on in
the same paragraph. The continuation's blocks are those of the whole answer's text, so the
blocks a tab is shown (its shell's, then the block frames) join into the stored HTML exactly,
and no block ends where the answer was stopped.

Through the real ASGI app and the demo model over HTTP, as tests/test_continue.py does.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

import pytest
from channels.db import database_sync_to_async

from chat.demo_upstream import long_tokens
from chat.models import Message
from chat.rendering import render_markdown
from tests.conftest import assistant_mid, receive_until_done
from tests.test_live_blocks import body_of, check_blocks, collect

pytestmark = pytest.mark.usefixtures("chat_settings")

SHELL_BODY = re.compile(
    r'<div class="body markdown" data-placed="(\d+)" data-end="(\d+)" data-open="([^"]*)"'
    r' aria-busy="true">(.*?)</div>\s*<div class="msg-footer">',
    re.S,
)


def frame(kind: str, **fields: Any) -> str:
    return json.dumps({"type": kind, **fields})


async def stopped_mid_paragraph(comm: Any, blocks: int = 0) -> tuple[str, str, int]:
    """Ask for a long answer and stop it (after `blocks` blocks); again if the stop fell on a
    paragraph's end (rare: the test is about a paragraph the stop cuts). Its mid, its text and
    its `done.seq`."""
    for _ in range(5):
        await comm.send_to(text_data=frame("prompt", conversation="", text="/long 400"))
        shell = await comm.receive_from(timeout=10)
        while "msg-assistant" not in shell:  # the last try's title, or its tokens left
            shell = await comm.receive_from(timeout=10)
        mid = assistant_mid(shell)
        made, last = 0, -1
        while True:  # a few chunks in, so there is text before the stop
            raw = await comm.receive_from(timeout=10)
            sent = json.loads(raw) if raw.startswith("{") else {}
            made += sent.get("type") == "block"
            last = sent.get("seq", last) if sent.get("type") == "chunk" else last
            if last >= 3 and made >= blocks:
                break
        await comm.send_to(text_data=frame("stop", mid=mid))
        stopped = await receive_until_done(comm, mid, after=last)
        assert stopped["done"]["status"] == "stopped"
        text = (await database_sync_to_async(Message.objects.get)(mid=mid)).text
        if not text.endswith("\n"):
            return mid, text, stopped["done"]["seq"]
    raise AssertionError("five answers in a row stopped at a paragraph's end")


async def test_a_continued_paragraph_is_one_block_in_the_frames_and_in_the_stored_html(
    connect: Any, owner: Any, settings: Any, slow_demo_upstream: str
) -> None:
    settings.LLM_BASE_URL = slow_demo_upstream
    comm = await connect(owner)
    mid, old, base = await stopped_mid_paragraph(comm)

    await comm.send_to(text_data=frame("continue", mid=mid))
    shell = await comm.receive_from(timeout=10)
    assert f'data-next="{base}"' in shell
    match = SHELL_BODY.search(shell)
    assert match, shell
    placed, end = int(match.group(1)), int(match.group(2))
    open_text = json.loads(html.unescape(match.group(3)))
    shown = match.group(4)
    # The shell shows the earlier text's final blocks; the paragraph the stop cut is still open.
    assert old[:end] + open_text == old
    assert open_text and "\n\n" not in open_text.rstrip("\n")
    assert shown == render_markdown(old[:end]) if end else shown == ""

    # Another tab resumes the whole answer meanwhile (from the turn: every block from 0).
    other = await connect(owner)
    await other.send_to(text_data=frame("resume", mid=mid, after=-1))
    asking = await collect(comm, mid)
    resumed = await collect(other, mid)

    saved = await database_sync_to_async(Message.objects.get)(mid=mid)
    assert saved.status == "complete" and saved.text == "".join(long_tokens(400))
    assert saved.text.startswith(old)
    # The asking tab: its shell's blocks, then the block frames from `placed` on.
    assert [b["index"] for b in asking["blocks"]] == list(
        range(placed, placed + len(asking["blocks"]))
    )
    assert asking["blocks"][0]["start"] == end
    assert shown + "".join(b["html"] for b in asking["blocks"]) == saved.html
    # The tab that resumed: every block, adding up to the same HTML.
    assert check_blocks(resumed["blocks"], saved.text) == saved.html
    assert resumed["blocks"][placed:] == asking["blocks"]
    # The stored HTML is the whole text rendered at once: the blocks are the whole text's.
    assert saved.html == render_markdown(saved.text)

    # No block boundary where the answer was stopped: one block covers the cut sentence, and
    # its HTML holds the words on both sides of the stop in one paragraph.
    cut = len(old)
    around = [b for b in resumed["blocks"] if b["start"] < cut < b["end"]]
    assert len(around) == 1, [(b["start"], b["end"]) for b in resumed["blocks"]]
    assert all(b["end"] != cut for b in resumed["blocks"])
    before, after = old.split()[-1], saved.text[cut:].split()[0]
    paragraph = around[0]["html"]
    assert paragraph.startswith("<p>") and paragraph.count("<p>") == 1
    assert re.search(rf"{re.escape(before)}\s+{re.escape(after)}", paragraph)

    # Both final frames say the body is exactly the blocks: a tab keeps what it showed.
    total = str(placed + len(asking["blocks"]))
    assert body_of(asking["html"][-1])[0] == total
    assert body_of(resumed["html"][-1])[0] == total


async def test_another_tab_showing_the_answer_goes_on_from_what_it_shows(
    connect: Any, owner: Any, settings: Any, slow_demo_upstream: str
) -> None:
    """New-user review: another tab showing the conversation got the continued answer's shell
    empty and refilled it from seq 0, so the answer it showed vanished for a moment. It now
    gets the asking tab's shell (the earlier text's blocks and its open block, from the stored
    HTML and the event, with no rendering) and goes on from the earlier `done.seq`."""
    settings.LLM_BASE_URL = slow_demo_upstream
    comm = await connect(owner)
    mid, old, base = await stopped_mid_paragraph(comm, blocks=1)
    saved = await database_sync_to_async(Message.objects.get)(mid=mid)
    other = await connect(owner, showing=str(saved.conversation_id))

    await comm.send_to(text_data=frame("continue", mid=mid))
    asked = await comm.receive_from(timeout=10)
    shell = ""
    while f'id="msg-{mid}"' not in shell:
        shell = await other.receive_from(timeout=10)
    assert 'data-watch="1"' in shell and 'data-status="streaming"' in shell
    assert f'data-next="{base}"' in shell  # it goes on from what it has: not from seq 0
    mine, theirs = SHELL_BODY.search(asked), SHELL_BODY.search(shell)
    assert mine and theirs, shell
    assert theirs.groups() == mine.groups()  # the same blocks shown, the same open text
    placed, shown = int(theirs.group(1)), theirs.group(4)
    assert shown  # it keeps showing the earlier text's blocks

    # As the page does: resume from the shell's `data-next`.
    await other.send_to(text_data=frame("resume", mid=mid, after=base - 1))
    resumed = await collect(other, mid)
    await collect(comm, mid)
    saved = await database_sync_to_async(Message.objects.get)(mid=mid)
    assert saved.status == "complete" and saved.text.startswith(old)
    assert min(resumed["chunks"]) == base
    assert old + resumed["text"] == saved.text
    new_blocks = [b for b in resumed["blocks"] if b["index"] >= placed]
    assert shown + "".join(b["html"] for b in new_blocks) == saved.html
