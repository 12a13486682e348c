"""The markup of the page's navigation, written in Python as chat/bubbles.py writes a message's:
a conversation's entry in the sidebar, the chat header's ⚙ and ⋯ menus and the system prompt's
form. The sidebar, the page's header, a new conversation's frame, a title change and the rename,
pin and system prompt views use them (issue 18; docs/decisions/performance.md, *Bubbles,
feedback and sidebar entries without the template engine*)."""

from __future__ import annotations

from django.urls import get_script_prefix, reverse
from django.utils.timezone import localtime

from chat.bubbles import esc, url
from chat.models import Conversation


def conversation_item_html(c: Conversation, current: str, *, oob: bool = False) -> str:
    """A conversation's entry in the sidebar (`current`: the id of the conversation the page
    shows, as the page sent it), with its ⋯ menu: rename, pin, export, share, delete."""
    cid = esc(c.id)
    here = current == str(c.id)
    current = esc(current)
    title = esc(c.title)
    # Django's date format "c" is isoformat(), without the format parser.
    updated = esc(localtime(c.updated_at).isoformat()) if c.updated_at else ""

    prefix, plain = get_script_prefix(), str(c.id)

    def to(name: str) -> str:
        return esc(url(f"chat:{name}", plain, prefix=prefix))

    keep = f'<input type="hidden" name="current" value="{current}">'
    swap = ' hx-swap-oob="true"' if oob else ""
    shown = ' aria-current="page"' if here else ""
    pinned = '<span class="pinned" aria-label="Pinned">📌 </span>' if c.pinned else ""
    return (
        f'<li id="conv-{cid}" class="conv{" current" if here else ""}" data-updated="{updated}"'
        f"{swap}>\n"
        f'  <a href="{to("conversation")}"{shown}>{pinned}{title}</a>\n'
        '  <details class="conv-menu">\n'
        f'    <summary aria-label="Options for {title}">⋯</summary>\n'
        f'    <form class="rename" hx-post="{to("rename")}" hx-target="#conv-{cid}"'
        ' hx-swap="outerHTML">\n'
        f"      {keep}\n"
        f'      <label class="visually-hidden" for="rename-{cid}">New title</label>\n'
        f'      <input id="rename-{cid}" name="title" value="{title}" maxlength="200" required>\n'
        '      <button type="submit">Rename</button>\n'
        "    </form>\n"
        f'    <form class="pin" hx-post="{to("pin")}" hx-target="#conversation-list"'
        ' hx-swap="innerHTML">\n'
        f"      {keep}\n"
        f'      <button type="submit">{"Unpin" if c.pinned else "Pin to top"}</button>\n'
        "    </form>\n"
        # Export and share (chat/sharing.py): downloads, and a read-only link for anyone.
        "    \n"
        '    <div class="conv-export">\n'
        f'      <a href="{to("export_markdown")}" download>Export as Markdown</a>\n'
        f'      <a href="{to("export_json")}" download>Export as JSON</a>\n'
        "    </div>\n"
        f'    <form class="share" hx-post="{to("share")}" hx-target="#share-{cid}"'
        ' hx-swap="innerHTML">\n'
        '      <button type="submit">Share link</button>\n'
        "    </form>\n"
        f'    <div id="share-{cid}" class="share-result" aria-live="polite"></div>\n'
        f'    <form class="delete" hx-post="{to("delete")}" hx-target="#conv-{cid}"'
        f' hx-swap="outerHTML" hx-confirm="Delete “{title}” and all its messages?">\n'
        f"      {keep}\n"
        '      <button type="submit" class="danger">Delete</button>\n'
        "    </form>\n"
        "  </details>\n"
        "</li>\n"
    )


def _menu_attributes(conversation: Conversation | None, oob: bool) -> str:
    swap = ' hx-swap-oob="true"' if oob else ""
    return swap + ("" if conversation else " hidden")


def settings_menu_html(
    conversation: Conversation | None, *, oob: bool = False, csrf: str = ""
) -> str:
    """⚙ in the chat's header: this conversation's system prompt (the account's settings are
    "Settings" in the sidebar); hidden on a page with no conversation yet. On a phone the ⚙
    button leaves the header (the title needs the room) and the ⋯ menu opens it. A new chat's
    first exchange brings it out of band. `csrf`: the token's hidden input, as a page has it."""
    form = conversation_settings_html(conversation, csrf=csrf) if conversation else ""
    return (
        '\n<details class="conversation-menu-settings" id="conversation-settings-menu"'
        f"{_menu_attributes(conversation, oob)}>"
        '<summary aria-label="System prompt for this chat" title="System prompt for this chat">'
        "⚙</summary>\n"
        f'  <div class="conversation-settings-popover">{form}</div>\n'
        "</details>\n"
    )


def conversation_settings_html(
    conversation: Conversation,
    *,
    csrf: str = "",
    value: str | None = None,
    errors: list[str] | None = None,
    saved: bool = False,
) -> str:
    """A conversation's own system prompt: htmx posts it and swaps this form
    (chat/settings_views.py). `value`: what was sent, shown again with its `errors` (else the
    conversation's prompt); `saved`: it was."""
    post = esc(url("chat:conversation_settings", conversation.id))
    text = conversation.system_prompt if value is None else value
    error = f'<div class="form-error" role="alert">{esc(" ".join(errors))}</div>' if errors else ""
    note = ' <span class="saved" role="status">Saved.</span>' if saved else ""
    return (
        '\n<form id="conversation-settings" class="conversation-settings" method="post"'
        f' action="{post}" hx-post="{post}" hx-target="this" hx-swap="outerHTML">\n'
        f"  {csrf}\n"
        '  <label for="system-prompt">System prompt for this conversation</label>\n'
        '  <textarea id="system-prompt" name="system_prompt" rows="3" maxlength="4000"'
        f' placeholder="e.g. Answer like a pirate.">{esc(text)}</textarea>\n'
        f"  {error}\n"
        f'  <div class="row"><button type="submit" class="primary">Save</button>{note}</div>\n'
        '  <p class="hint">Sent to the model before every prompt here, after your'
        f' <a href="{esc(reverse("chat:settings"))}">custom instructions</a>.</p>\n'
        "</form>\n"
    )


def share_menu_html(conversation: Conversation | None, *, oob: bool = False) -> str:
    """⋯ in the chat's header: share and export this conversation (chat/sharing.py), as its ⋯
    menu in the list does; on a phone it also opens the system prompt (⚙ is not in the header
    there). A new chat's first exchange brings it out of band."""
    inside = ""
    if conversation is not None:
        inside = (
            '<div class="conversation-settings-popover">\n'
            "    \n"
            '    <button type="button" class="system-prompt-item" data-action="open-system-prompt">'
            "System prompt for this chat</button>\n"
            f'    <form class="share" hx-post="{esc(url("chat:share", conversation.id))}"'
            ' hx-target="#share-menu-result" hx-swap="innerHTML">\n'
            '      <button type="submit" class="primary">Share link</button>\n'
            "    </form>\n"
            '    <div id="share-menu-result" class="share-result" aria-live="polite"></div>\n'
            '    <div class="conv-export">\n'
            f'      <a href="{esc(url("chat:export_markdown", conversation.id))}" download>'
            "Export as Markdown</a>\n"
            f'      <a href="{esc(url("chat:export_json", conversation.id))}" download>'
            "Export as JSON</a>\n"
            "    </div>\n"
            "  </div>"
        )
    return (
        '\n<details class="conversation-menu-settings share-menu" id="share-menu"'
        f"{_menu_attributes(conversation, oob)}>"
        '<summary aria-label="Share and export" title="Share and export">⋯</summary>\n'
        f"  {inside}\n"
        "</details>\n"
    )
