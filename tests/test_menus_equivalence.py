"""Transition check: chat.bubbles writes the header's ⚙ and ⋯ menus and the system prompt's form
as conversation_settings_menu.html, share_menu.html and conversation_settings.html did."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
from django.template.backends.utils import csrf_input
from django.template.loader import render_to_string
from django.test import RequestFactory

from chat import bubbles
from chat.forms import SystemPromptForm
from chat.models import Conversation

HOSTILE = '<b>"it\'s" & </textarea><script>x</script>'
TOKEN = re.compile(r'name="csrfmiddlewaretoken" value="[^"]+"')


def same(html: str) -> str:
    """Each token is masked anew: compare where it is, not its value."""
    return TOKEN.sub('name="csrfmiddlewaretoken" value="…"', html)


@pytest.mark.django_db
def test_the_menus_and_the_form_are_what_the_templates_wrote(django_user_model: Any) -> None:
    user = django_user_model.objects.create_user("eq", password="x")
    request = RequestFactory().get("/")
    count = 0
    for prompt, oob, with_request in itertools.product(["", HOSTILE], [False, True], [False, True]):
        conv = Conversation.objects.create(user=user, title="t", system_prompt=prompt)
        for conversation in (None, conv):
            context = {"conversation": conversation, "oob": oob}
            csrf = csrf_input(request) if with_request else ""
            req = request if with_request else None
            want = render_to_string(
                "chat/partials/conversation_settings_menu.html", context, request=req
            )
            got = bubbles.settings_menu_html(conversation, oob=oob, csrf=csrf)
            assert same(got) == same(want), (prompt, oob, with_request, conversation)
            want = render_to_string("chat/partials/share_menu.html", context, request=req)
            assert bubbles.share_menu_html(conversation, oob=oob) == want
            count += 1
        for sent, saved in itertools.product(["", HOSTILE, "x" * 4001], [False, True]):
            form = SystemPromptForm({"system_prompt": sent})
            form.is_valid()
            want = render_to_string(
                "chat/partials/conversation_settings.html",
                {"conversation": conv, "settings_form": form, "saved": saved},
                request=request,
            )
            got = bubbles.conversation_settings_html(
                conv,
                csrf=csrf_input(request),
                value=form["system_prompt"].value() or "",
                errors=list(form.errors.get("system_prompt", [])),
                saved=saved,
            )
            assert same(got) == same(want), (sent, saved)
            assert ("csrfmiddlewaretoken" in got) and ("Saved." in got) is saved
            count += 1
    assert count == 64
