"""Template tags of the chat page: a message's bubble, written by chat/bubbles.py (the one place
its markup is), where the page and the thread's windows list their messages."""

from __future__ import annotations

from django import template
from django.utils.safestring import SafeString, mark_safe

from chat.branches import ThreadEntry
from chat.bubbles import message_html

register = template.Library()


@register.simple_tag
def bubble(entry: ThreadEntry) -> SafeString:
    """`{% bubble e %}`: the message of a thread's entry, with its versions and its HTML."""
    return mark_safe(message_html(entry.message, entry=entry, rendered=entry.rendered))
