"""Benchmark: a long conversation's page, prompt, regeneration and version switch (issue 13,
finding 17), on a fresh database: the default SQLite file in a temporary directory, or
DATABASE_URL (a database this may fill and leave behind).

Usage: .venv/bin/python bench/thread_paging.py [--messages 10000] [--runs 5]
Prints a Markdown table; docs/decisions/thread-paging.md quotes it. Not a test: timings vary
with the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
os.environ.setdefault("DJANGO_SECRET_KEY", "bench-only-not-a-secret")
os.environ.setdefault("DJANGO_SECURE", "0")
os.environ.setdefault("DJANGO_ALLOWED_HOSTS", "testserver")
if "DATABASE_URL" not in os.environ:
    os.environ["DATABASE_URL"] = f"sqlite:///{tempfile.mkdtemp(prefix='paging-')}/bench.sqlite3"

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import Client  # noqa: E402

from chat import branches  # noqa: E402
from chat import conversations as services  # noqa: E402
from chat.fragments import exchange_html  # noqa: E402
from chat.models import Message  # noqa: E402
from tests.long_conversation import long_conversation, text_of  # noqa: E402


def timed(runs: int, work: object) -> tuple[float, object]:
    samples, result = [], None
    for _ in range(runs):
        start = time.perf_counter()
        result = work()  # type: ignore[operator]
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples), result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user(f"bench{time.time_ns()}", password="x")
    conversation = long_conversation(user, args.messages)
    client = Client()
    client.force_login(user)
    rows = []

    ms, response = timed(args.runs, lambda: client.get(f"/c/{conversation.id}/"))
    rows.append(("page load (window of 50)", ms, len(response.content)))  # type: ignore[attr-defined]
    first = Message.objects.filter(conversation=conversation).order_by("-id")[49]
    ms, response = timed(
        args.runs,
        lambda: client.get(f"/c/{conversation.id}/messages/", {"before": first.mid}),
    )
    rows.append(("load earlier (50)", ms, len(response.content)))  # type: ignore[attr-defined]

    def prompt() -> str:
        exchange = services.do_start_exchange(
            user.pk, str(conversation.id), "next question", model="m", tier="full"
        )
        services.do_finish_message(
            exchange.answer.mid,
            text="an answer",
            status="complete",
            error="",
            chunk_count=1,
            prompt_tokens=1,
            completion_tokens=1,
            usage_estimated=False,
            ttft_ms=1,
        )
        prompt.last = exchange.answer.mid  # type: ignore[attr-defined]
        return exchange_html(exchange, target="#messages", watch=False)

    ms, frame = timed(args.runs, prompt)
    rows.append(("prompt: store, history, frame", ms, len(str(frame))))

    def regenerate() -> str:
        exchange = services.do_regenerate(user.pk, prompt.last, model="m", tier="full")  # type: ignore[attr-defined]
        return exchange_html(exchange, target="#messages", watch=False)

    ms, frame = timed(1, regenerate)
    rows.append(("regenerate: store, history, frame", ms, len(str(frame))))

    conversation.refresh_from_db()
    deep = Message.objects.get(conversation=conversation, text=text_of(args.messages // 2))
    ms, _ = timed(
        1,
        lambda: services.do_start_exchange(
            user.pk, str(conversation.id), "edited", model="m", tier="full", replaces=deep.mid
        ),
    )
    rows.append((f"edit message {args.messages // 2} (on-branch walk)", ms, 0))
    csrf = Client()
    csrf.force_login(user)
    ms, response = timed(1, lambda: csrf.post(f"/c/{conversation.id}/versions/{deep.mid}/"))
    rows.append(("switch back (walk down, window)", ms, len(response.content)))  # type: ignore[attr-defined]
    conversation.refresh_from_db()
    ms, _ = timed(args.runs, lambda: branches.thread(conversation))
    rows.append((f"the whole branch ({args.messages} messages, exports only)", ms, 0))

    vendor = django.db.connection.vendor
    print(f"{args.messages} messages, {vendor}, median of {args.runs} runs (1 for edits)\n")
    print("| what | ms | bytes |\n|---|---:|---:|")
    for name, ms, size in rows:
        print(f"| {name} | {ms:.1f} | {size:,} |")


if __name__ == "__main__":
    main()
