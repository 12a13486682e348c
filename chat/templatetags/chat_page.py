"""Template tags of the chat page: a message's bubble and a conversation's sidebar entry, written
by chat/bubbles.py (the one place their markup is), where the page, the thread's windows and the
sidebar list them."""

from __future__ import annotations

from django import template
from django.utils.safestring import SafeString, mark_safe

from chat.branches import ThreadEntry
from chat.bubbles import conversation_item_html, message_html
from chat.models import Conversation

register = template.Library()


@register.simple_tag
def bubble(entry: ThreadEntry) -> SafeString:
    """`{% bubble e %}`: the message of a thread's entry, with its versions and its HTML."""
    return mark_safe(message_html(entry.message, entry=entry, rendered=entry.rendered))


@register.simple_tag
def sidebar_entry(c: Conversation, current: str = "", oob: bool = False) -> SafeString:
    """`{% sidebar_entry c current %}`: a conversation's entry in the sidebar."""
    return mark_safe(conversation_item_html(c, str(current), oob=oob))
