"""The built-in OpenAI-compatible demo model (ARCHITECTURE §7): a pure ASGI app, no Django.

It answers `POST {prefix}/chat/completions` (streaming or not) and `GET {prefix}/models`
deterministically, so the chat, its tests and its benchmarks run without a real model.
Directives at the start of the last user message steer it:

    /echo <text>        answer exactly <text> (one space, tab or newline after /echo is eaten)
    /long <n>           n tokens of deterministic prose (a prefix of one fixed text)
    /markdown <n>       about n tokens of markdown (headings, lists, tables, math, quotes, a code
                        block every ~300 tokens): what live rendering is measured on
    /fail <status>      that HTTP status (400-599) with an OpenAI-style error body
    /cut <n>            stream the first n tokens of /long, then drop the connection
    /stall <s> [rest]   wait s seconds before the first token, then answer [rest]
    /echo-system        answer exactly the system message(s), or "There is no system message."
    /length <n> [rest]  answer [rest], at most n tokens per request (finish_reason "length")

A request that ends with an assistant message continues it (the rest of the planned answer);
one whose system message starts with "Write a short title" gets a title (docs/protocol.md).

Standalone: `python -m chat.demo_upstream --port N [--host H] [--ttfb-ms X] [--tps Y]`
(`--port 0` picks a free port; the line printed once listening names the base URL).
"""

from chat.demo_upstream.answers import (
    FAST_BATCH_TOKENS,
    ConnectionCut,
    default_reply,
    long_tokens,
    plan_answer,
    tokenize,
)
from chat.demo_upstream.app import DemoModel
from chat.demo_upstream.server import main, serve

__all__ = [
    "FAST_BATCH_TOKENS",
    "ConnectionCut",
    "DemoModel",
    "default_reply",
    "long_tokens",
    "main",
    "plan_answer",
    "serve",
    "tokenize",
]
