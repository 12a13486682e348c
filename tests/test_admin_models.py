"""The admin's pickable models (issue 17.1): an admin adds one for a plan, and a user of that
plan is offered it on the next connection; others are not."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from chat.models import PickableModel, Plan, Quota
from chat.tiers.hints import Signals
from chat.tiers.picker import with_choices
from chat.tiers.policy import Policy, decide

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(django_user_model: Any) -> Client:
    admin = django_user_model.objects.create_superuser("boss", password="boss-pass-123456")
    client = Client()
    client.force_login(admin)
    return client


def desktop() -> Any:
    ua = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0"
    signals = Signals(user_agent=ua, ch_mobile=None, save_data=None, ect=None, choice=None)
    return decide(signals, Policy.default())


def test_an_admin_adds_a_pickable_model_for_a_plan(
    admin_client: Client, owner: Any, other_user: Any
) -> None:
    gold = Plan.objects.create(name="Gold")
    Quota.objects.create(user=owner, plan=gold)
    listing = admin_client.get("/admin/chat/pickablemodel/")
    assert listing.status_code == 200
    response = admin_client.post(
        "/admin/chat/pickablemodel/add/",
        {
            "model": "gpt-big",
            "label": "Big model",
            "plans": [gold.pk],
            "enabled": "on",
            "order": "10",
        },
    )
    assert response.status_code == 302, response.content[:500]
    row = PickableModel.objects.get(model="gpt-big")
    assert list(row.plans.all()) == [gold] and not row.phones
    assert ("gpt-big", "Big model") in with_choices(desktop(), owner).models
    assert "gpt-big" not in dict(with_choices(desktop(), other_user).models)
    assert b"Big model" in admin_client.get("/admin/chat/pickablemodel/").content
