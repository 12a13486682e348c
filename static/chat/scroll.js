// Keeping the newest text in view: the thread follows the bottom while the reader is there,
// pauses while they scroll up, and offers a "New text below" button meanwhile.
import { messages } from "./thread.js";

const NEAR_BOTTOM_PX = 48;
const jumpButton = document.getElementById("jump");

let followBottom = true;
// Where this script last put the thread (or where the last scroll event found it).
let lastTop = 0;

/** Scroll the thread to `top`, remembering where the script put it. */
function scrollTo(top) {
  messages.scrollTop = top;
  lastTop = messages.scrollTop; // clamped to what the thread allows
}

export function start() {
  messages.addEventListener("scroll", () => {
    // Auto-scroll pauses when the reader scrolls up, and resumes at the bottom. Only a move
    // up counts: a scroll event of this script's own scroll to the bottom can arrive after
    // more text was added, when the thread is no longer near its bottom, and must not read as
    // the reader leaving it (the thread then stopped short of the answer's end).
    const top = messages.scrollTop;
    if (isNearBottom()) followBottom = true;
    else if (top < lastTop) followBottom = false;
    lastTop = top;
    if (followBottom) jumpButton.hidden = true;
  });
  // The thread gets shorter when an alert appears by the prompt box, the box grows a line or
  // a phone's keyboard opens: a reader at the bottom stays there, instead of the newest lines
  // sliding out of view under the alert.
  new ResizeObserver(() => {
    if (followBottom && messages.querySelector("article")) scrollTo(messages.scrollHeight);
  }).observe(messages);
}

// A body shown live is laid out block by block (chat.css: `content-visibility: auto`), so a
// block that was off screen gets its real height only when the browser next finds it near the
// viewport, after the script that scrolled to the bottom ran: the end of the answer would then
// stop short of the bottom (a phone's thread did). A reader at the bottom stays there.
const bottomKeeper = new ResizeObserver((entries) => {
  for (const entry of entries) {
    if (!entry.target.isConnected) bottomKeeper.unobserve(entry.target);
  }
  if (followBottom) scrollTo(messages.scrollHeight);
});

/** Keep the thread at the bottom, while it follows the bottom, when `element` changes size. */
export function keepBottomOf(element) {
  bottomKeeper.observe(element);
}

function isNearBottom() {
  return messages.scrollHeight - messages.scrollTop - messages.clientHeight < NEAR_BOTTOM_PX;
}

export function scrollToBottom() {
  // The first screen (no message yet) has no newest text: it opens at its heading, which on a
  // phone is taller than the screen.
  scrollTo(messages.querySelector("article") ? messages.scrollHeight : 0);
  jumpButton.hidden = true;
}

/** Whether the thread follows new text (the reader has not scrolled up). */
export function following() {
  return followBottom;
}

/** Follow new text again from now on (the reader asked, or sent a prompt). */
export function follow() {
  followBottom = true;
}

/** New text arrived out of view: offer the jump button unless the thread follows anyway. */
export function offerJump() {
  if (!followBottom) jumpButton.hidden = false;
}

/**
 * Keep `element` where it was on screen (`top`, from getBoundingClientRect) after the thread
 * around it changed; whether to follow the bottom is then decided afresh.
 * @param {Element} element
 * @param {number} top
 */
export function keepInPlace(element, top) {
  scrollTo(messages.scrollTop + element.getBoundingClientRect().top - top);
  followBottom = isNearBottom();
  jumpButton.hidden = true;
}
