// The answers streaming on the page: one watch per answer, chunks put in order (reorder.js),
// gaps asked for again, text and rendered blocks painted once per animation frame (live.js),
// resume after a reconnect, and each answer's end (done, stop, failure).
import { resumeRetryDelay } from "./backoff.js";
import { resumeFrame, stopFrame } from "./frames.js";
import { LiveView } from "./live.js";
import { Pace } from "./pace.js";
import { ReorderBuffer } from "./reorder.js";
import * as scroll from "./scroll.js";
import { send, sendOrKeep } from "./socket.js";
import { articleFor, messages, streamingArticles } from "./thread.js";

const GAP_RESUME_MS = 500; // a gap open this long is asked for again with `resume`

/** One answer this tab shows while it streams. */
class Watch {
  constructor(mid, start = 0) {
    this.mid = mid;
    this.buffer = new ReorderBuffer(start);
    this.pending = []; // released text not yet painted
    this.blocks = []; // block frames not yet painted
    this.live = null; // the LiveView of the answer's body
    this.gapTimer = 0;
  }
}

const watches = new Map(); // mid -> Watch
const dirty = new Set(); // watches with text to paint in the next animation frame
let paintQueued = false;
const started = new Set(); // mids whose turn started while this page was open
const retries = new Map(); // mid -> timer: a refused `resume`, asked again when it ends

/** Watch the answers already streaming when the page loaded (the socket resumes them). */
export function watchPage() {
  for (const article of streamingArticles()) watchFor(article.dataset.mid);
}

/** After (re)connecting: ask for every answer still streaming on the page, from where we are. */
export function resumeAll() {
  for (const timer of retries.values()) clearTimeout(timer); // asked again here, now
  retries.clear();
  for (const article of streamingArticles()) {
    const watch = watchFor(article.dataset.mid);
    send(resumeFrame(watch.mid, watch.buffer.next - 1));
  }
}

/** A `chunk` frame. @param {{mid: string, seq: number, text: string}} chunk */
export function onChunk({ mid, seq, text }) {
  const article = articleFor(mid);
  if (!article || article.dataset.status !== "streaming") return;
  const watch = watchFor(mid);
  const released = watch.buffer.push(seq, text);
  if (released) {
    watch.pending.push(released);
    queuePaint(watch);
  }
  if (watch.buffer.highest >= watch.buffer.next) {
    // A gap: chunks after it arrived first. Ask again if it does not close by itself.
    if (!watch.gapTimer) {
      watch.gapTimer = setTimeout(() => {
        watch.gapTimer = 0;
        if (watch.buffer.highest >= watch.buffer.next) {
          send(resumeFrame(mid, watch.buffer.next - 1));
        }
      }, GAP_RESUME_MS);
    }
  } else if (watch.gapTimer) {
    clearTimeout(watch.gapTimer);
    watch.gapTimer = 0;
  }
}

/** A `block` frame: a final block of the answer, rendered (docs/protocol.md). */
export function onBlock(frame) {
  const article = articleFor(frame.mid);
  if (!article || article.dataset.status !== "streaming") return;
  const watch = watchFor(frame.mid);
  watch.blocks.push(frame);
  queuePaint(watch);
}

/**
 * An HTML frame without the content of the bodies this tab will keep (`onOobBeforeSwap`): that content
 * is the blocks it placed, so parsing it again (thousands of elements at the end of a long
 * answer) would only be thrown away. The body's own tag stays, with its `data-blocks`. Only
 * the shape the server makes (chat/bubbles.py) is cut; anything else is left whole.
 * @param {string} html
 */
export function withoutKeptBodies(html) {
  for (const watch of watches.values()) {
    const live = watch.live;
    if (!live?.placed || !live.body.isConnected) continue;
    const article = html.indexOf(` id="msg-${watch.mid}"`);
    if (article < 0) continue;
    const open = `<div class="body markdown" data-blocks="${live.placed}" aria-busy="false">`;
    const start = html.indexOf(open, article);
    const footer = start < 0 ? -1 : html.indexOf('<div class="msg-footer">', start);
    const close = footer < 0 ? -1 : html.lastIndexOf("</div>", footer);
    if (close < start + open.length) continue;
    html = html.slice(0, start + open.length) + html.slice(close);
  }
  return html;
}

/**
 * `htmx:oobBeforeSwap`: the final HTML of an answer whose new body is exactly the blocks this
 * tab placed (`data-blocks`) is merged into the answer in place instead of replacing it: the
 * body the reader was looking at stays where it is, untouched (nothing already rendered is
 * replaced or moves at the end), and the answer's other parts (footer, details) and attributes
 * become the final ones. Replacing the article instead made htmx clean up every element of the
 * body (an event per element: 9,400 at the end of a 20,000-token answer) and the browser lay
 * out the moved body again from scratch: together one long task of ~0.7 s (docs/benchmarks.md).
 * @param {CustomEvent} event
 */
export function onOobBeforeSwap(event) {
  const { target, fragment } = event.detail;
  const fresh = fragment?.firstElementChild;
  if (!fresh?.matches("article.msg-assistant") || fresh.dataset.status === "streaming") return;
  const live = watches.get(target.dataset?.mid)?.live;
  if (!live?.placed || live.body.parentElement !== target) return;
  const freshBody = fresh.querySelector(":scope > .body");
  if (!freshBody || freshBody.dataset.blocks !== String(live.placed)) return;
  event.detail.shouldSwap = false;
  live.close();
  const body = live.body;
  body.dataset.blocks = freshBody.dataset.blocks;
  body.setAttribute("aria-busy", "false");
  for (const child of [...target.childNodes]) if (child !== body) child.remove();
  let beforeBody = true;
  for (const child of [...fresh.childNodes]) {
    if (child === freshBody) beforeBody = false;
    else if (beforeBody) body.before(child);
    else target.append(child);
  }
  for (const name of target.getAttributeNames()) {
    if (!fresh.hasAttribute(name)) target.removeAttribute(name);
  }
  for (const name of fresh.getAttributeNames()) target.setAttribute(name, fresh.getAttribute(name));
  for (const child of target.children) if (child !== body) window.htmx.process(child);
}

/**
 * A `done` frame: the answer ends with the frame's status.
 * @returns {boolean} whether its turn started while this page was open (so the usage meter
 *   counts it)
 */
export function onDone(frame, asking = () => {}) {
  const watch = watches.get(frame.mid);
  const retrying = retries.has(frame.mid);
  forget(frame.mid);
  const article = articleFor(frame.mid);
  if (article && article.dataset.status === "streaming") {
    if ((watch?.buffer.next ?? 0) < frame.seq) {
      // It ended before this tab had all of it (its resume was refused, then Stop): the
      // saved answer is asked for, and its final HTML ends it here, whole.
      asking();
      send(resumeFrame(frame.mid, -1));
      return started.delete(frame.mid);
    }
    // The final HTML did not come (e.g. the conversation was deleted): paint what we have.
    if (watch) paintWatch(watch, article);
    article.dataset.status = frame.status;
    article.querySelector(".body")?.setAttribute("aria-busy", "false");
  }
  if (retrying) asking(); // a refused resume of it is not asked again: it ended
  return started.delete(frame.mid);
}

/**
 * An `error` frame. `not_found` for an answer means it is gone; it streams no more.
 * `rate_limited` for an answer this page shows streaming is a refused `resume` (the user's
 * answers were sent again too often: CHAT_RESUME_RATE): the answer keeps what it shows, and
 * is asked for again, from where it then is, once `retry_after` has passed (or at once by the
 * next socket's `resumeAll`). Nothing is lost: the server keeps every chunk of it.
 * @param {{code?: string, mid?: string, retry_after?: number}} frame
 * @param {() => void} [asking] called when the refused resume is sent again
 * @returns {boolean} whether the frame was a refused resume that this page asks again
 */
export function onError(frame, asking = () => {}) {
  const mid = frame.mid;
  if (!mid) return false;
  const article = articleFor(mid);
  const streaming = article?.dataset.status === "streaming";
  if (frame.code === "not_found") {
    forget(mid);
    if (streaming) article.dataset.status = "failed";
    return false;
  }
  if (frame.code !== "rate_limited" || !(streaming || isEmpty(article))) return false;
  clearTimeout(retries.get(mid));
  const timer = setTimeout(() => {
    retries.delete(mid);
    asking();
    const now = articleFor(mid);
    // Not sent while the socket is down: the next socket's `ready` resumes every answer.
    if (now?.dataset.status === "streaming") {
      send(resumeFrame(mid, watchFor(mid).buffer.next - 1));
    } else if (isEmpty(now)) {
      send(resumeFrame(mid, -1)); // an answer that failed at once (`followNew`): its error
    }
  }, resumeRetryDelay(frame.retry_after));
  retries.set(mid, timer);
  return true;
}

/** A finished answer shown without any text: its final HTML never came to this tab. */
function isEmpty(article) {
  const body = article?.querySelector(".body");
  return Boolean(body) && article.dataset.status !== "streaming" && !body.childNodes.length;
}

/**
 * After an HTML frame: follow every answer shell new on the page. Another tab's answer
 * (`data-watch`) is asked for from its first chunk; one that finished before this tab heard of
 * it comes rendered, unless it has no text at all (failed at once), which is asked for so its
 * final state shows.
 * @returns {boolean} whether a new shell is not marked for watchers: the shell of the turn
 *   this tab asked for, if it asked for one
 */
export function followNew() {
  let unmarked = false;
  for (const article of streamingArticles()) {
    const mid = article.dataset.mid;
    if (watches.has(mid)) continue;
    const watch = watchFor(mid);
    started.add(mid);
    // An answer going on with its open block (Continue): previewed now, before any chunk.
    const body = article.querySelector(":scope > .body");
    if (body?.dataset.open !== undefined) liveFor(watch, body);
    // From its first chunk, or, for an answer going on (Continue), from its `data-next`.
    if (article.dataset.watch) send(resumeFrame(mid, watch.buffer.next - 1));
    else unmarked = true;
  }
  for (const article of messages.querySelectorAll(
    'article.msg-assistant[data-watch]:not([data-status="streaming"])',
  )) {
    article.removeAttribute("data-watch");
    if (!article.querySelector(".body").childNodes.length) {
      send(resumeFrame(article.dataset.mid, -1));
    }
  }
  return unmarked;
}

/**
 * After the whole thread was swapped (a version switch): a switched-to branch may hold an
 * answer still streaming (asked in another tab). Its shell comes empty, so it is followed from
 * its first chunk, even if this tab followed it before.
 */
export function restartAll() {
  for (const article of streamingArticles()) {
    const mid = article.dataset.mid;
    forget(mid);
    watchFor(mid);
    send(resumeFrame(mid, -1));
  }
}

/**
 * Stop the newest answer still streaming on this page, whichever tab asked for it. Offline,
 * the socket keeps the stop and sends it first thing after it reconnects (before the resume).
 */
export function stopNewest() {
  const all = streamingArticles();
  const article = all[all.length - 1];
  if (article) sendOrKeep(stopFrame(article.dataset.mid));
}

/**
 * Paint now what is released but not painted yet. Called before an HTML frame may replace an
 * answer, so what the answer showed while streaming is always everything released.
 */
export function paintNow() {
  if (dirty.size) paint(Infinity);
}

// --- frames that wait for the blocks before them ----------------------------------------
// An answer that streams faster than this device lays it out (20,000 tokens in 1.5 s) is
// placed over later frames (pace.js). A frame after its blocks (the answer's final HTML, its
// `done`, the next turn's shell) then waits until they are placed, with every frame after it,
// in order: placing them all at once before it would be one long task. A hidden page paints
// nothing, so it never waits, and no frame waits HOLD_MAX_MS without a block placed: a page
// that keeps placing them keeps the wait (a slow phone, or a busy machine, can take longer
// than that over a long answer: a fixed cap then placed the rest in one long task).
const held = [];
let holdTimer = 0;
const HOLD_MAX_MS = 3000;

/**
 * Handle a frame now or, while blocks wait to be placed, after them, in the order frames came.
 * @param {() => void} handle
 * @param {boolean} waits whether the frame waits for blocks to be placed; `chunk` and `block`
 *   frames do not (they only queue text and blocks), but wait behind a frame that waits.
 */
export function inTurn(handle, waits = true) {
  if (held.length || (waits && isBehind())) {
    held.push(handle);
    if (!holdTimer) holdTimer = setTimeout(release, HOLD_MAX_MS);
  } else {
    handle();
  }
}

/** The page was hidden: it paints no more frames, so what waits is handled now. */
export function releaseIfHidden() {
  if (document.visibilityState === "hidden" && held.length) release();
}

function isBehind() {
  if (document.visibilityState !== "visible") return false;
  for (const watch of dirty) {
    if (watch.blocks.length || watch.live?.waiting.has(watch.live.placed)) return true;
  }
  return false;
}

/** Blocks were placed and more wait: what is held waits HOLD_MAX_MS from now. */
function holdOn() {
  clearTimeout(holdTimer);
  holdTimer = setTimeout(release, HOLD_MAX_MS);
}

function releaseSoon() {
  // Its own task, after this frame's layout: not added to the frame that placed the last block.
  clearTimeout(holdTimer);
  holdTimer = setTimeout(release, 0);
}

function release() {
  clearTimeout(holdTimer);
  holdTimer = 0;
  for (const handle of held.splice(0)) {
    // Each frame was its own task before it waited: one that fails must not drop the rest.
    try {
      handle();
    } catch (error) {
      console.error(error);
    }
  }
}

function watchFor(mid) {
  let watch = watches.get(mid);
  if (!watch) {
    // An answer going on (Continue) shows what it said so far; its chunks go on from there.
    watch = new Watch(mid, Number(articleFor(mid)?.dataset.next) || 0);
    watches.set(mid, watch);
  }
  return watch;
}

function forget(mid) {
  clearTimeout(retries.get(mid));
  retries.delete(mid);
  const watch = watches.get(mid);
  if (!watch) return;
  clearTimeout(watch.gapTimer);
  dirty.delete(watch);
  watches.delete(mid);
}

// --- painting: linear in the answer's length, one DOM write per frame per answer ----------
function queuePaint(watch) {
  dirty.add(watch);
  if (paintQueued) return;
  paintQueued = true;
  requestAnimationFrame((now) => paint(PAINT_BUDGET_MS, now));
}

// A page that fell behind (a busy machine, a burst of blocks) catches up over several frames
// instead of in one long task: blocks are placed until this much of the frame is spent, or
// until the frame holds as much HTML as this device lays out in one (pace.js), if sooner.
const PAINT_BUDGET_MS = 12;
const pace = new Pace();

function paint(budget, now = performance.now()) {
  paintQueued = false;
  // Whether the reader follows, not where the thread is: the blocks placed last frame may have
  // grown by more than "near" since, and the thread must then still go to the bottom.
  const stick = scroll.following();
  const deadline = performance.now() + budget;
  const chars = budget === Infinity ? Infinity : pace.frame(now);
  const room = { chars };
  const behind = [];
  for (const watch of dirty) {
    const article = articleFor(watch.mid);
    if (
      article &&
      article.dataset.status === "streaming" &&
      paintWatch(watch, article, deadline, room)
    ) {
      behind.push(watch);
    }
  }
  dirty.clear();
  for (const watch of behind) queuePaint(watch);
  if (behind.length) {
    pace.behind(now, chars - room.chars);
    if (held.length) holdOn();
  } else if (held.length) releaseSoon();
  if (stick) scroll.scrollToBottom();
  else scroll.offerJump();
}

/** @returns {boolean} whether blocks are left for the next frame (the deadline passed) */
function paintWatch(watch, article, deadline = Infinity, room = { chars: Infinity }) {
  const ready = watch.live?.waiting.has(watch.live.placed);
  if (!watch.pending.length && !watch.blocks.length && !ready) return false;
  const live = liveFor(watch, article.querySelector(".body"));
  // Blocks first: text they already cover is then skipped, not drawn and removed. Each is
  // O(its size): the answer is never re-parsed while it streams.
  const before = live.chars;
  const behind = live.addBlocks(watch.blocks, deadline, room.chars);
  room.chars -= live.chars - before;
  watch.blocks.length = 0;
  if (behind) return true; // the text waits for the blocks before it
  if (watch.pending.length) live.addText(watch.pending.join(""));
  watch.pending.length = 0;
  return false;
}

/** The answer's LiveView, made for its body when it has none (or another body). */
function liveFor(watch, body) {
  if (!watch.live || watch.live.body !== body) {
    watch.live = new LiveView(body);
    scroll.keepBottomOf(body);
  }
  return watch.live;
}
