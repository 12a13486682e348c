// Tests for static/chat/reorder.js: chunks come out in seq order, exactly once, with gaps named.
//
// Run with `node --test tests/js/` (node 20, no npm packages).

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { ReorderBuffer } from "../../static/chat/reorder.js";

/**
 * mulberry32: a tiny seeded PRNG, so a failing property case can be replayed from its seed.
 * @param {number} seed
 * @returns {() => number} uniform floats in [0, 1)
 */
function prng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** @param {() => number} rand @param {number} n @returns {number} an integer in [0, n) */
const below = (rand, n) => Math.floor(rand() * n);

/** Fisher–Yates, in place. @template T @param {() => number} rand @param {T[]} items */
function shuffle(rand, items) {
  for (let i = items.length - 1; i > 0; i -= 1) {
    const j = below(rand, i + 1);
    [items[i], items[j]] = [items[j], items[i]];
  }
  return items;
}

/** Distinct texts per seq, so a chunk released twice or out of place shows in the output. */
const textOf = (seq) => `<${seq}>`;

/**
 * Counts calls to Map.prototype.get/has/set/delete while `fn` runs. The buffer's held map is
 * private, so counting at the prototype is how a test sees how much work it does without
 * timing anything (timings would make the test flaky on a slow machine).
 * @param {() => void} fn
 * @returns {number}
 */
function countMapOperations(fn) {
  const names = ["get", "has", "set", "delete"];
  const originals = names.map((name) => Map.prototype[name]);
  let count = 0;
  names.forEach((name, i) => {
    const original = originals[i];
    Map.prototype[name] = function counted(...args) {
      count += 1;
      return original.apply(this, args);
    };
  });
  try {
    fn();
  } finally {
    names.forEach((name, i) => {
      Map.prototype[name] = originals[i];
    });
  }
  return count;
}

describe("ReorderBuffer in order", () => {
  test("it releases each in-order chunk as soon as it arrives", () => {
    const buffer = new ReorderBuffer();
    assert.equal(buffer.push(0, "Hel"), "Hel");
    assert.equal(buffer.push(1, "lo"), "lo");
    assert.equal(buffer.push(2, "!"), "!");
    assert.equal(buffer.next, 3);
    assert.equal(buffer.highest, 2);
    assert.equal(buffer.size, 0);
    assert.deepEqual(buffer.missing(), []);
  });

  test("it starts empty, waiting for seq 0", () => {
    const buffer = new ReorderBuffer();
    assert.equal(buffer.next, 0);
    assert.equal(buffer.highest, -1);
    assert.equal(buffer.size, 0);
    assert.deepEqual(buffer.missing(), []);
  });

  test("it treats an empty chunk text as a real chunk that advances next", () => {
    const buffer = new ReorderBuffer();
    assert.equal(buffer.push(1, "b"), "");
    assert.equal(buffer.push(0, ""), "b");
    assert.equal(buffer.next, 2);
  });
});

describe("ReorderBuffer out of order", () => {
  test("it holds an early chunk until the gap before it fills, then releases both", () => {
    const buffer = new ReorderBuffer();
    assert.equal(buffer.push(1, "world"), "");
    assert.equal(buffer.size, 1);
    assert.equal(buffer.next, 0);
    assert.equal(buffer.push(0, "hello "), "hello world");
    assert.equal(buffer.next, 2);
    assert.equal(buffer.size, 0);
  });

  test("it releases a run of held chunks in seq order, not arrival order", () => {
    const buffer = new ReorderBuffer();
    assert.equal(buffer.push(3, "d"), "");
    assert.equal(buffer.push(1, "b"), "");
    assert.equal(buffer.push(2, "c"), "");
    assert.equal(buffer.push(5, "f"), "");
    // 0 unblocks 1, 2, 3 but not 5, because 4 is still missing.
    assert.equal(buffer.push(0, "a"), "abcd");
    assert.equal(buffer.next, 4);
    assert.equal(buffer.size, 1);
    assert.equal(buffer.push(4, "e"), "ef");
    assert.equal(buffer.size, 0);
  });
});

describe("ReorderBuffer duplicates", () => {
  test("it drops a chunk that was already released", () => {
    const buffer = new ReorderBuffer();
    buffer.push(0, "a");
    assert.equal(buffer.push(0, "a"), "");
    assert.equal(buffer.next, 1);
  });

  test("it drops a chunk that is already held, keeping the first copy", () => {
    const buffer = new ReorderBuffer();
    assert.equal(buffer.push(1, "first"), "");
    assert.equal(buffer.push(1, "second"), "");
    assert.equal(buffer.size, 1);
    assert.equal(buffer.push(0, "0:"), "0:first");
  });

  test("it drops a replayed run after a resume without repeating text", () => {
    // A resume with `after = next - 1` can race with live chunks already on the wire.
    const buffer = new ReorderBuffer();
    let shown = "";
    for (const [seq, text] of [[0, "a"], [2, "c"], [1, "b"], [2, "c"], [3, "d"], [3, "d"]]) {
      shown += buffer.push(seq, text);
    }
    assert.equal(shown, "abcd");
  });
});

describe("ReorderBuffer.missing", () => {
  test("it lists the seqs missing below the highest seen, ascending", () => {
    const buffer = new ReorderBuffer();
    buffer.push(0, "a");
    buffer.push(7, "h");
    buffer.push(3, "d");
    buffer.push(5, "f");
    assert.deepEqual(buffer.missing(), [1, 2, 4, 6]);
  });

  test("it never lists seqs above the highest seen: it cannot know the end", () => {
    const buffer = new ReorderBuffer();
    buffer.push(2, "c");
    assert.deepEqual(buffer.missing(), [0, 1]);
    assert.equal(buffer.highest, 2);
  });

  test("it shrinks as gaps fill and is empty once the stream is whole", () => {
    const buffer = new ReorderBuffer();
    buffer.push(4, "e");
    buffer.push(2, "c");
    assert.deepEqual(buffer.missing(), [0, 1, 3]);
    buffer.push(0, "a");
    assert.deepEqual(buffer.missing(), [1, 3]);
    buffer.push(3, "d");
    assert.deepEqual(buffer.missing(), [1]);
    buffer.push(1, "b");
    assert.deepEqual(buffer.missing(), []);
  });

  test("it returns at most limit seqs, the lowest ones", () => {
    const buffer = new ReorderBuffer();
    buffer.push(10, "k");
    assert.deepEqual(buffer.missing(3), [0, 1, 2]);
    assert.deepEqual(buffer.missing(0), []);
  });

  test("it does work proportional to the gap range, not to the chunks released before", () => {
    const buffer = new ReorderBuffer();
    for (let seq = 0; seq < 50_000; seq += 1) buffer.push(seq, "x");
    buffer.push(50_010, "y");
    let gaps = [];
    const operations = countMapOperations(() => {
      gaps = buffer.missing();
    });
    assert.deepEqual(gaps, Array.from({ length: 10 }, (_, i) => 50_000 + i));
    // One lookup per seq in [next, highest]: 11 seqs.
    assert.ok(operations <= 11, `missing() made ${operations} map operations`);
  });
});

describe("ReorderBuffer start offset", () => {
  test("it waits for the start seq and treats lower seqs as already released", () => {
    const buffer = new ReorderBuffer(5);
    assert.equal(buffer.next, 5);
    assert.equal(buffer.highest, 4);
    assert.deepEqual(buffer.missing(), []);
    assert.equal(buffer.push(3, "old"), "");
    assert.equal(buffer.size, 0);
    assert.equal(buffer.push(6, "g"), "");
    assert.deepEqual(buffer.missing(), [5]);
    assert.equal(buffer.push(5, "f"), "fg");
    assert.equal(buffer.next, 7);
  });

  test("it rejects a start that is not a non-negative integer, since that is our own bug", () => {
    for (const start of [-1, 1.5, Number.NaN, "3", null, Infinity]) {
      assert.throws(() => new ReorderBuffer(/** @type {any} */ (start)), RangeError);
    }
  });
});

describe("ReorderBuffer bad input from the network", () => {
  const badSeqs = [-1, -0.5, 1.5, Number.NaN, Infinity, -Infinity, "0", "1", null, undefined,
    {}, [], true, 2 ** 53, 10n];

  test("it ignores a seq that is not a non-negative safe integer, without throwing", () => {
    for (const seq of badSeqs) {
      const buffer = new ReorderBuffer();
      assert.equal(buffer.push(/** @type {any} */ (seq), "x"), "", `seq ${String(seq)}`);
      assert.equal(buffer.next, 0);
      assert.equal(buffer.highest, -1);
      assert.equal(buffer.size, 0);
    }
  });

  test("it ignores a chunk whose text is not a string, leaving its seq missing", () => {
    for (const text of [null, undefined, 42, {}, ["a"]]) {
      const buffer = new ReorderBuffer();
      buffer.push(1, "b");
      assert.equal(buffer.push(0, /** @type {any} */ (text)), "");
      assert.equal(buffer.next, 0);
      assert.deepEqual(buffer.missing(), [0]);
      // The real chunk, resent, still gets through.
      assert.equal(buffer.push(0, "a"), "ab");
    }
  });

  test("it ignores a seq too far ahead instead of holding unbounded memory", () => {
    const buffer = new ReorderBuffer(0, { window: 100 });
    assert.equal(buffer.push(100, "too far"), "");
    assert.equal(buffer.size, 0);
    assert.equal(buffer.highest, -1);
    assert.equal(buffer.push(99, "just in"), "");
    assert.equal(buffer.size, 1);
    // The default window keeps a bogus huge seq from making missing() enumerate billions.
    const defaulted = new ReorderBuffer();
    assert.equal(defaulted.push(Number.MAX_SAFE_INTEGER, "x"), "");
    assert.deepEqual(defaulted.missing(), []);
  });
});

describe("ReorderBuffer properties (seeded)", () => {
  test("any permutation with duplicates releases every text exactly once, in order", () => {
    for (let seed = 1; seed <= 500; seed += 1) {
      const rand = prng(seed);
      const n = below(rand, 120);
      const start = below(rand, 3) === 0 ? below(rand, n + 1) : 0;
      const texts = Array.from({ length: n }, (_, seq) => textOf(seq));
      // Arrivals: every seq at least once (those below start were shown before a resume
      // but may be replayed), plus random duplicates anywhere in the sequence.
      const arrivals = shuffle(rand, [
        ...texts.keys(),
        ...Array.from({ length: below(rand, n + 1) }, () => below(rand, Math.max(n, 1))),
      ]).filter((seq) => seq < n);

      const buffer = new ReorderBuffer(start);
      const seen = new Set();
      let shown = "";
      for (const seq of arrivals) {
        const before = buffer.next;
        const released = buffer.push(seq, texts[seq]);
        // What this push releases is exactly the texts of seqs [before, next).
        assert.equal(released, texts.slice(before, buffer.next).join(""), `seed ${seed}`);
        shown += released;
        if (seq >= start) seen.add(seq);
        // missing() matches a brute-force model of the seqs seen so far.
        const highest = Math.max(start - 1, ...seen);
        const expected = [];
        for (let s = buffer.next; s <= highest; s += 1) if (!seen.has(s)) expected.push(s);
        assert.equal(buffer.highest, highest, `seed ${seed}`);
        assert.deepEqual(buffer.missing(), expected, `seed ${seed}`);
      }
      assert.equal(shown, texts.slice(start).join(""), `seed ${seed}`);
      assert.equal(buffer.next, Math.max(n, start), `seed ${seed}`);
      assert.equal(buffer.size, 0, `seed ${seed}`);
    }
  });

  test("the same seed gives the same arrivals, so a failure can be replayed", () => {
    const a = prng(42);
    const b = prng(42);
    const draws = Array.from({ length: 10 }, () => [a(), b()]);
    for (const [x, y] of draws) assert.equal(x, y);
    assert.notEqual(prng(1)(), prng(2)());
  });
});

describe("ReorderBuffer at scale", () => {
  test("100,000 chunks in reverse order release whole, in linear work, and free memory", () => {
    const n = 100_000;
    const buffer = new ReorderBuffer();
    let shown = "";
    let sortCalls = 0;
    const originalSort = Array.prototype.sort;
    Array.prototype.sort = function counted(...args) {
      sortCalls += 1;
      return originalSort.apply(this, args);
    };
    let operations;
    try {
      operations = countMapOperations(() => {
        for (let seq = n - 1; seq >= 0; seq -= 1) shown += buffer.push(seq, textOf(seq));
      });
    } finally {
      Array.prototype.sort = originalSort;
    }
    assert.equal(shown, Array.from({ length: n }, (_, seq) => textOf(seq)).join(""));
    assert.equal(buffer.next, n);
    assert.equal(buffer.size, 0, "every released chunk is deleted from the held map");
    assert.deepEqual(buffer.missing(), []);
    // Each chunk is held once (has + set) and released once (get + delete), plus one final
    // failed get: about 4n. A buffer that re-sorted or rescanned per push would need ~n^2/2.
    assert.equal(sortCalls, 0);
    assert.ok(operations <= 5 * n, `${operations} map operations for ${n} chunks`);
  });

  test("a long in-order stream holds nothing at any point", () => {
    const buffer = new ReorderBuffer();
    for (let seq = 0; seq < 100_000; seq += 1) {
      assert.equal(buffer.push(seq, "t"), "t");
      if (buffer.size !== 0) assert.fail(`held ${buffer.size} chunks at seq ${seq}`);
    }
  });
});
