// Tests for static/chat/dategroups.js: the conversation list's date groups.
//
// Run with `node --test tests/js/` (node 20, no npm packages).

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { daysBetween, groupLabel, PINNED } from "../../static/chat/dategroups.js";

const now = new Date(2026, 11, 1, 0, 30); // 1 December 2026, half past midnight (local)
const daysAgo = (n, hour = 12) => new Date(2026, 11, 1 - n, hour);

describe("groupLabel", () => {
  test("pinned conversations are one group, whatever their date", () => {
    assert.equal(groupLabel(daysAgo(400), now, true), PINNED);
  });
  test("calendar days, not 24-hour spans: late last night is yesterday", () => {
    assert.equal(groupLabel(new Date(2026, 11, 1, 0, 5), now), "Today");
    assert.equal(groupLabel(daysAgo(1, 23), now), "Yesterday");
  });
  test("the last week and the last month, then months", () => {
    assert.equal(groupLabel(daysAgo(2), now), "Previous 7 days");
    assert.equal(groupLabel(daysAgo(7), now), "Previous 7 days");
    assert.equal(groupLabel(daysAgo(8), now), "Previous 30 days");
    assert.equal(groupLabel(daysAgo(30), now), "Previous 30 days");
    assert.equal(groupLabel(new Date(2026, 9, 15), now), "October");
    assert.equal(groupLabel(new Date(2025, 9, 15), now), "October 2025");
  });
  test("a date a little in the future (another clock) is today; no date is older", () => {
    assert.equal(groupLabel(new Date(2026, 11, 1, 9), now), "Today");
    assert.equal(groupLabel(new Date("not a date"), now), "Older");
  });
  test("daysBetween counts midnights crossed", () => {
    assert.equal(daysBetween(daysAgo(3, 23), now), 3);
  });
});
