// Puts the chunks of one streamed message back in seq order, drops duplicates, and names the gaps.
//
// Pure logic: no DOM, no globals, no timers. answers.js owns the streaming answers on the page
// and asks this buffer what has become renderable. Design notes: docs/decisions/reorder-buffer.md.

/**
 * Orders the chunks of one message by their integer `seq` (0, 1, 2, … per message).
 *
 * Chunks that arrive early wait in a Map keyed by seq; a `next` pointer walks forward over
 * them as the gap before them fills, deleting each one as it is released. Every chunk is
 * therefore stored at most once and released at most once, so a stream of n chunks costs
 * O(n) work in total whatever order it arrives in — nothing is sorted, ever.
 *
 * Input comes from the network, so `push` never throws: a seq that is not a non-negative
 * safe integer, a text that is not a string, or a seq absurdly far ahead of `next` is
 * ignored and `""` is returned.
 */
export class ReorderBuffer {
  /**
   * Chunks that arrived before every lower seq did. Released chunks are deleted, so its
   * size is only ever the out-of-order backlog.
   * @type {Map<number, string>}
   */
  #held = new Map();

  /** The seq that must arrive before anything more can be released. @type {number} */
  #next;

  /** The highest seq accepted so far, or `start - 1` before any. @type {number} */
  #highest;

  /** How far past `next` a seq may be and still be held. @type {number} */
  #window;

  /**
   * @param {number} [start=0] the first seq to wait for. A tab resuming a stream passes the
   *   number of chunks it already shows, so seqs below `start` count as already released.
   * @param {{window?: number}} [options] `window`: a seq at or beyond `next + window` is
   *   ignored (and so stays "missing" until it is resent). It bounds the memory a buggy or
   *   hostile server can make the tab hold, and the length of `missing()`. The default,
   *   2^20 chunks, is far beyond any real answer.
   * @throws {RangeError} if `start` or `window` is not a non-negative / positive integer:
   *   these come from our own code, not the network, so a bad one is a bug worth surfacing.
   */
  constructor(start = 0, { window = 1 << 20 } = {}) {
    if (!Number.isSafeInteger(start) || start < 0) {
      throw new RangeError(`ReorderBuffer start must be a non-negative integer, got ${start}`);
    }
    if (!Number.isSafeInteger(window) || window < 1) {
      throw new RangeError(`ReorderBuffer window must be a positive integer, got ${window}`);
    }
    this.#next = start;
    this.#highest = start - 1;
    this.#window = window;
  }

  /**
   * The next seq this buffer waits for: every seq below it has been released.
   * `next - 1` is the `after` to send in a `resume` frame.
   * @returns {number}
   */
  get next() {
    return this.#next;
  }

  /**
   * The highest seq seen so far (`start - 1` before the first chunk). There is a gap to
   * fill exactly when `highest >= next`, which is the O(1) way to ask "is anything missing?".
   * @returns {number}
   */
  get highest() {
    return this.#highest;
  }

  /**
   * How many chunks are held waiting for a lower seq. 0 whenever the stream is in order.
   * @returns {number}
   */
  get size() {
    return this.#held.size;
  }

  /**
   * Accepts one chunk and returns the text that can now be rendered in order: this chunk's
   * text followed by every held chunk it unblocks, or `""` if it must wait, is a duplicate
   * (already released or already held — the first copy wins), or is invalid.
   * @param {number} seq the chunk's sequence number within its message
   * @param {string} text the chunk's text
   * @returns {string}
   */
  push(seq, text) {
    if (!Number.isSafeInteger(seq) || seq < this.#next || typeof text !== "string") {
      // Also covers negative seqs: #next is never below 0.
      return "";
    }
    if (seq !== this.#next) {
      if (seq - this.#next >= this.#window || this.#held.has(seq)) return "";
      this.#held.set(seq, text);
      if (seq > this.#highest) this.#highest = seq;
      return "";
    }
    // seq === next. Invariant: #next is never in #held (we drain through it below), so
    // this cannot be a duplicate of a held chunk.
    if (seq > this.#highest) this.#highest = seq;
    this.#next = seq + 1;
    if (this.#held.size === 0) return text; // the in-order fast path: no allocation
    /** @type {string[]} */
    const parts = [text];
    let held = this.#held.get(this.#next);
    while (held !== undefined) {
      parts.push(held);
      this.#held.delete(this.#next); // released chunks keep no memory
      this.#next += 1;
      held = this.#held.get(this.#next);
    }
    return parts.length === 1 ? text : parts.join("");
  }

  /**
   * The seqs between `next` and `highest` that have not arrived, ascending — what a
   * `resume` should bring back. Costs O(highest - next), the size of the gap range, and at
   * most stops after `limit` seqs.
   * @param {number} [limit=Infinity] return at most this many (the lowest ones)
   * @returns {number[]}
   */
  missing(limit = Infinity) {
    /** @type {number[]} */
    const gaps = [];
    for (let seq = this.#next; seq <= this.#highest && gaps.length < limit; seq += 1) {
      if (!this.#held.has(seq)) gaps.push(seq);
    }
    return gaps;
  }
}
