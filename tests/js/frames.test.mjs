// Tests for static/chat/frames.js: which frames from the server are JSON, HTML or ignored, and
// the shape of the frames the page sends (docs/protocol.md).
//
// Run with `node --test tests/js/` (node 20, no npm packages).

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  continuedAnswer,
  promptFrame,
  readFrame,
  regenerateFrame,
  resumeFrame,
  stopFrame,
} from "../../static/chat/frames.js";

describe("readFrame", () => {
  test("it parses a frame starting with a brace as JSON", () => {
    assert.deepEqual(readFrame('{"type": "chunk", "mid": "m", "seq": 0, "text": "Hi"}'), {
      json: { type: "chunk", mid: "m", seq: 0, text: "Hi" },
    });
  });

  test("it hands anything else to htmx as HTML, untouched", () => {
    const html = '<div hx-swap-oob="beforeend:#messages"><article>{"not": "json"}</article></div>';
    assert.deepEqual(readFrame(html), { html });
    // A leading space is not a brace: that frame is HTML too (the server never sends one).
    assert.deepEqual(readFrame(' {"type": "ready"}'), { html: ' {"type": "ready"}' });
  });

  test("it ignores JSON that does not parse instead of throwing", () => {
    assert.equal(readFrame('{"type": "chunk", '), null);
    assert.equal(readFrame("{"), null);
  });

  test("it ignores binary frames", () => {
    assert.equal(readFrame(new ArrayBuffer(4)), null);
    assert.equal(readFrame(undefined), null);
  });
});

describe("the frames the page sends", () => {
  test("a prompt names its conversation, empty for a new one", () => {
    assert.deepEqual(promptFrame("", "hello"), { type: "prompt", conversation: "", text: "hello" });
    assert.deepEqual(promptFrame("42", "again"), {
      type: "prompt",
      conversation: "42",
      text: "again",
    });
  });

  test("an edited prompt says which prompt it replaces", () => {
    assert.deepEqual(promptFrame("42", "better", "1764428000123-web1-03"), {
      type: "prompt",
      conversation: "42",
      text: "better",
      replaces: "1764428000123-web1-03",
    });
  });

  test("the prompt text goes as typed, whitespace and newlines included", () => {
    assert.equal(JSON.parse(JSON.stringify(promptFrame("", "  a\n\nb  "))).text, "  a\n\nb  ");
  });

  test("stop, regenerate and resume name the answer", () => {
    assert.deepEqual(stopFrame("m1"), { type: "stop", mid: "m1" });
    assert.deepEqual(regenerateFrame("m1"), { type: "regenerate", mid: "m1" });
    assert.deepEqual(resumeFrame("m1", -1), { type: "resume", mid: "m1", after: -1 });
    assert.deepEqual(resumeFrame("m1", 41), { type: "resume", mid: "m1", after: 41 });
  });
});

describe("continuedAnswer", () => {
  // The shell chat.fragments.continuation_html sends a tab that did not press Continue.
  const shell =
    '\n<article class="msg msg-assistant" id="msg-1764428000123-web1-03" ' +
    'data-mid="1764428000123-web1-03" data-status="streaming" data-watch="1" ' +
    'hx-swap-oob="true" aria-label="Answer">\n  <div class="body markdown"></div>\n</article>';

  test("it names the answer another tab's Continue goes on with", () => {
    assert.equal(continuedAnswer(shell), "1764428000123-web1-03");
  });

  test("it names nothing for the asking tab's own shell, nor any other frame", () => {
    assert.equal(continuedAnswer(shell.replace(' data-watch="1"', "")), null);
    assert.equal(continuedAnswer(shell.replace(' hx-swap-oob="true"', "")), null);
    const exchange = '<div hx-swap-oob="beforeend:#messages">' + shell + "</div>";
    assert.equal(continuedAnswer(exchange), null);
    assert.equal(continuedAnswer('<span id="title" hx-swap-oob="true">Hi</span>'), null);
  });
});
