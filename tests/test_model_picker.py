"""The model picker on the socket: what `ready` offers, what a prompt may pick, and that a
model that is not allowed is refused before anything goes upstream (issue 17.1)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import Client

from chat.models import Conversation, Message, PickableModel, Plan, Quota
from chat.tiers.policy import clear_policy_cache
from tests.conftest import PHONE_UA, receive_until_done
from tests.recording_upstream import Recorded, recording_upstream

pytestmark = pytest.mark.usefixtures("chat_settings")


@pytest.fixture
def recorded(chat_settings: Any, demo_upstream: str) -> Iterator[Recorded]:
    with recording_upstream(demo_upstream) as (url, seen):
        chat_settings.LLM_BASE_URL = url
        yield seen


def ids(ready: dict[str, Any]) -> list[str]:
    return [m["id"] for m in ready["models"]]


async def next_json(comm: Any) -> dict[str, Any]:
    while True:
        raw = await comm.receive_from(timeout=10)
        if raw.startswith("{"):
            return json.loads(raw)


@database_sync_to_async
def add_model(model: str, label: str, *, phones: bool = False, plan: Plan | None = None) -> None:
    row = PickableModel.objects.create(model=model, label=label, phones=phones)
    if plan is not None:
        row.plans.add(plan)
    clear_policy_cache()


async def test_ready_lists_the_default_first_then_the_cheaper_tier(
    connect: Any, owner: Any
) -> None:
    comm = await connect(owner)
    # On a desktop the full model answers by default; anyone may pick the lite one.
    assert comm.ready["models"][0] == {"id": "demo-full", "label": "demo-full"}
    assert ids(comm.ready) == ["demo-full", "demo-lite"]


async def test_a_phone_is_offered_only_what_phones_may_use(connect: Any, owner: Any) -> None:
    await add_model("demo-full", "Big demo", phones=False)
    comm = await connect(owner, user_agent=PHONE_UA)
    assert ids(comm.ready) == ["demo-lite"]


async def test_admins_models_are_offered_to_their_plans_only(
    connect: Any, owner: Any, other_user: Any
) -> None:
    gold = await database_sync_to_async(Plan.objects.create)(name="Gold")
    await database_sync_to_async(Quota.objects.create)(user=owner, plan=gold)
    await add_model("demo-lite", "Small and quick", phones=True, plan=gold)
    mine = await connect(owner)
    theirs = await connect(other_user)
    assert {"id": "demo-lite", "label": "Small and quick"} in mine.ready["models"]
    assert ids(mine.ready) == ["demo-full", "demo-lite"]
    # The lite tier's model is still theirs to pick (anyone may pick the cheaper tier).
    assert theirs.ready["models"][1] == {"id": "demo-lite", "label": "Small and quick"}


async def test_a_picked_model_answers_and_is_kept_for_the_conversation(
    connect: Any, owner: Any, recorded: Recorded
) -> None:
    comm = await connect(owner)
    frame = {"type": "prompt", "conversation": "", "text": "/echo hi", "model": "demo-lite"}
    await comm.send_to(text_data=json.dumps(frame))
    first = await receive_until_done(comm)
    answer = await database_sync_to_async(Message.objects.get)(mid=first["done"]["mid"])
    assert answer.model == "demo-lite"
    conv = await database_sync_to_async(Conversation.objects.get)(user=owner)
    assert conv.model == "demo-lite"
    # The next prompt without a model keeps the conversation's pick.
    again = {"type": "prompt", "conversation": str(conv.id), "text": "/echo again"}
    await comm.send_to(text_data=json.dumps(again))
    second = await receive_until_done(comm)
    answer = await database_sync_to_async(Message.objects.get)(mid=second["done"]["mid"])
    assert answer.model == "demo-lite"
    assert recorded.models() == ["demo-lite", "demo-lite"]
    # ... and the model is shown on the answer.
    assert '<span class="model"' in "".join(second["html"])
    assert ">demo-lite</span>" in "".join(second["html"])


@pytest.mark.parametrize(
    "raw",
    [
        '{"type": "prompt", "conversation": "", "text": "/echo hi", "model": "gpt-secret"}',
        # Re-spelled keys and values: the same parse, the same refusal.
        '{"\\u0074ype": "\\u0070rompt", "text": "/echo hi", "\\u006dodel": "gpt-\\u0073ecret"}',
        '{"model":"demo-ultra","text":"/echo hi","type":"prompt"}',
    ],
)
async def test_a_model_not_allowed_is_refused_and_never_sent_upstream(
    connect: Any, owner: Any, recorded: Recorded, raw: str
) -> None:
    comm = await connect(owner)
    await comm.send_to(text_data=raw)
    error = await next_json(comm)
    assert error["type"] == "error" and error["code"] == "bad_request"
    assert "model" in error["message"]
    assert recorded.snapshot() == []
    assert not await database_sync_to_async(Message.objects.exists)()


async def test_a_phone_cannot_pick_the_full_model_by_sending_it(
    connect: Any, owner: Any, recorded: Recorded
) -> None:
    comm = await connect(owner, user_agent=PHONE_UA)
    frame = {"type": "prompt", "text": "/echo hi", "model": "demo-full"}
    await comm.send_to(text_data=json.dumps(frame))
    error = await next_json(comm)
    assert error["code"] == "bad_request"
    assert recorded.snapshot() == []


async def test_a_model_frame_that_is_not_an_id_is_a_bad_request(connect: Any, owner: Any) -> None:
    comm = await connect(owner)
    for model in ([1], "x" * 500, "demo\u0000full"):
        await comm.send_to(text_data=json.dumps({"type": "prompt", "text": "hi", "model": model}))
        error = await next_json(comm)
        assert error["code"] == "bad_request"


async def test_regenerate_may_pick_another_model(
    connect: Any, owner: Any, recorded: Recorded
) -> None:
    comm = await connect(owner)
    await comm.send_to(text_data=json.dumps({"type": "prompt", "text": "/echo one"}))
    first = await receive_until_done(comm)
    frame = {"type": "regenerate", "mid": first["done"]["mid"], "model": "demo-lite"}
    await comm.send_to(text_data=json.dumps(frame))
    second = await receive_until_done(comm)
    answer = await database_sync_to_async(Message.objects.get)(mid=second["done"]["mid"])
    assert answer.model == "demo-lite"
    assert recorded.models() == ["demo-full", "demo-lite"]


async def test_a_plan_without_the_full_model_cannot_pick_it(
    connect: Any, owner: Any, recorded: Recorded
) -> None:
    plan = await database_sync_to_async(Plan.objects.create)(
        name="Lite only", full_model_allowed=False
    )
    await database_sync_to_async(Quota.objects.create)(user=owner, plan=plan)
    await add_model("demo-full", "Big demo", phones=True)  # listed for every plan, but not this
    comm = await connect(owner)
    assert ids(comm.ready) == ["demo-lite"]
    await comm.send_to(text_data=json.dumps({"type": "prompt", "text": "hi", "model": "demo-full"}))
    error = await next_json(comm)
    assert error["code"] == "bad_request"
    assert recorded.snapshot() == []


# --- POST /c/<id>/model/: a pick is kept as soon as it is made (new-user review) ---------------


@pytest.mark.django_db
def test_a_pick_is_stored_for_the_conversation_without_a_prompt(
    django_user_model: Any,
) -> None:
    clear_policy_cache()  # no admin rows from other tests: phones may not pick the full model
    owner = django_user_model.objects.create_user(username="picks", password="pw-for-tests")
    other = django_user_model.objects.create_user(username="other", password="pw-for-tests")
    conversation = Conversation.objects.create(user=owner, title="t", model="demo-lite")
    url = f"/c/{conversation.id}/model/"
    client = Client()  # a desktop: the full model is the default, the lite one pickable
    client.force_login(owner)
    assert client.post(url, {"model": "demo-full"}).status_code == 204
    conversation.refresh_from_db()
    assert conversation.model == "demo-full"
    # The page shows it on the next visit: the picker selects it.
    assert (
        '<option value="demo-full" selected>'
        in client.get(f"/c/{conversation.id}/").content.decode()
    )
    # Only what this device and plan may pick; never another user's conversation.
    assert client.post(url, {"model": "gpt-evil"}).status_code == 400
    assert client.post(url, {}).status_code == 400
    intruder = Client()
    intruder.force_login(other)
    assert intruder.post(url, {"model": "demo-lite"}).status_code == 404
    conversation.refresh_from_db()
    assert conversation.model == "demo-full"
    # A phone may not pick the full model here either (no admin row lets phones have it).
    phone = Client(headers={"user-agent": PHONE_UA})
    phone.force_login(owner)
    assert phone.post(url, {"model": "demo-full"}).status_code == 400
    # CSRF-protected like every POST.
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(owner)
    assert strict.post(url, {"model": "demo-lite"}).status_code == 403
