// Tests for static/chat/backoff.js: reconnect delays grow exponentially, stay capped, and jitter.
//
// Run with `node --test tests/js/` (node 20, no npm packages).

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  BACKOFF_BASE_MS,
  BACKOFF_MAX_MS,
  nextReconnect,
  RESUME_RETRY_DEFAULT_S,
  RESUME_RETRY_JITTER_MS,
  reconnectDelay,
  resumeRetryDelay,
} from "../../static/chat/backoff.js";

const almostOne = () => 0.999999;

describe("reconnectDelay", () => {
  test("it waits at most the base delay before the first retry", () => {
    assert.ok(reconnectDelay(0, { random: almostOne }) < BACKOFF_BASE_MS);
    assert.ok(reconnectDelay(0, { random: almostOne }) >= BACKOFF_BASE_MS - 1);
  });

  test("it doubles the longest possible wait with each failed attempt", () => {
    const longest = (n) => reconnectDelay(n, { base: 100, max: 1e9, random: almostOne });
    assert.deepEqual([0, 1, 2, 3, 4].map(longest), [99, 199, 399, 799, 1599]);
  });

  test("it never waits longer than the cap, however many attempts failed", () => {
    for (const n of [10, 20, 50, 1000, Number.MAX_SAFE_INTEGER, Infinity]) {
      const delay = reconnectDelay(n, { random: almostOne });
      assert.ok(delay < BACKOFF_MAX_MS, `attempt ${n} waits ${delay}`);
      assert.ok(Number.isFinite(delay));
    }
  });

  test("it spreads the waits uniformly below the cap (full jitter)", () => {
    assert.equal(reconnectDelay(3, { base: 100, max: 1e9, random: () => 0 }), 0);
    assert.equal(reconnectDelay(3, { base: 100, max: 1e9, random: () => 0.5 }), 400);
  });

  test("it treats a nonsense attempt count as the first attempt", () => {
    for (const n of [-1, NaN, undefined, "x"]) {
      assert.equal(reconnectDelay(n, { base: 100, random: () => 0.5 }), 50);
    }
  });

  test("it uses Math.random by default and stays in range", () => {
    for (let i = 0; i < 1000; i++) {
      const delay = reconnectDelay(2);
      assert.ok(delay >= 0 && delay < BACKOFF_BASE_MS * 4);
      assert.ok(Number.isInteger(delay));
    }
  });
});

describe("nextReconnect", () => {
  test("online, it waits a jittered backoff and says it is reconnecting", () => {
    assert.deepEqual(nextReconnect(3, { random: () => 0.5 }), {
      delay: reconnectDelay(3, { random: () => 0.5 }),
      connection: "reconnecting",
    });
  });

  test("offline, it waits the longest delay and says so: the online event comes sooner", () => {
    for (const attempt of [0, 1, 7]) {
      assert.deepEqual(nextReconnect(attempt, { offline: true }), {
        delay: BACKOFF_MAX_MS,
        connection: "offline",
      });
    }
  });
});

describe("resumeRetryDelay", () => {
  test("a refused resume is asked again after the frame's retry_after, never sooner", () => {
    assert.equal(resumeRetryDelay(7, { random: () => 0 }), 7000);
    assert.equal(resumeRetryDelay(1, { random: () => 0 }), 1000);
  });

  test("it adds at most a second of jitter, so a user's tabs do not ask together", () => {
    const most = resumeRetryDelay(3, { random: almostOne });
    assert.ok(most > 3000 && most <= 3000 + RESUME_RETRY_JITTER_MS, `${most}`);
    assert.equal(resumeRetryDelay(3, { random: () => 0.5 }), 3500);
  });

  test("a missing or nonsensical retry_after waits the default instead of spinning", () => {
    for (const bad of [undefined, null, 0, -4, "soon", NaN, Infinity, {}]) {
      assert.equal(resumeRetryDelay(bad, { random: () => 0 }), RESUME_RETRY_DEFAULT_S * 1000);
    }
    assert.equal(resumeRetryDelay("12", { random: () => 0 }), 12000);
  });
});

describe("nextReconnect after a refused handshake", () => {
  test("it waits at least the retry_after the server said, however few attempts failed", () => {
    const next = nextReconnect(0, { retryAfter: 12, random: () => 0 });
    assert.deepEqual(next, { delay: 12000, connection: "reconnecting" });
    const jittered = nextReconnect(0, { retryAfter: 12, random: almostOne });
    assert.ok(jittered.delay >= 12000 && jittered.delay <= 12000 + RESUME_RETRY_JITTER_MS);
  });

  test("a longer backoff is kept, and no usable retry_after changes nothing", () => {
    const backoff = nextReconnect(10, { random: () => 0.9 }).delay;
    assert.equal(nextReconnect(10, { retryAfter: 1, random: () => 0.9 }).delay, backoff);
    for (const bad of [undefined, 0, -1, "x", NaN]) {
      assert.equal(
        nextReconnect(2, { retryAfter: bad, random: () => 0.5 }).delay,
        nextReconnect(2, { random: () => 0.5 }).delay,
      );
    }
  });

  test("offline still waits for the network, not for the server", () => {
    assert.deepEqual(nextReconnect(0, { offline: true, retryAfter: 3 }), {
      delay: BACKOFF_MAX_MS,
      connection: "offline",
    });
  });
});
