"""The demo model's conversation titles: a few words that name what the first prompt asks,
drawn from the prompt itself, the way a person would title it (docs/protocol.md)."""

from __future__ import annotations

import re

# A request whose system message starts with this asks for a conversation's title (what
# chatsite's title requests send).
TITLE_REQUEST = "Write a short title"
TITLE_WORDS = 6  # what chatsite's title instruction allows
TITLE_CHARS = 60  # what chatsite keeps of a title

_DIRECTIVE_RE = re.compile(r"\s*/(echo-system|echo|long|markdown|fail|cut|stall|length)(?=\s|$)")
# A prompt made only of a directive is titled by what it asks for: with its number, and
# without one (a directive the demo will refuse still gets a title).
_DIRECTIVE_TITLES = {
    "long": ("Long answer ({} tokens)", "Long answer"),
    "markdown": ("Markdown sample ({} tokens)", "Markdown sample"),
    "cut": ("Answer cut after {} tokens", "Cut-off answer"),
    "fail": ("Error {} from the model", "Error from the model"),
    "stall": ("Slow start ({} s)", "Slow start"),
    "length": ("Answer in parts of {} tokens", "Answer in parts"),
}
# Openings that say nothing of the subject ("Can you please …", "How do I …"): the title
# starts after them. Lower case, word by word.
_LEAD_INS = tuple(
    tuple(phrase.split())
    for phrase in (
        "please",
        "can you",
        "could you",
        "would you",
        "will you",
        "help me",
        "how do i",
        "how can i",
        "how should i",
        "i want to",
        "i would like to",
        "i'd like to",
        "i need to",
        "tell me about",
        "give me",
        "show me",
    )
)
# Where a prompt's subject ends and its details begin ("… a palindrome checker that …").
_CLAUSE_WORDS = frozenset({"that", "which", "who", "whether", "so", "because", "using", "with"})
# A title does not end on these.
_DANGLING = frozenset(
    {
        *("a", "an", "the", "and", "or", "but", "of", "in", "on", "at", "to", "for", "with"),
        *("by", "from", "about", "into", "as", "is", "are", "was", "my", "your", "our"),
        *("their", "its", "this", "that", "these", "those"),
    }
)
# A greeting before the question ("Hi, …", "Hello! …") is no part of its subject.
_GREETINGS = frozenset({"hi", "hello", "hey", "thanks"})
_CLAUSE_END = tuple(".?!;:,")
_AROUND = "\"'`*_~()[]{}<>.,;:!?\u201c\u201d\u2018\u2019"


def title_for(text: str) -> str:
    """A short title for a conversation that starts with `text`: its subject in at most six
    words, as typed, the first letter capitalised ("How do I greet someone in Python?" →
    "Greet someone in Python"); a prompt that is only a directive is titled by what it asks
    ("/long 300" → "Long answer (300 tokens)")."""
    match = _DIRECTIVE_RE.match(text)
    if match is not None:
        return _directive_title(match.group(1), text[match.end() :])
    line = next((part for part in text.splitlines() if part.strip()), "")
    words = _first_clause(line)
    subject = _after_lead_ins(words) or words
    title = subject[:TITLE_WORDS]
    while len(title) > 1 and (title[-1].lower() in _DANGLING or _too_long(title)):
        title.pop()
    if not title:
        return " ".join(line.split())[:TITLE_CHARS] or "New chat"
    joined = " ".join(title)[:TITLE_CHARS]
    return joined[0].upper() + joined[1:]


def _directive_title(directive: str, rest: str) -> str:
    if directive == "echo-system":
        return "System prompt"
    if directive == "echo":
        return title_for(rest) if rest.strip() else "Echo"
    parts = rest.split(maxsplit=1)
    argument = parts[0] if parts else ""
    remainder = parts[1] if len(parts) > 1 else ""
    if remainder.strip() and directive in ("stall", "length"):
        return title_for(remainder)  # answered as if it were the whole message
    with_number, without = _DIRECTIVE_TITLES[directive]
    if not re.fullmatch(r"\d{1,9}(\.\d{1,3})?", argument):
        return without
    return with_number.format(argument)


def _first_clause(line: str) -> list[str]:
    """The words of the line up to the end of its first clause, bare of quotes and
    punctuation around them."""
    words: list[str] = []
    raws = line.split()
    if len(raws) > 1 and raws[0].strip(_AROUND).lower() in _GREETINGS and raws[0][-1] in ",!.":
        raws = raws[1:]
    for raw in raws:
        word = raw.strip(_AROUND)
        if not word:
            continue
        if word.lower() in _CLAUSE_WORDS and len(words) >= 3:
            break
        words.append(word)
        if raw.rstrip("\"')]\u201d\u2019").endswith(_CLAUSE_END) and len(words) >= 2:
            break
    return words


def _after_lead_ins(words: list[str]) -> list[str]:
    rest = list(words)
    stripped = True
    while stripped and rest:
        stripped = False
        lower = [word.lower() for word in rest]
        for phrase in _LEAD_INS:
            if tuple(lower[: len(phrase)]) == phrase:
                rest = rest[len(phrase) :]
                stripped = True
                break
    return rest


def _too_long(words: list[str]) -> bool:
    return len(" ".join(words)) > TITLE_CHARS
