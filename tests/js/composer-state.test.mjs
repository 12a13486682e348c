// Tests for static/chat/composer-state.js: which composer controls work, and what its status
// line says, for each state of the page.
//
// Run with `node --test tests/js/` (node 20, no npm packages).

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { canStartTurn, composerState } from "../../static/chat/composer-state.js";

const idle = { streaming: false, connected: true, offline: false, awaiting: false };

describe("composerState", () => {
  test("connected and idle, everything works and the status line is empty", () => {
    assert.deepEqual(composerState(idle), {
      sendDisabled: false,
      stopHidden: true,
      status: "",
    });
  });

  test("while an answer streams the box stays open, Send waits and Stop shows", () => {
    const view = composerState({ ...idle, streaming: true });
    assert.equal(view.sendDisabled, true);
    assert.equal(view.stopHidden, false);
    assert.equal(
      view.status,
      "Answering… Enter works when it ends · Esc stops",
    );
  });

  test("on a touch screen the streaming line speaks of Send, not Enter", () => {
    const view = composerState({ ...idle, streaming: true, touch: true });
    assert.equal(view.status, "Answering… Send works once this answer ends.");
  });

  test("while a prompt is on its way Send waits but the box stays usable", () => {
    const view = composerState({ ...idle, awaiting: true });
    assert.equal(view.sendDisabled, true);
    assert.equal(view.status, "Sending…");
  });

  test("disconnected, Send waits and the line says the message is kept", () => {
    const view = composerState({ ...idle, connected: false });
    assert.equal(view.sendDisabled, true);
    assert.equal(view.status, "Connection lost, reconnecting… Your message is kept.");
  });

  test("a first connection is not a lost one", () => {
    const view = composerState({ ...idle, connected: false, connecting: true });
    assert.equal(view.sendDisabled, true);
    assert.equal(view.status, "Connecting…");
  });

  test("offline says so, whether connected was last heard or not", () => {
    for (const connected of [false, true]) {
      assert.equal(
        composerState({ ...idle, connected, offline: true }).status,
        "You are offline. Your message is kept; send it when you are back online.",
      );
    }
  });

  test("a streaming answer that lost its socket says it goes on at the server", () => {
    assert.equal(
      composerState({ ...idle, streaming: true, connected: false }).status,
      "Reconnecting… The answer goes on at the server.",
    );
    assert.equal(
      composerState({ ...idle, streaming: true, connected: false, offline: true }).status,
      "Offline. The answer shows when you are back.",
    );
  });

  test("a Stop pressed while the socket is down says it will stop when reconnected", () => {
    assert.equal(
      composerState({ ...idle, streaming: true, connected: false, offline: true, stopKept: true })
        .status,
      "Offline. This answer will stop when reconnected.",
    );
    assert.equal(
      composerState({ ...idle, streaming: true, connected: false, stopKept: true }).status,
      "Reconnecting… This answer will stop when reconnected.",
    );
  });

  test("streaming says more than a prompt on its way", () => {
    // A regeneration's shell arrives while the page still waits: the answer is what matters.
    assert.equal(
      composerState({ ...idle, streaming: true, awaiting: true }).status,
      composerState({ ...idle, streaming: true }).status,
    );
  });

  test("Send works only when connected, idle and not waiting", () => {
    for (const streaming of [false, true]) {
      for (const connected of [false, true]) {
        for (const awaiting of [false, true]) {
          const view = composerState({ streaming, connected, offline: false, awaiting });
          assert.equal(view.sendDisabled, !(connected && !streaming && !awaiting));
          assert.equal(view.stopHidden, !streaming);
        }
      }
    }
  });
});

describe("canStartTurn", () => {
  test("a turn starts only when nothing streams and nothing is on its way", () => {
    assert.equal(canStartTurn({ streaming: false, awaiting: false }), true);
    assert.equal(canStartTurn({ streaming: true, awaiting: false }), false);
    assert.equal(canStartTurn({ streaming: false, awaiting: true }), false);
  });
});
