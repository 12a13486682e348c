"""Benchmark: a turn's work on the ORM thread, alone — start (session, exchange; a plain
exchange's bubbles are rendered off that thread, so not here) and finish (save, usage, final
frame) — on a migrated SQLite file, with no server around it.

Usage: .venv/bin/python bench/turn_orm.py [--turns 500] [--profile OUT.txt] [--database URL]
Prints CPU per turn (process time: both calls, as `database_sync_to_async` runs them) for a
new conversation and for a follow-up, and the wall-clock time the thread was busy with them
(on PostgreSQL it also waits for each statement's round trip, which process time does not
count, and the next turn's start waits for that too); `--profile` writes cProfile's top
functions. It is the
part of the turn that runs on the one thread every turn passes through (PITFALLS), measured
without the event loop's noise, to judge a change to it before the burst (bench/turn_cpu.py).
On a shared, loaded machine read the best round (as timeit does): other work only ever adds.
Not a test: timings vary with the machine.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", type=Path, default=None)
    parser.add_argument("--database", default="", help="a DATABASE_URL (default: a new SQLite)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="turn-orm-"))
    url = args.database or f"sqlite:///{tmp / 'db.sqlite3'}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "chatsite.settings",
        "DJANGO_DEBUG": "0",
        "DJANGO_SECRET_KEY": "bench-only-not-a-secret-0123456789abcdefghijklmnop",
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
        "DATABASE_URL": url,
    }
    # migrate is idempotent: a given database is brought up to date too
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=env,
        check=True,
    )
    os.environ.update(env)
    import django

    django.setup()
    from bench.users import create
    from chat.protocol import Prompt
    from chat.turns.saving import save_answer
    from chat.turns.start import _begin_exchange

    prefix = f"orm{time.time_ns()}-"
    user_count = min(args.turns, 200)
    keys = create(user_count, prefix)
    from django.contrib.auth import get_user_model

    ids = list(
        get_user_model()
        .objects.filter(username__startswith=prefix)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    answer = " ".join(f"word{i}" for i in range(50))

    def turn(i: int, conversation: str = "") -> str:
        user, key = ids[i % user_count], keys[i % user_count]
        frame = Prompt(text=f"question {i}", conversation=conversation)
        begun = _begin_exchange(frame, user, key, model="demo-full", tier="full")
        assert begun is not None
        exchange = begun[0]
        save_answer(
            exchange.answer.mid,
            dict(
                text=answer,
                html=f"<p>{answer}</p>",
                status="complete",
                error="",
                chunk_count=5,
                prompt_tokens=10,
                completion_tokens=50,
                usage_estimated=False,
                ttft_ms=100,
            ),
            usage=(user, "demo-full", "full", 10, 50),
            blocks=1,
            only_version=exchange.prompt is not None,  # as the turn says (chat/turns/start.py)
        )
        return str(exchange.conversation.id)

    turn(0)  # first use: templates, statements
    results = {}
    for name, follow_up in (("new conversation", False), ("follow-up", True)):
        per_turn, wall = [], []
        for _ in range(args.rounds):
            conversations = [turn(i) for i in range(user_count)] if follow_up else []
            started, started_wall = time.process_time(), time.perf_counter()
            for i in range(args.turns):
                turn(i, conversations[i % user_count] if follow_up else "")
            per_turn.append((time.process_time() - started) * 1000 / args.turns)
            wall.append((time.perf_counter() - started_wall) * 1000 / args.turns)
        results[name] = (per_turn, wall)
    for name, (per_turn, wall) in results.items():
        each = ", ".join(f"{v:.2f}" for v in per_turn)
        print(
            f"ORM thread CPU per turn, {name}: median {statistics.median(per_turn):.2f} ms, "
            f"best {min(per_turn):.2f} ms ({each}); wall median "
            f"{statistics.median(wall):.2f} ms, best {min(wall):.2f} ms"
        )
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        for i in range(args.turns):
            turn(i)
        profile.disable()
        out = io.StringIO()
        stats = pstats.Stats(profile, stream=out).strip_dirs()
        stats.sort_stats("cumulative").print_stats(45)
        stats.sort_stats("tottime").print_stats(30)
        args.profile.write_text(out.getvalue())


if __name__ == "__main__":
    main()
