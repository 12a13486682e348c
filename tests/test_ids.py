"""Message ids: shape, uniqueness and monotonicity under concurrency."""

import re
import threading
import time

import pytest

from chat.ids import MessageIdClock, new_message_id, parse_message_id


def test_an_id_has_the_timestamp_instance_shard_shape(settings) -> None:
    settings.CHAT_INSTANCE_ID = "web1"
    mid = new_message_id("03")
    assert re.fullmatch(r"\d{13}-web1-03", mid)
    ms, instance, shard = parse_message_id(mid)
    assert abs(ms - time.time() * 1000) < 60_000
    assert (instance, shard) == ("web1", "03")


def test_ids_made_in_the_same_millisecond_stay_unique_and_increasing() -> None:
    clock = MessageIdClock("web1")
    stamps = [clock.tick() for _ in range(10_000)]  # far more than one per millisecond
    assert stamps == sorted(stamps)
    assert len(set(stamps)) == len(stamps)


def test_ids_from_many_threads_never_collide() -> None:
    clock = MessageIdClock("web2")
    out: list[str] = []
    lock = threading.Lock()

    def work() -> None:
        mine = [clock.new_id("07") for _ in range(2_000)]
        with lock:
            out.extend(mine)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == len(set(out)) == 16_000


def test_a_clock_stepping_backwards_does_not_reuse_a_timestamp(monkeypatch) -> None:
    clock = MessageIdClock("web1")
    first = clock.tick()
    # The wall clock jumps one second into the past (NTP step): ids must still increase.
    monkeypatch.setattr(time, "time_ns", lambda: (first - 1000) * 1_000_000)
    assert clock.tick() == first + 1
    assert clock.tick() == first + 2


@pytest.mark.parametrize("bad", ["", "abc", "123-web1", "x-web1-03", "123--03", "123-web1-x"])
def test_parse_rejects_strings_that_are_not_ids(bad: str) -> None:
    assert parse_message_id(bad) is None
