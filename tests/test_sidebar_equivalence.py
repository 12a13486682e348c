"""Transition check: chat.bubbles.conversation_item_html writes what conversation_item.html
rendered, byte for byte."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from django.template.loader import render_to_string

from chat.bubbles import conversation_item_html
from chat.models import Conversation

HOSTILE = "<b>\"it's\" & “quoted”</b><script>x</script>"


@pytest.mark.django_db
def test_every_sidebar_entry_is_what_the_template_wrote(django_user_model: Any) -> None:
    user = django_user_model.objects.create_user("eq", password="x")
    count = 0
    for title, pinned in itertools.product(["New chat", HOSTILE, ""], [False, True]):
        c = Conversation.objects.create(user=user, title=title, pinned=pinned)
        for current, oob in itertools.product(["", str(c.id), "other", HOSTILE], [False, True]):
            want = render_to_string(
                "chat/partials/conversation_item.html", {"c": c, "current": current, "oob": oob}
            )
            assert conversation_item_html(c, current, oob=oob) == want, (title, current, oob)
            count += 1
    assert count == 48
