"""What the tabs of this process are shown of one streaming answer: its chunks, its blocks and its
end, replayed to a tab that attaches (in few frames, made as they are sent) and pushed live to
every tab attached. A turn (chat/turns/turn.py) and a mirror of a turn elsewhere
(chat/turns/mirror.py) are feeds.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Protocol

from chat import protocol

# A replay sends the blocks a tab may lack in `blocks` frames of about this many bytes each, not
# one `block` frame per block: an answer of thousands of one-line headings is a handful of
# frames (hostile review: one frame per block overflowed the socket's outbox at ~2,000 blocks
# and closed the tab with 4408 on every resume).
REPLAY_BLOCKS_BYTES = 256 * 1024
# Live, a chunk that completes more blocks than this sends them as a replay does (a fast model's
# chunk may complete thousands of one-line blocks at once); fewer go as `block` frames.
LIVE_BLOCKS_ALONE = 16


class Watcher(Protocol):
    """Something that shows an answer: a socket. Neither method may block (they queue)."""

    def push(self, frame: str) -> None: ...

    def push_replay(self, frames: Iterator[str]) -> None:
        """Queue frames that are made as they are sent: one place in the queue, however many."""


class Feed:
    """One answer's frames so far, for the tabs of this process that show it."""

    def __init__(self, mid: str) -> None:
        self.mid = mid
        self.chunks: list[str] = []  # by seq
        self.holes: set[int] = set()  # seqs below len(chunks) that this feed never got
        self.block_frames: list[str] = []  # by index
        self.final_frames: list[str] | None = None
        # The tabs attached, each with the last seq it has: a mirror still reading its log
        # must not send a tab that resumed after seq n the chunks up to n again.
        self.watchers: dict[Watcher, int] = {}

    def attach(self, watcher: Watcher, after: int, first_block: int = 0) -> None:
        """Replay the chunks after `after` and the blocks from `first_block` (a tab ignores the
        blocks it has), then the end or the live frames: the replay's bounds are taken now and
        every later frame is queued behind it, so there is no seam."""
        seqs = range(after + 1, len(self.chunks))
        indices = range(first_block, len(self.block_frames))
        if seqs or indices:
            watcher.push_replay(
                replayed(
                    self.mid,
                    self.chunks,
                    seqs,
                    frozenset(self.holes),
                    self.block_frames,
                    indices,
                )
            )
        if self.final_frames is not None:
            for frame in self.final_frames:
                watcher.push(frame)
        else:
            self.watchers[watcher] = after

    def detach(self, watcher: Watcher) -> None:
        self.watchers.pop(watcher, None)

    def add_chunk(self, seq: int, text: str) -> None:
        """Chunk `seq` (the next, or one after a gap) to every tab."""
        if seq > len(self.chunks):
            self.holes.update(range(len(self.chunks), seq))
            self.chunks.extend([""] * (seq - len(self.chunks)))
        self.chunks.append(text)
        self.send_chunk(seq, text)

    def send_chunk(self, seq: int, text: str) -> None:
        """Chunk `seq` to every tab that does not have it."""
        frame = protocol.chunk(self.mid, seq, text)
        for watcher, after in self.watchers.items():
            if seq > after:
                watcher.push(frame)

    def add_blocks(self, frames: list[str]) -> None:
        """Blocks made final by one chunk, to every tab: `block` frames, or `blocks` frames for
        many."""
        first = len(self.block_frames)
        self.block_frames.extend(frames)
        if len(frames) <= LIVE_BLOCKS_ALONE:
            for frame in frames:
                self.send(frame)
            return
        for watcher in self.watchers:
            watcher.push_replay(
                replayed(
                    self.mid,
                    (),
                    range(0),
                    frozenset(),
                    self.block_frames,
                    range(first, len(self.block_frames)),
                )
            )

    def end(self, frames: list[str]) -> None:
        """The answer's last frames (its final HTML and `done`, or an error) to every tab."""
        self.final_frames = frames
        for watcher in self.watchers:
            for frame in frames:
                watcher.push(frame)
        self.watchers.clear()

    def send(self, frame: str) -> None:
        for watcher in self.watchers:
            watcher.push(frame)


def replayed(
    mid: str,
    chunks: Sequence[str],
    seqs: range,
    holes: frozenset[int],
    blocks: Sequence[str],
    indices: range,
) -> Iterator[str]:
    """The frames of a replay, made one by one as the socket sends them (lists only grow)."""
    for seq in seqs:
        if seq not in holes:
            yield protocol.chunk(mid, seq, chunks[seq])
    batch: list[str] = []
    size = 0
    for frame in itertools.islice(blocks, indices.start, indices.stop):
        if batch and size + len(frame) > REPLAY_BLOCKS_BYTES:
            yield protocol.blocks(mid, batch) if len(batch) > 1 else batch[0]
            batch, size = [], 0
        batch.append(frame)
        size += len(frame)
    if len(batch) == 1:
        yield batch[0]
    elif batch:
        yield protocol.blocks(mid, batch)
