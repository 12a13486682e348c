// Tests for static/chat/tail.js: how the open tail of a streaming answer is read for its live
// preview (line kinds, inline spans) and how offsets in code points are dropped.
//
// Run with `node --test tests/js/` (node 20, no npm packages).

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { TailReader, dropCodePoints, inlineSpans, texPreview } from "../../static/chat/tail.js";

describe("TailReader", () => {
  test("it names headings, list items, quotes, rules, blank lines and text", () => {
    const reader = new TailReader();
    assert.deepEqual(reader.read("## Plan"), { kind: "heading", level: 2, text: "Plan" });
    assert.deepEqual(reader.read("- one"), { kind: "bullet", text: "one" });
    assert.deepEqual(reader.read("12. twelve"), { kind: "ordered", text: "twelve" });
    assert.deepEqual(reader.read("> said"), { kind: "quote", text: "said" });
    assert.deepEqual(reader.read("---"), { kind: "rule" });
    assert.deepEqual(reader.read("   "), { kind: "blank" });
    assert.deepEqual(reader.read("  plain words "), { kind: "text", text: "plain words" });
    assert.deepEqual(reader.read("#hashtag"), { kind: "text", text: "#hashtag" });
  });

  test("inside a fence every line is code until the closing fence", () => {
    const reader = new TailReader();
    assert.deepEqual(reader.read("```python"), { kind: "fence", lang: "python" });
    assert.deepEqual(reader.read("# not a heading"), { kind: "code", text: "# not a heading" });
    assert.deepEqual(reader.read("``"), { kind: "code", text: "``" });
    assert.deepEqual(reader.read("```"), { kind: "fence-close" });
    assert.deepEqual(reader.read("# a heading"), { kind: "heading", level: 1, text: "a heading" });
  });

  test("a longer fence needs a closing fence as long, of the same character", () => {
    const reader = new TailReader();
    reader.read("~~~~");
    assert.equal(reader.read("~~~").kind, "code");
    assert.equal(reader.read("````").kind, "code");
    assert.equal(reader.read("~~~~~").kind, "fence-close");
  });

  test("the line being written does not open or close a fence", () => {
    const reader = new TailReader();
    assert.equal(reader.read("```js", false).kind, "fence");
    assert.equal(reader.read("x = 1").kind, "text"); // the fence line was not complete
    reader.read("```js");
    assert.equal(reader.read("```", false).kind, "fence-close");
    assert.equal(reader.read("y = 2").kind, "code"); // still inside
  });

  test("a fence's label keeps only the characters the server keeps", () => {
    const reader = new TailReader();
    assert.deepEqual(reader.read('```c++"><img'), { kind: "fence", lang: "c++img" });
  });
});

describe("inlineSpans", () => {
  test("bold, italic and code lose their markers", () => {
    assert.deepEqual(inlineSpans("a **b** *c* `d`"), [
      { text: "a " },
      { text: "b", strong: true },
      { text: " " },
      { text: "c", em: true },
      { text: " " },
      { text: "d", code: true },
    ]);
  });

  test("a span still being written is open to the end of the text", () => {
    assert.deepEqual(inlineSpans("so **bol"), [{ text: "so " }, { text: "bol", strong: true }]);
    assert.deepEqual(inlineSpans("call `f(x"), [{ text: "call " }, { text: "f(x", code: true }]);
  });

  test("markers that cannot open or close stay text", () => {
    assert.deepEqual(inlineSpans("2 * 3 * 4"), [{ text: "2 * 3 * 4" }]);
    assert.deepEqual(inlineSpans("snake_case_name"), [{ text: "snake_case_name" }]);
    assert.deepEqual(inlineSpans("a **"), [{ text: "a **" }]);
  });

  test("markers inside code are code, and escapes are their character", () => {
    assert.deepEqual(inlineSpans("`**x**` \\*y\\*"), [
      { text: "**x**", code: true },
      { text: " *y*" },
    ]);
  });

  test("markup-looking text is only ever text", () => {
    const spans = inlineSpans("<img src=x onerror=alert(1)> **<b>**");
    assert.deepEqual(spans, [
      { text: "<img src=x onerror=alert(1)> " },
      { text: "<b>", strong: true },
    ]);
  });
});

describe("math in the open tail", () => {
  test("a formula is a math span, its delimiters gone", () => {
    assert.deepEqual(inlineSpans("so $x_i^2$ and \\(a\\) and $$b$$."), [
      { text: "so " },
      { text: "x_i^2", math: true },
      { text: " and " },
      { text: "a", math: true },
      { text: " and " },
      { text: "b", math: true },
      { text: "." },
    ]);
  });

  test("markers inside a formula are not emphasis", () => {
    assert.deepEqual(inlineSpans("$a_1 * b_2 * c$"), [{ text: "a_1 * b_2 * c", math: true }]);
  });

  test("a $$ or \\( still being written is a formula to the end; a lone $ waits for its closer", () => {
    assert.deepEqual(inlineSpans("so $$\\sum_{i"), [
      { text: "so " },
      { text: "\\sum_{i", math: true },
    ]);
    assert.deepEqual(inlineSpans("so $x_i^"), [{ text: "so $x_i^" }]);
  });

  test("money is not a formula", () => {
    assert.deepEqual(inlineSpans("from $5 to $10 a day"), [{ text: "from $5 to $10 a day" }]);
    assert.deepEqual(inlineSpans("costs $5$10"), [{ text: "costs $5$10" }]);
  });

  test("display formulas on lines of their own are read as math lines", () => {
    const reader = new TailReader();
    const kinds = ["$$", "\\sum_i x", "$$", "after"].map((line) => reader.read(line));
    assert.deepEqual(kinds, [
      { kind: "math", text: "" },
      { kind: "math", text: "\\sum_i x" },
      { kind: "math", text: "" },
      { kind: "text", text: "after" },
    ]);
  });

  test("the preview shows symbols, fractions and scripts as text, never markup", () => {
    assert.deepEqual(texPreview("x_i^2 + \\frac{a}{b}"), [
      { text: "x" },
      { text: "i", sub: true },
      { text: "2", sup: true },
      { text: " + a/b" },
    ]);
    assert.deepEqual(texPreview("\\sum_{i=1}^{n} \\alpha \\le \\sqrt{2}"), [
      { text: "∑" },
      { text: "i=1", sub: true },
      { text: "n", sup: true },
      { text: " α ≤ √2" },
    ]);
    assert.deepEqual(texPreview("\\frac{n+1}{2} <b>"), [{ text: "(n+1)/2 <b>" }]);
    assert.deepEqual(texPreview("\\unknown{x} \\{"), [{ text: "unknownx {" }]);
  });
});

describe("dropCodePoints", () => {
  test("it counts an astral character as one, like the server", () => {
    assert.deepEqual(dropCodePoints("😀ab", 1), { rest: "ab", missing: 0 });
    assert.deepEqual(dropCodePoints("a😀b", 2), { rest: "b", missing: 0 });
  });

  test("it says how many it could not drop", () => {
    assert.deepEqual(dropCodePoints("abc", 5), { rest: "", missing: 2 });
    assert.deepEqual(dropCodePoints("abc", 0), { rest: "abc", missing: 0 });
  });
});

describe("TailReader nested list items", () => {
  test("an item indented to the text of the item above nests in it, as markdown-it nests it", () => {
    // From `/markdown 2000`: "  - …" under "- …" showed top-level while streaming and became a
    // sub-item after Stop (new-user review).
    const reader = new TailReader();
    assert.deepEqual(reader.read("- first"), { kind: "bullet", text: "first" });
    assert.deepEqual(reader.read("  - inner"), { kind: "bullet", text: "inner", depth: 1 });
    assert.deepEqual(reader.read("    - deeper"), { kind: "bullet", text: "deeper", depth: 2 });
    assert.deepEqual(reader.read("- second"), { kind: "bullet", text: "second" });
  });

  test("an ordered item's text starts further right: two spaces are not enough to nest", () => {
    const reader = new TailReader();
    reader.read("1. step");
    assert.deepEqual(reader.read("   - detail"), { kind: "bullet", text: "detail", depth: 1 });
    assert.deepEqual(reader.read("  - next list"), { kind: "bullet", text: "next list" });
  });

  test("the line being written does not open an item; a heading ends the items", () => {
    const reader = new TailReader();
    reader.read("- a", false);
    assert.deepEqual(reader.read("  - b"), { kind: "bullet", text: "b" }); // "- a" was not complete
    reader.read("- a");
    reader.read("## Next");
    assert.deepEqual(reader.read("  - c"), { kind: "bullet", text: "c" });
  });

  test("lazy text stays in the item; indented code past every item is not an item", () => {
    const reader = new TailReader();
    reader.read("- a");
    reader.read("goes on");
    assert.deepEqual(reader.read("  - b"), { kind: "bullet", text: "b", depth: 1 });
    const fresh = new TailReader();
    assert.equal(fresh.read("    - code").kind, "text");
  });
});
