"""Following an answer whose turn runs elsewhere (another instance) or died, through the log."""

from __future__ import annotations

import asyncio
import contextlib

from channels.db import database_sync_to_async
from django.conf import settings

from chat import fragments, protocol
from chat.models import Message
from chat.turns import reaper
from chat.turns.live_blocks import LiveBlocks
from chat.turns.streamlog import Chunk, StreamLogUnavailable, get_stream_log
from chat.turns.turn import Watcher

# Pauses between reads of a stream log that is unreachable (doubling from the first).
UNAVAILABLE_PAUSE_MIN = 0.1
UNAVAILABLE_PAUSE_MAX = 2.0


def _finished(mid: str) -> list[str] | None:
    """The final frames of `mid` once it is no longer streaming; None while it streams."""
    message = Message.objects.select_related("conversation").get(mid=mid)
    if message.status == Message.Status.STREAMING:
        return None
    return fragments.finished(message)


async def follow(mid: str, after: int, watcher: Watcher) -> None:
    """Push the chunks of `mid` after `after`, live, then its final frames; or say what failed.

    The database decides first, at the start, after every silent lease and after every failed
    read: an answer whose instance died (its lease ran out) is marked failed and shown as such,
    never followed forever. While the stream log is unreachable (Redis restarting or failing
    over) the follower waits and reads on from the last chunk it pushed; the answer's end comes
    from the database if the log never returns.

    The follower reads the log from the first chunk, whatever `after` is, and derives the
    answer's `block` frames from the text as the turn does (the same blocks: they depend on the
    text alone); it sends the chunks after `after` and every block (a tab ignores the blocks
    it has). The final HTML says how many blocks it joins when they are all it is.
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
                for frame in final:
                    watcher.push(frame)
                return
            try:
                async with contextlib.aclosing(
                    get_stream_log().read(mid, fed, block_ms=int(quiet * 1000))
                ) as stream:
                    while True:
                        entry = await asyncio.wait_for(anext(stream), quiet)
                        pause = 0.0
                        if isinstance(entry, Chunk):
                            if entry.seq <= fed:
                                continue
                            if entry.seq != fed + 1:
                                blocks.stop()  # a chunk is missing: its blocks cannot be known
                            fed = entry.seq
                            if entry.seq > after:
                                after = entry.seq
                                watcher.push(protocol.chunk(mid, entry.seq, entry.text))
                            for frame in await blocks.feed(entry.text):
                                watcher.push(frame)
                            continue
                        for frame in await blocks.finish():
                            watcher.push(frame)
                        message = await database_sync_to_async(
                            Message.objects.select_related("conversation").get
                        )(mid=mid)
                        joined = blocks.final_html is not None and blocks.text == message.text
                        count = blocks.count if joined else None
                        watcher.push(
                            await database_sync_to_async(fragments.final_html)(
                                message, blocks=count
                            )
                        )
                        watcher.push(protocol.dumps(entry.payload))
                        return
            except (StopAsyncIteration, TimeoutError):
                pass  # no log, or silent for a whole lease: look at the database again
            except StreamLogUnavailable:
                # The log's entry ids make reading on after `after` exact, whenever it returns.
                pause = min(max(pause * 2, UNAVAILABLE_PAUSE_MIN), UNAVAILABLE_PAUSE_MAX)
                await asyncio.sleep(pause)
    except Message.DoesNotExist:
        watcher.push(protocol.error("not_found", "That message was deleted.", mid=mid))
