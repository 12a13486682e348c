// Tests for static/chat/keys.js: Enter sends (not on a touch screen, not while a turn may not
// start), Shift+Enter does not, Escape does the most local thing, Ctrl/Cmd+Shift+O starts a
// new chat.
//
// Run with `node --test tests/js/` (node 20, no npm packages).

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  enterAction,
  enterKeyHint,
  escapeAction,
  isNewChatShortcut,
  keysHint,
} from "../../static/chat/keys.js";

describe("enterAction", () => {
  test("Enter sends", () => {
    assert.equal(enterAction({ key: "Enter" }), "send");
    assert.equal(enterAction({ key: "Enter", shiftKey: false, isComposing: false }, {}), "send");
  });

  test("Shift+Enter makes a new line instead", () => {
    assert.equal(enterAction({ key: "Enter", shiftKey: true }), null);
  });

  test("Enter that ends an IME composition does not send", () => {
    assert.equal(enterAction({ key: "Enter", isComposing: true }), null);
  });

  test("other keys do not send", () => {
    for (const key of ["a", " ", "Escape", "Tab"]) {
      assert.equal(enterAction({ key }), null, key);
    }
  });

  test("on a touch screen Return always makes a new line: the Send button sends", () => {
    assert.equal(enterAction({ key: "Enter" }, { touch: true }), null);
    assert.equal(enterAction({ key: "Enter" }, { touch: true, busy: true }), null);
  });

  test("while a turn may not start, Enter holds: nothing is sent and the text stays", () => {
    assert.equal(enterAction({ key: "Enter" }, { busy: true }), "hold");
    // Shift+Enter still makes its new line while an answer streams.
    assert.equal(enterAction({ key: "Enter", shiftKey: true }, { busy: true }), null);
  });
});

describe("enterKeyHint", () => {
  test("the on-screen Return key says what it does", () => {
    assert.equal(enterKeyHint({ touch: true }), "enter");
    assert.equal(enterKeyHint({ touch: false }), "send");
  });
});

describe("keysHint", () => {
  test("each device is told what its own keys do", () => {
    assert.equal(keysHint({ touch: false }).short, "Enter sends · Shift+Enter new line");
    assert.match(keysHint({ touch: false }).long, /Esc stops an answer/);
    assert.equal(keysHint({ touch: true }).short, "Return: new line · tap Send to send");
    assert.doesNotMatch(keysHint({ touch: true }).long, /Shift\+Enter|Esc|Ctrl/);
  });

  test("while editing, the hint under the box names the button as it then reads", () => {
    assert.match(keysHint({ touch: true }).shortEditing, /tap Save & send$/);
    assert.match(keysHint({ touch: false }).shortEditing, /^Enter saves & sends/);
  });

  test("editing names Esc only where there is an Esc key", () => {
    assert.match(keysHint({ touch: false }).editing, /Esc or Cancel to stop editing$/);
    assert.match(keysHint({ touch: true }).editing, /Tap Cancel to stop editing$/);
    assert.doesNotMatch(keysHint({ touch: true }).editing, /Esc/);
  });
});

describe("escapeAction", () => {
  const none = { drawerOpen: false, streaming: false, editing: false };

  test("it does nothing when there is nothing to close or stop", () => {
    assert.equal(escapeAction(none), null);
  });

  test("it closes a conversation's menu first, whatever else is going on", () => {
    const everything = { menuOpen: true, drawerOpen: true, streaming: true, editing: true };
    assert.equal(escapeAction(everything), "close-menu");
  });

  test("it closes the drawer next", () => {
    const everything = { drawerOpen: true, streaming: true, editing: true };
    assert.equal(escapeAction(everything), "close-drawer");
  });

  test("it stops a streaming answer before it leaves edit mode", () => {
    assert.equal(escapeAction({ ...none, streaming: true, editing: true }), "stop");
  });

  test("it leaves edit mode when nothing streams", () => {
    assert.equal(escapeAction({ ...none, editing: true }), "cancel-edit");
  });
});

describe("isNewChatShortcut", () => {
  test("Ctrl+Shift+O and Cmd+Shift+O start a new chat", () => {
    assert.equal(isNewChatShortcut({ key: "O", shiftKey: true, ctrlKey: true }), true);
    assert.equal(isNewChatShortcut({ key: "o", shiftKey: true, metaKey: true }), true);
  });

  test("without Shift, or without Ctrl or Cmd, O is just a letter", () => {
    assert.equal(isNewChatShortcut({ key: "o", ctrlKey: true }), false);
    assert.equal(isNewChatShortcut({ key: "O", shiftKey: true }), false);
    assert.equal(isNewChatShortcut({ key: "p", shiftKey: true, ctrlKey: true }), false);
  });
});
