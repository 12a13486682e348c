"""Structured logs: JSON or key=value lines naming the instance, and the turn on lines about one."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from typing import Any

import pytest

from chat.logging import ContextFilter, JsonFormatter, KeyValueFormatter, turn_context
from tests.conftest import receive_until_done
from tests.servers import ROOT, base_env


def record(message: str = "hello %s", *args: Any, **extra: Any) -> logging.LogRecord:
    rec = logging.getLogger("chat.test").makeRecord(
        "chat.test", logging.WARNING, __file__, 1, message, args or ("world",), None, extra=extra
    )
    ContextFilter("web1").filter(rec)
    return rec


def test_a_json_line_names_the_instance_and_carries_the_message() -> None:
    line = json.loads(JsonFormatter().format(record()))
    assert line["msg"] == "hello world"
    assert line["level"] == "WARNING"
    assert line["logger"] == "chat.test"
    assert line["instance"] == "web1"
    assert line["ts"].endswith("Z")
    assert "mid" not in line  # not about a turn


def test_inside_a_turn_every_line_carries_the_turn_and_message_ids() -> None:
    with turn_context("1764428000123-web1-03", conversation="c-1", user=7) as ids:
        line = json.loads(JsonFormatter().format(record()))
        text = KeyValueFormatter().format(record())
    assert line["turn"] == ids.turn and len(ids.turn) == 12
    assert (line["mid"], line["conversation"], line["user"]) == (
        "1764428000123-web1-03",
        "c-1",
        "7",
    )
    assert f"turn={ids.turn} mid=1764428000123-web1-03" in text
    # Outside the block the ids are gone again.
    assert "mid" not in json.loads(JsonFormatter().format(record()))


def test_ids_given_explicitly_win_over_the_context() -> None:
    with turn_context("from-context"):
        line = json.loads(JsonFormatter().format(record(mid="explicit")))
    assert line["mid"] == "explicit"


def test_key_value_lines_quote_what_needs_quoting() -> None:
    text = KeyValueFormatter().format(record('said "hi" %s', "there\nnow", status_code=429))
    assert text.startswith("ts=")
    assert " level=WARNING logger=chat.test instance=web1 status_code=429 " in text
    assert text.endswith('msg="said \\"hi\\" there\\nnow"')
    assert "\n" not in text  # one event, one line


def test_exceptions_stay_inside_the_json_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        rec = logging.getLogger("chat.test").makeRecord(
            "chat.test", logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    line = JsonFormatter().format(rec)
    assert "\n" not in line
    assert "ValueError: boom" in json.loads(line)["exc"]


@pytest.mark.parametrize(("fmt", "parse"), [("json", json.loads), ("text", str)])
def test_django_log_format_chooses_the_format_of_the_console(fmt: str, parse: Any) -> None:
    code = (
        "import django, logging; django.setup(); "
        "logging.getLogger('chat.turns').warning('turn over')"
    )
    env = base_env(DJANGO_LOG_FORMAT=fmt, CHAT_INSTANCE_ID="web9")
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    line = parse(result.stderr.strip())
    if fmt == "json":
        assert (line["instance"], line["msg"]) == ("web9", "turn over")
    else:
        assert "instance=web9" in line and line.endswith('msg="turn over"')


@pytest.mark.usefixtures("chat_settings")
async def test_lines_logged_during_a_real_turn_carry_its_ids(
    connect: Any, owner: Any, caplog: pytest.LogCaptureFixture, settings: Any
) -> None:
    # The filter settings.LOGGING puts on the console handler, on pytest's (one per phase).
    caplog.handler.addFilter(ContextFilter())
    comm = await connect(owner)
    await comm.send_to(text_data=json.dumps({"type": "prompt", "text": "/fail 502"}))
    result = await receive_until_done(comm)
    mid = result["done"]["mid"]
    # Both the turn and the upstream client (deeper in the same task) log the failure.
    about_it = [
        r
        for r in caplog.records
        if r.name in ("chat.turns.turn", "chat.upstream") and "502" in r.getMessage()
    ]
    assert {r.name for r in about_it} == {"chat.turns.turn", "chat.upstream"}
    for rec in about_it:
        assert rec.mid == mid  # type: ignore[attr-defined]
        assert rec.turn  # type: ignore[attr-defined]
        assert rec.instance == settings.CHAT_INSTANCE_ID  # type: ignore[attr-defined]
    assert len({r.turn for r in about_it}) == 1  # type: ignore[attr-defined]
