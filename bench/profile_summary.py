"""A short text summary of py-spy's collapsed stacks (`--format raw`): where the samples are.

    python -m bench.profile_summary STACKS.txt > summary.txt

Shares are of the samples py-spy took while a thread was active (not waiting in epoll or on a
lock), per thread and in total: the top functions inclusive (anywhere on the stack) and self
(the innermost frame), and the chatsite functions inclusive, which is what a change to
chatsite can act on. Line numbers are dropped, so a function counts once per stack.
"""

from __future__ import annotations

import re
import sys
from collections import Counter

FRAME = re.compile(r"^(?P<name>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")
TOP = 30


def _frame(raw: str) -> str:
    match = FRAME.match(raw.strip())
    if not match:
        return raw.strip()
    path = match["file"]
    for marker in ("site-packages/", "lib/python3.11/", "/chat/", "/chatsite/", "/bench/"):
        if marker in path:
            tail = path.split(marker, 1)[1]
            path = (marker.strip("/") + "/" + tail) if marker.startswith("/") else tail
            break
    return f"{match['name']} ({path})"


def summarise(collapsed: str) -> str:
    total = 0
    threads: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = frames[0] if frames[0].startswith(("thread", "process")) else "?"
        frames = [f for f in frames if not f.startswith(("thread", "process"))]
        if not frames:
            continue
        names = [_frame(f) for f in frames]
        total += count
        threads[thread.split(" (")[0] + " " + _thread_kind(names)] += count
        for name in set(names):
            inclusive[name] += count
        own[names[-1]] += count
    if not total:
        return "no samples\n"

    def pct(n: int) -> str:
        return f"{100 * n / total:5.1f} %"

    lines = [f"samples (active threads only): {total}", "", "## threads"]
    lines += [f"{pct(n)}  {name}" for name, n in threads.most_common(8)]
    lines += ["", f"## top {TOP} inclusive"]
    lines += [f"{pct(n)}  {name}" for name, n in inclusive.most_common(TOP)]
    lines += ["", f"## top {TOP} self"]
    lines += [f"{pct(n)}  {name}" for name, n in own.most_common(TOP)]
    lines += ["", "## chatsite functions, inclusive"]
    ours = [(name, n) for name, n in inclusive.most_common() if "(chat/" in name]
    lines += [f"{pct(n)}  {name}" for name, n in ours[:40]]
    return "\n".join(lines) + "\n"


def _thread_kind(names: list[str]) -> str:
    """Which of daphne's threads a stack is on: the ORM executor or the event loop."""
    joined = ";".join(names)
    if "thread_handler" in joined or "_worker (concurrent/futures/thread.py)" in joined:
        return "(a worker thread: database_sync_to_async)"
    if "run_forever" in joined or "_run_once" in joined:
        return "(the event loop)"
    return ""


def main() -> None:
    with open(sys.argv[1]) as source:
        sys.stdout.write(summarise(source.read()))


if __name__ == "__main__":
    main()
