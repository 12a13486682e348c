// Tests for static/chat/deletion.js: a conversation deleted in another tab or browser — what the
// page does, what it says, and what it carries across the reload to the new chat.
//
// Run with `node --test tests/js/` (node 20, no npm packages).

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  deletedNotice,
  deletionOutcome,
  handOff,
  handoffKey,
  takeHandoff,
} from "../../static/chat/deletion.js";

const OWNER = "0123456789abcdef";
const HANDOFF_KEY = handoffKey(OWNER);

/** A Storage as sessionStorage behaves (strings in, strings out), in memory. */
class MemoryStorage {
  constructor() {
    this.items = new Map();
  }
  getItem(key) {
    return this.items.has(key) ? this.items.get(key) : null;
  }
  setItem(key, value) {
    this.items.set(key, String(value));
  }
  removeItem(key) {
    this.items.delete(key);
  }
}

describe("deletionOutcome", () => {
  test("the open conversation deleted elsewhere makes the page a new chat", () => {
    assert.equal(deletionOutcome({ deleted: "7", open: "7", here: false }), "reset");
  });

  test("another conversation only leaves the list, also on a new chat's page", () => {
    assert.equal(deletionOutcome({ deleted: "7", open: "8", here: false }), "drop");
    assert.equal(deletionOutcome({ deleted: "7", open: "", here: false }), "drop");
  });

  test("a deletion this page asked for is left to its own response", () => {
    // The response removes the list entry and loads a new chat: acting twice would say
    // "deleted in another tab" about the reader's own click.
    assert.equal(deletionOutcome({ deleted: "7", open: "7", here: true }), "ignore");
    assert.equal(deletionOutcome({ deleted: "7", open: "8", here: true }), "ignore");
  });

  test("a frame without a conversation changes nothing", () => {
    assert.equal(deletionOutcome({ deleted: "", open: "", here: false }), "ignore");
    assert.equal(deletionOutcome({ deleted: undefined, open: "", here: false }), "ignore");
  });
});

describe("deletedNotice", () => {
  test("it names the conversation and says the typed text is kept", () => {
    assert.equal(
      deletedNotice("Trip plans", true),
      "“Trip plans” was deleted in another tab or window, so this is a new chat. What you had typed is kept.",
    );
  });

  test("without a title or a text it says less", () => {
    assert.equal(
      deletedNotice("", false),
      "This conversation was deleted in another tab or window, so this is a new chat.",
    );
  });
});

describe("handOff and takeHandoff", () => {
  test("what one page hands over, the next takes once", () => {
    const storage = new MemoryStorage();
    handOff(storage, OWNER, { title: "Trip plans", text: "and the train?\nline two" });
    assert.deepEqual(takeHandoff(storage, OWNER), {
      title: "Trip plans",
      text: "and the train?\nline two",
    });
    assert.equal(takeHandoff(storage, OWNER), null); // a later reload shows no notice
    assert.equal(storage.getItem(HANDOFF_KEY), null);
  });

  test("nothing handed over is nothing taken", () => {
    assert.equal(takeHandoff(new MemoryStorage(), OWNER), null);
  });

  test("what one user handed over, another user of the tab never takes", () => {
    const storage = new MemoryStorage();
    handOff(storage, OWNER, { title: "Alice's", text: "private" });
    assert.equal(takeHandoff(storage, "fedcba9876543210"), null);
    assert.match(HANDOFF_KEY, /^chatsite\.0123456789abcdef\./);
  });

  test("something else under the key is dropped, not shown", () => {
    const storage = new MemoryStorage();
    storage.setItem(HANDOFF_KEY, "not json");
    assert.equal(takeHandoff(storage, OWNER), null);
    storage.setItem(HANDOFF_KEY, JSON.stringify({ title: 3, text: ["x"] }));
    assert.deepEqual(takeHandoff(storage, OWNER), { title: "", text: "" });
  });

  test("a storage that refuses loses the notice, not the page", () => {
    const refusing = {
      getItem() {
        throw new Error("SecurityError");
      },
      setItem() {
        throw new Error("QuotaExceededError");
      },
      removeItem() {
        throw new Error("SecurityError");
      },
    };
    assert.doesNotThrow(() => handOff(refusing, OWNER, { title: "t", text: "x" }));
    assert.equal(takeHandoff(refusing, OWNER), null);
  });
});
