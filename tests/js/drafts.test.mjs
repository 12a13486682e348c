// Tests for static/chat/drafts.js: the prompt box's unsent drafts, one per conversation and one
// for the new chat, kept in the tab's storage under their owner, and forgotten when the tab
// changes hands.
//
// Run with `node --test tests/js/` (node 20, no npm packages).

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  draftKey,
  forgetAll,
  forgetOthers,
  loadDraft,
  ownedKey,
  saveDraft,
} from "../../static/chat/drafts.js";

const ALICE = "a11ce0000000000a";
const BOB = "b0b0000000000b0b";

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
    saveDraft(storage, ALICE, "c1", "about the first");
    saveDraft(storage, ALICE, "", "a new question");
    assert.equal(loadDraft(storage, ALICE, "c1"), "about the first");
    assert.equal(loadDraft(storage, ALICE, ""), "a new question");
    assert.equal(loadDraft(storage, ALICE, "c2"), "");
    assert.notEqual(draftKey(ALICE, ""), draftKey(ALICE, "c1"));
  });

  test("a draft is kept exactly as typed, new lines and spaces included", () => {
    const storage = new MemoryStorage();
    saveDraft(storage, ALICE, "c1", "  line one\n\nline three  ");
    assert.equal(loadDraft(storage, ALICE, "c1"), "  line one\n\nline three  ");
  });

  test("an emptied box forgets the draft", () => {
    const storage = new MemoryStorage();
    saveDraft(storage, ALICE, "c1", "sent soon");
    saveDraft(storage, ALICE, "c1", "");
    assert.equal(loadDraft(storage, ALICE, "c1"), "");
    assert.equal(storage.length, 0);
  });

  test("forgetAll forgets everything the page keeps, whoever's, and nothing else", () => {
    const storage = new MemoryStorage();
    saveDraft(storage, ALICE, "c1", "one");
    saveDraft(storage, ALICE, "", "three");
    saveDraft(storage, BOB, "c2", "two");
    storage.setItem(ownedKey(ALICE, "deleted-elsewhere"), "{}");
    storage.setItem("something.else", "kept");
    forgetAll(storage);
    assert.deepEqual([...storage.items.keys()], ["something.else"]);
  });

  test("a draft is its owner's: another user of the tab neither sees nor keeps it", () => {
    const storage = new MemoryStorage();
    saveDraft(storage, ALICE, "", "ALICE PRIVATE DRAFT");
    assert.equal(loadDraft(storage, BOB, ""), "");
    assert.notEqual(draftKey(ALICE, ""), draftKey(BOB, ""));
    assert.ok(draftKey(ALICE, "c1").startsWith(`chatsite.${ALICE}.`));
  });

  test("forgetOthers keeps the owner's entries and drops every other chatsite one", () => {
    const storage = new MemoryStorage();
    saveDraft(storage, ALICE, "", "ALICE PRIVATE DRAFT");
    saveDraft(storage, ALICE, "c1", "alice on c1");
    storage.setItem(ownedKey(ALICE, "deleted-elsewhere"), '{"title":"t","text":"alice"}');
    storage.setItem(ownedKey(ALICE, "new-chat-model"), "big");
    saveDraft(storage, BOB, "c9", "bob's own");
    storage.setItem(ownedKey(BOB, "new-chat-model"), "small");
    // Keys of the shape before owners (a tab open across the upgrade) are nobody's.
    storage.setItem("chatsite.draft.new", "old shape");
    storage.setItem("chatsite.deleted-elsewhere", "{}");
    // An owner that begins like another's is not that owner.
    storage.setItem(`chatsite.${BOB}0.draft.new`, "a longer owner");
    storage.setItem("something.else", "not the page's");
    forgetOthers(storage, BOB);
    assert.deepEqual(
      [...storage.items.keys()].sort(),
      [draftKey(BOB, "c9"), ownedKey(BOB, "new-chat-model"), "something.else"].sort(),
    );
    assert.equal(loadDraft(storage, BOB, "c9"), "bob's own");
    forgetOthers(storage, BOB); // again: nothing more goes
    assert.equal(storage.length, 3);
  });

  test("a page without an owner keeps nothing of anyone's", () => {
    const storage = new MemoryStorage();
    saveDraft(storage, ALICE, "", "ALICE PRIVATE DRAFT");
    saveDraft(storage, "", "", "nobody's");
    forgetOthers(storage, "");
    assert.equal(storage.length, 0);
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
    assert.doesNotThrow(() => saveDraft(refusing, ALICE, "c1", "text"));
    assert.doesNotThrow(() => saveDraft(refusing, ALICE, "c1", ""));
    assert.equal(loadDraft(refusing, ALICE, "c1"), "");
    assert.doesNotThrow(() => forgetAll(refusing));
    assert.doesNotThrow(() => forgetOthers(refusing, ALICE));
  });
});
