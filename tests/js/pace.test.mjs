// Tests for static/chat/pace.js: the HTML placed per frame follows what frames cost on the
// device, stays within its bounds, and only frames that follow each other are timed.
//
// Run with `node --test tests/js/` (node 20, no npm packages).

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { PACE, Pace } from "../../static/chat/pace.js";

/**
 * A device that takes `fixed` ms per frame plus `perK` ms per 1,000 characters placed, at
 * 60 Hz: the next frame comes at the first vsync after the work. Returns each frame's work.
 */
function run(pace, { fixed, perK, frames = 120 }) {
  let now = 0;
  const took = [];
  for (let i = 0; i < frames; i += 1) {
    const chars = pace.frame(now);
    const ms = fixed + (chars / 1000) * perK;
    took.push(ms);
    pace.behind(now, chars);
    now += Math.ceil(ms / 16.667) * 16.667;
  }
  return took;
}

describe("Pace", () => {
  test("starts at the start budget", () => {
    assert.equal(new Pace().frame(1000), PACE.start);
  });

  test("on a slow device, settles on frames under a long task", () => {
    // 10 ms a frame and 8 ms per 1,000 characters: the start budget takes 106 ms.
    const took = run(new Pace(), { fixed: 10, perK: 8 });
    assert.ok(took[0] > 50, "the start budget is too much for this device");
    const settled = took.slice(10);
    assert.ok(Math.max(...settled) < 50, `frames of ${Math.max(...settled)} ms after settling`);
    assert.ok(Math.min(...settled) > 16, "and it does not starve the frames either");
  });

  test("on a fast device, grows to place more per frame, at most doubling", () => {
    const pace = new Pace();
    const took = run(pace, { fixed: 2, perK: 0.2, frames: 40 });
    assert.ok(pace.chars > 4 * PACE.start, `${pace.chars} characters a frame`);
    assert.ok(Math.max(...took) < 50);
    const budgets = [];
    const again = new Pace();
    let now = 0;
    for (let i = 0; i < 10; i += 1) {
      budgets.push(again.frame(now));
      again.behind(now, budgets.at(-1));
      now += 16.667;
    }
    for (let i = 1; i < budgets.length; i += 1) assert.ok(budgets[i] <= 2 * budgets[i - 1]);
  });

  test("stays within its bounds", () => {
    const slow = new Pace();
    run(slow, { fixed: 0, perK: 500, frames: 30 });
    assert.equal(slow.chars, PACE.min);
    const fast = new Pace();
    run(fast, { fixed: 0, perK: 0.001, frames: 60 });
    assert.equal(fast.chars, PACE.max);
  });

  test("only a frame that left blocks behind times the next one", () => {
    const pace = new Pace();
    pace.frame(0); // placed everything: no behind()
    // The next blocks come two seconds later: that wait is not what the frame cost.
    assert.equal(pace.frame(2000), PACE.start);
  });
});
