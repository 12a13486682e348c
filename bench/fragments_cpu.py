"""Benchmark: the CPU of the server-rendered HTML a turn and a page write, alone — a new
exchange's frame (new conversation, for the asking tab and for another tab), a finished
answer's frame, a thread window of 50 messages, a sidebar of 50 conversations — on a migrated
SQLite file, with no server around it.

Usage: .venv/bin/python bench/fragments_cpu.py [--calls 200] [--rounds 5]
Prints CPU time per call (process time), best of the rounds: other work on the machine only
ever adds. The window's and the sidebar's queries run once, outside the timing. Not a test:
timings vary with the machine. docs/decisions/performance.md, *Bubbles, feedback and sidebar
entries without the template engine*, has the numbers before and after.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fragments-cpu-"))
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "chatsite.settings",
            "DJANGO_DEBUG": "0",
            "DJANGO_SECRET_KEY": "bench-only-not-a-secret-0123456789abcdefghijklmnop",
            "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
            "DATABASE_URL": f"sqlite:///{tmp / 'db.sqlite3'}",
        }
    )
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, check=True
    )
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.template.loader import render_to_string

    from bench.users import create
    from chat import branches, fragments
    from chat.models import Conversation, Message
    from chat.protocol import Prompt
    from chat.turns.start import _begin_exchange

    keys = create(1, "fragments")
    user = get_user_model().objects.get(username__startswith="fragments").pk

    def exchange(conversation: str = "") -> object:
        frame = Prompt(text="a question " * 5, conversation=conversation)
        begun = _begin_exchange(frame, user, keys[0], model="demo-full", tier="full")
        assert begun is not None
        found = begun[0]
        words = "word " * 80
        Message.objects.filter(mid=found.answer.mid).update(
            text=words,
            html=f"<p>{words}</p>",
            status="complete",
            prompt_tokens=10,
            completion_tokens=80,
        )
        return found

    first = exchange()
    finished = Message.objects.select_related("conversation").get(mid=first.answer.mid)  # type: ignore[attr-defined]
    conversation = Conversation.objects.get(pk=first.conversation.pk)  # type: ignore[attr-defined]
    for _ in range(24):
        exchange(str(conversation.pk))
    conversation.refresh_from_db()  # its leaf moved with each follow-up
    window = branches.window(conversation, size=50)
    for i in range(49):
        Conversation.objects.create(user_id=user, title=f"A conversation about topic {i}")
    sidebar = list(Conversation.objects.filter(user_id=user).order_by("-updated_at")[:50])

    def best(call: Callable[[], object]) -> float:
        times = []
        for _ in range(args.rounds):
            started = time.process_time()
            for _ in range(args.calls):
                call()
            times.append((time.process_time() - started) * 1000 / args.calls)
        return min(times)

    cases: dict[str, Callable[[], object]] = {
        "a new exchange's frame, new conversation, asking tab": lambda: fragments.exchange_html(
            first,  # type: ignore[arg-type]
            target="#messages",
            watch=False,
        ),
        "the same for another tab": lambda: fragments.exchange_html(
            first,  # type: ignore[arg-type]
            target="#messages",
            watch=True,
        ),
        "a finished answer's frame": lambda: fragments.final_html(
            finished, blocks=1, only_version=True
        ),
        f"a thread window of {len(window.entries)} messages": lambda: render_to_string(
            "chat/partials/thread.html", {"window": window, "conversation": conversation}
        ),
        f"a sidebar of {len(sidebar)} conversations": lambda: render_to_string(
            "chat/partials/conversation_list.html",
            {"conversations": sidebar, "current": str(conversation.pk)},
        ),
    }
    for name, call in cases.items():
        print(f"{name}: {best(call):.3f} ms CPU per call (best of {args.rounds})")


if __name__ == "__main__":
    main()
