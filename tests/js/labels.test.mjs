// Tests for static/chat/labels.js: the words the page shows for countdowns, alerts and tiers.
//
// Run with `node --test tests/js/` (node 20, no npm packages).

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  alertCountdown,
  connectionLabel,
  countdownText,
  formatSeconds,
  tierBadge,
  tokensLeftAfter,
  tokensLeftText,
  withoutStaticRetryHint,
} from "../../static/chat/labels.js";

describe("formatSeconds", () => {
  test("it says seconds, minutes and hours the short way", () => {
    assert.equal(formatSeconds(0), "0 s");
    assert.equal(formatSeconds(59), "59 s");
    assert.equal(formatSeconds(60), "1 min");
    assert.equal(formatSeconds(125), "2 min 5 s");
    assert.equal(formatSeconds(3600), "1 h");
    assert.equal(formatSeconds(3 * 3600 + 20 * 60 + 7), "3 h 20 min");
  });

  test("it rounds a fraction up and never goes negative", () => {
    assert.equal(formatSeconds(0.2), "1 s");
    assert.equal(formatSeconds(-5), "0 s");
    assert.equal(formatSeconds(NaN), "0 s");
  });
});

describe("countdownText", () => {
  test("it counts down, then says the user can send", () => {
    assert.equal(countdownText(42), "Send again in 42 s.");
    assert.equal(countdownText(0), "You can send again now.");
    assert.equal(countdownText(-3), "You can send again now.");
  });
});

describe("withoutStaticRetryHint", () => {
  test("it drops the server's fixed 'Try again in …' sentence that the countdown replaces", () => {
    assert.equal(
      withoutStaticRetryHint("You can send 1 message per minute. Try again in 59 s."),
      "You can send 1 message per minute.",
    );
  });

  test("it keeps a message without such a sentence, and never empties one", () => {
    const quota = "You have used today's 1,000 tokens. The quota resets at 00:00 UTC (in 3 h).";
    assert.equal(withoutStaticRetryHint(quota), quota);
    assert.equal(withoutStaticRetryHint("Try again in 5 s."), "Try again in 5 s.");
    assert.equal(withoutStaticRetryHint(undefined), "");
  });
});

describe("alertCountdown", () => {
  test("a rate limit or a quota counts down to when the user may send again", () => {
    assert.equal(alertCountdown({ code: "rate_limited", retry_after: 42 }), 42);
    assert.equal(alertCountdown({ code: "quota_exceeded", retry_after: 3600 }), 3600);
  });

  test("the cap on concurrent answers waits for an answer to end, not for a time", () => {
    assert.equal(alertCountdown({ code: "too_many_streams", retry_after: 5 }), 0);
    assert.equal(alertCountdown({ code: "too_many_streams", retry_when: "stream_ends" }), 0);
  });

  test("no retry_after, or a broken one, means no countdown", () => {
    assert.equal(alertCountdown({ code: "upstream_error" }), 0);
    assert.equal(alertCountdown({ code: "rate_limited", retry_after: "soon" }), 0);
    assert.equal(alertCountdown(), 0);
  });
});

describe("tierBadge", () => {
  test("it names the tier and the model, and says why on hover, in words", () => {
    const why = "Chosen because this looks like a phone.";
    const ready = { tier: "lite", model: "demo-lite", device: "phone", reason: "phone", why };
    const words = tierBadge(ready);
    assert.equal(words.tier, "lite");
    assert.equal(words.label, "Lite model · demo-lite");
    assert.equal(words.title, `Lite model · demo-lite — ${why}`);
    assert.ok(words.choosing);
  });

  test("a model picked instead of the device's default is what it names", () => {
    const why = "Chosen because this looks like a desktop or laptop computer.";
    const ready = { tier: "full", model: "demo-full", device: "desktop", reason: "desktop", why };
    const words = tierBadge(ready, { id: "demo-lite", label: "Demo Lite (fast)" });
    assert.equal(words.label, "Demo Lite (fast) · picked");
    assert.equal(words.details[0], "You picked Demo Lite (fast) for this conversation: it answers here.");
    assert.equal(words.details[1], `This device's default is the full model (demo-full). ${why}`);
    // Not the default's praise, nor its tier choice, as if nothing were picked (review).
    assert.ok(words.details.every((line) => !line.includes("best answers")));
    assert.equal(words.choosing, false);
    // Picking the default itself changes nothing.
    const same = tierBadge(ready, { id: "demo-full", label: "Demo Full" });
    assert.equal(same.label, "Full model · demo-full");
    assert.ok(same.choosing);
    assert.ok(same.details.includes("The full model gives the best answers."));
  });

  test("it names the device once when the device is the reason", () => {
    const why = "Chosen because this looks like a phone.";
    const words = tierBadge({ tier: "lite", model: "demo-lite", device: "phone", reason: "phone", why });
    assert.deepEqual(
      words.details.filter((line) => line.includes("phone")),
      [why],
    );
    const saver = tierBadge({
      tier: "lite",
      device: "phone",
      reason: "data saver is on",
      why: "Chosen because data saver is on.",
    });
    assert.ok(saver.details.includes("Chosen because data saver is on."));
    assert.ok(saver.details.includes("Detected device: phone."));
  });

  test("it falls back to the full tier and leaves out what it was not told", () => {
    const words = tierBadge({ tier: "something-new" });
    assert.equal(words.tier, "full");
    assert.equal(words.label, "Full model");
    assert.equal(words.title, "Full model");
    assert.ok(words.details.every((line) => !line.includes("undefined")));
  });
});

describe("tokensLeftText", () => {
  test("it groups thousands and says token or tokens", () => {
    assert.equal(tokensLeftText(199903), "199,903 tokens left today");
    assert.equal(tokensLeftText(1), "1 token left today");
    assert.equal(tokensLeftText(-20), "0 tokens left today");
  });
});

describe("tokensLeftAfter", () => {
  const usage = { prompt_tokens: 30, completion_tokens: 12 };

  test("it shows the server's exact count when the done frame carries one", () => {
    // The server's count includes other tabs' answers, so it can differ from the estimate.
    assert.equal(tokensLeftAfter({ usage, tokens_left: 49_000 }, 50_000), 49_000);
    assert.equal(tokensLeftAfter({ usage, tokens_left: 0 }, 50_000), 0);
  });

  test("it estimates from the answer's usage when the server sends no count", () => {
    assert.equal(tokensLeftAfter({ usage }, 50_000), 49_958);
    assert.equal(tokensLeftAfter({ usage, tokens_left: null }, 50_000), 49_958);
    assert.equal(tokensLeftAfter({ usage }, 10), 0);
    assert.equal(tokensLeftAfter({}, 500), 500);
  });
});

describe("connectionLabel", () => {
  test("it says each socket state in a word or two", () => {
    assert.equal(connectionLabel("connecting"), "Connecting…");
    assert.equal(connectionLabel("connected"), "Connected");
    assert.equal(connectionLabel("reconnecting"), "Reconnecting…");
    assert.equal(connectionLabel("offline"), "Offline");
    assert.equal(connectionLabel("logged-out"), "Logged out");
  });

  test("it shows a state it does not know as it is, and no inherited name", () => {
    assert.equal(connectionLabel("draining"), "draining");
    assert.equal(connectionLabel("toString"), "toString");
  });
});
