"""The history a turn sends: what fits the model's context, newest turns first."""

from __future__ import annotations


def trim_history(messages: list[dict[str, str]], budget_chars: int) -> list[dict[str, str]]:
    """The messages to send: the system message, then the newest turns that fit the budget.

    The last user message is always kept; alone over the budget it is cut from the front
    (its end is what the user just asked), though never below half the budget however long
    the system message is. Older messages go oldest-first, and whole: a message that does not
    fit ends the history there. The kept history starts with a user message, because some
    chat templates (Gemma's, for one) refuse a conversation that opens with the assistant.
    """
    system = next((m for m in messages if m.get("role") == "system"), None)
    rest = [m for m in messages if m.get("role") != "system"]
    last_user = max((i for i, m in enumerate(rest) if m.get("role") == "user"), default=None)
    remaining = budget_chars - (len(system.get("content") or "") if system else 0)
    kept: list[dict[str, str]] = []
    fitting = True
    for index in range(len(rest) - 1, -1, -1):
        message = rest[index]
        size = len(message.get("content") or "")
        if index == last_user:
            room = max(remaining, budget_chars // 2)
            if size > room:
                message = {**message, "content": (message.get("content") or "")[size - room :]}
                size = room
            kept.append(message)
            remaining -= size
        elif fitting and size <= remaining:
            kept.append(message)
            remaining -= size
        else:
            fitting = False
            if last_user is None or index < last_user:
                break
    kept.reverse()
    while kept and kept[0].get("role") != "user" and last_user is not None:
        kept.pop(0)
    return ([system] if system else []) + kept
