// Tests for static/chat/drafts.js: the prompt box's unsent drafts, one per conversation and one
// for the new chat, kept in the tab's storage.
//
// Run with `node --test tests/js/` (node 20, no npm packages).

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { clearDrafts, draftKey, loadDraft, saveDraft } from "../../static/chat/drafts.js";

/** A Storage as sessionStorage behaves (strings in, strings out, `length` and `key`). */
class MemoryStorage {
  constructor() {
    this.items = new Map();
  }
  get length() {
    return this.items.size;
  }
  key(i) {
    return [...this.items.keys()][i] ?? null;
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

describe("drafts", () => {
  test("each conversation has its own draft, and the new chat one too", () => {
    const storage = new MemoryStorage();
    saveDraft(storage, "c1", "about the first");
    saveDraft(storage, "", "a new question");
    assert.equal(loadDraft(storage, "c1"), "about the first");
    assert.equal(loadDraft(storage, ""), "a new question");
    assert.equal(loadDraft(storage, "c2"), "");
    assert.notEqual(draftKey(""), draftKey("c1"));
  });

  test("a draft is kept exactly as typed, new lines and spaces included", () => {
    const storage = new MemoryStorage();
    saveDraft(storage, "c1", "  line one\n\nline three  ");
    assert.equal(loadDraft(storage, "c1"), "  line one\n\nline three  ");
  });

  test("an emptied box forgets the draft", () => {
    const storage = new MemoryStorage();
    saveDraft(storage, "c1", "sent soon");
    saveDraft(storage, "c1", "");
    assert.equal(loadDraft(storage, "c1"), "");
    assert.equal(storage.length, 0);
  });

  test("clearDrafts forgets every draft and nothing else", () => {
    const storage = new MemoryStorage();
    saveDraft(storage, "c1", "one");
    saveDraft(storage, "c2", "two");
    saveDraft(storage, "", "three");
    storage.setItem("something.else", "kept");
    clearDrafts(storage);
    assert.deepEqual([...storage.items.keys()], ["something.else"]);
  });

  test("a storage that refuses loses the draft, never the page", () => {
    const refusing = {
      length: 1,
      key() {
        throw new Error("SecurityError");
      },
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
    assert.doesNotThrow(() => saveDraft(refusing, "c1", "text"));
    assert.doesNotThrow(() => saveDraft(refusing, "c1", ""));
    assert.equal(loadDraft(refusing, "c1"), "");
    assert.doesNotThrow(() => clearDrafts(refusing));
  });
});
