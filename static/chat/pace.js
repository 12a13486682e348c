// pace.js — how much rendered HTML the page places in one animation frame while an answer
// streams faster than it can be laid out. What a frame places is laid out, styled and shaped
// by the browser after the script's part of the frame, so a time budget for the script alone
// does not bound the frame: a budget in characters of HTML does. It is measured, not guessed:
// when a frame left blocks for the next one, the next frame comes as soon as the first one's
// work is done, so the time between the two is what the characters placed cost on this
// device; the budget then aims at a frame of `target` ms (docs/decisions/live-rendering.md).

export const PACE = Object.freeze({
  min: 1_000, // characters of HTML; at least one block is always placed
  start: 12_000,
  max: 512_000,
  target: 40, // ms a frame that places blocks should take: under a long task's 50
  grow: 2, // at most this many times the last budget from one frame to the next
});

export class Pace {
  constructor(limits = PACE) {
    this.limits = limits;
    this.chars = limits.start;
    this.last = null; // { now, placed } of the previous frame, when it left blocks for this one
  }

  /**
   * A frame with blocks to place begins.
   * @param {number} now the frame's time (the requestAnimationFrame timestamp, ms)
   * @returns {number} characters of HTML to place in it
   */
  frame(now) {
    const last = this.last;
    this.last = null;
    if (last && last.placed > 0 && now > last.now) {
      const { min, max, target, grow } = this.limits;
      const aim = (last.placed * target) / (now - last.now);
      // Halfway to what the last frame's cost says, so one odd frame does not swing it.
      const next = Math.min((this.chars + aim) / 2, this.chars * grow);
      this.chars = Math.round(Math.max(min, Math.min(max, next)));
    }
    return this.chars;
  }

  /**
   * The frame that began at `now` placed `placed` characters and left blocks for the next one:
   * the next frame's time says what they cost.
   */
  behind(now, placed) {
    this.last = { now, placed };
  }
}
