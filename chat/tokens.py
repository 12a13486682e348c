"""How many tokens a text is when nobody counted: the one rule of thumb, ~4 characters a token."""

from __future__ import annotations

# The usual estimate for English text; used where the model server reports no usage, and to
# reserve a prompt's tokens before it is sent.
CHARS_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    """Tokens in `text` by the rule of thumb: at least 1 for any text, 0 for none."""
    return chars_to_tokens(len(text))


def chars_to_tokens(chars: int) -> int:
    return max(1, -(-chars // CHARS_PER_TOKEN)) if chars > 0 else 0
