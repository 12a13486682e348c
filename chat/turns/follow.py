"""Following an answer whose turn runs elsewhere (another instance) or died, through the log."""

from __future__ import annotations

import asyncio
import contextlib
import itertools

from channels.db import database_sync_to_async
from django.conf import settings

from chat import fragments, protocol
from chat.models import Message
from chat.turns import reaper
from chat.turns.feed import Feed
from chat.turns.live_blocks import LiveBlocks
from chat.turns.streamlog import Chunk, StreamLogUnavailable, get_stream_log

# Pauses between reads of a stream log that is unreachable (doubling from the first).
UNAVAILABLE_PAUSE_MIN = 0.1
UNAVAILABLE_PAUSE_MAX = 2.0
# Log entries read in a row before the follower lets the event loop serve the others: a long
# answer's backlog (thousands of chunks) then reaches its tabs' outboxes a slice at a time, which
# their senders empty in between, and never holds the loop for the whole answer.
ENTRIES_PER_TURN = 64


def _finished(mid: str) -> list[str] | None:
    """The final frames of `mid` once it is no longer streaming; None while it streams."""
    message = Message.objects.select_related("conversation").get(mid=mid)
    if message.status == Message.Status.STREAMING:
        return None
    return fragments.finished(message)


async def follow(mid: str, feed: Feed) -> None:
    """Feed the chunks of `mid` from its first, live, then its final frames; or say what failed.

    The database decides first, at the start, after every silent lease and after every failed
    read: an answer whose instance died (its lease ran out) is marked failed and shown as such,
    never followed forever. While the stream log is unreachable (Redis restarting or failing
    over) the follower waits and reads on from the last chunk it pushed; the answer's end comes
    from the database if the log never returns.

    The follower reads the log from the first chunk and derives the answer's `block` frames
    from the text as the turn does (the same blocks: they depend on the text alone). The final
    HTML says how many blocks it joins when they are all it is. One follower serves every tab
    of the process (chat/turns/mirror.py): each block is rendered once however often tabs resume.
    """
    blocks = LiveBlocks(mid)
    fed = -1  # the last chunk fed to the renderer
    quiet = settings.CHAT_LEASE_SECONDS
    pause = 0.0
    try:
        while True:
            await reaper.reap(mid=mid)
            final = await database_sync_to_async(_finished)(mid)
            if final is not None:
                feed.end(final)
                return
            try:
                async with contextlib.aclosing(
                    get_stream_log().read(mid, fed, block_ms=int(quiet * 1000))
                ) as stream:
                    for read in itertools.count(1):
                        entry = await asyncio.wait_for(anext(stream), quiet)
                        pause = 0.0
                        if read % ENTRIES_PER_TURN == 0:
                            await asyncio.sleep(0)
                        if isinstance(entry, Chunk):
                            if entry.seq <= fed:
                                continue
                            if entry.seq != fed + 1:
                                blocks.stop()  # a chunk is missing: its blocks cannot be known
                            fed = entry.seq
                            feed.add_chunk(entry.seq, entry.text)
                            feed.add_blocks(await blocks.feed(entry.text))
                            continue
                        feed.add_blocks(await blocks.finish())
                        message = await database_sync_to_async(
                            Message.objects.select_related("conversation").get
                        )(mid=mid)
                        joined = blocks.final_html is not None and blocks.text == message.text
                        count = blocks.count if joined else None
                        html = await database_sync_to_async(fragments.final_html)(
                            message, blocks=count
                        )
                        feed.end([html, protocol.dumps(entry.payload)])
                        return
            except (StopAsyncIteration, TimeoutError):
                pass  # no log, or silent for a whole lease: look at the database again
            except StreamLogUnavailable:
                # The log's entry ids make reading on after `fed` exact, whenever it returns.
                pause = min(max(pause * 2, UNAVAILABLE_PAUSE_MIN), UNAVAILABLE_PAUSE_MAX)
                await asyncio.sleep(pause)
    except Message.DoesNotExist:
        feed.end([protocol.error("not_found", "That message was deleted.", mid=mid)])
