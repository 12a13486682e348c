"""Template tags of the chat page: a message's bubble, a conversation's sidebar entry and the
header's menus, written by chat/bubbles.py and chat/menus.py (the one place their markup is),
where the page, the thread's windows and the sidebar show them."""

from __future__ import annotations

from django import template
from django.template.context import Context
from django.template.defaulttags import CsrfTokenNode
from django.utils.safestring import SafeString, mark_safe

from chat.branches import ThreadEntry
from chat.bubbles import message_html
from chat.menus import conversation_item_html, settings_menu_html, share_menu_html
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


@register.simple_tag(takes_context=True)
def header_menus(context: Context, conversation: Conversation | None) -> SafeString:
    """`{% header_menus conversation %}`: the chat header's ⚙ (the system prompt, with the
    page's CSRF input) and ⋯ (share and export) menus; hidden with no conversation."""
    csrf = CsrfTokenNode().render(context)
    return mark_safe(
        settings_menu_html(conversation or None, csrf=csrf)
        + "\n      "
        + share_menu_html(conversation or None)
    )
