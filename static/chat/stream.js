// stream.js — owns the chat socket: frames in and out, chunk ordering, resume, and the DOM.
// Ordering logic lives in reorder.js, reconnect timing in backoff.js and the words the page
// shows in labels.js (all pure); this file does the socket and the page.
import { BACKOFF_MAX_MS, reconnectDelay } from "./backoff.js";
import {
  countdownText,
  tierBadge,
  tokensLeftAfter,
  tokensLeftText,
  withoutStaticRetryHint,
} from "./labels.js";
import { ReorderBuffer } from "./reorder.js";

const GAP_RESUME_MS = 500; // a gap open this long is asked for again with `resume`
const NEAR_BOTTOM_PX = 48;
const FLASH_MS = 1500;

const $ = (sel, root = document) => root.querySelector(sel);
const messagesEl = $("#messages");
const composer = $("#composer");
const promptEl = $("#prompt");
const sendBtn = $("#send");
const stopBtn = $("#stop");
const statusEl = $("#composer-status");
const alertsEl = $("#alerts");
const connectionEl = $("#connection");
const jumpBtn = $("#jump");
const announcer = $("#announcer");
const usageEl = $("#usage-meter");
const editingEl = $("#editing");
const touchScreen = matchMedia("(pointer: coarse)").matches;

/** One answer this tab shows while it streams. */
class Watch {
  constructor(mid, start = 0) {
    this.mid = mid;
    this.buffer = new ReorderBuffer(start);
    this.pending = []; // released text not yet painted
    this.gapTimer = 0;
  }
}

const state = {
  socket: null,
  ready: false,
  attempts: 0,
  reconnectTimer: 0,
  watches: new Map(), // mid -> Watch
  paintQueued: false,
  dirty: new Set(),
  // A turn was asked for and neither accepted nor refused yet: `fromBox` says whether it is
  // the text in the prompt box (cleared once accepted), `edit` the edit it saves, `mid` the
  // answer a regeneration asks again (its refusal names that mid).
  awaiting: null,
  // Editing an earlier prompt: its mid, and the draft the box held before (given back after).
  editing: null,
  // A version switch on its way: which message, and where it was on screen.
  switching: null,
  started: new Set(), // mids whose turn started while this page was open (for the usage meter)
  countdownTimer: 0,
  followBottom: true,
};

// --- socket -------------------------------------------------------------------------------
function socketUrl() {
  return `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws/chat/`;
}

function connect() {
  clearTimeout(state.reconnectTimer);
  if (state.socket) return;
  setConnection(state.attempts ? "reconnecting" : "connecting");
  const ws = new WebSocket(socketUrl());
  state.socket = ws;
  ws.addEventListener("message", (event) => {
    // Frames still arriving on a socket we gave up on are ignored: `resume` on the new one
    // sends everything after what we show, so nothing is lost and nothing doubles.
    if (state.socket === ws) onFrame(event.data);
  });
  ws.addEventListener("close", (event) => {
    if (state.socket !== ws) return;
    lostSocket();
    if (event.code === 4401) {
      setConnection("logged-out");
      location.assign(`/accounts/login/?next=${encodeURIComponent(location.pathname)}`);
      return;
    }
    scheduleReconnect();
  });
}

function lostSocket() {
  state.socket = null;
  state.ready = false;
  if (state.awaiting) {
    // We cannot know whether the prompt arrived; the text is still in the box to send again.
    state.awaiting = null;
  }
}

function scheduleReconnect() {
  clearTimeout(state.reconnectTimer);
  const offline = navigator.onLine === false;
  // Offline, attempts would only fail: the `online` event reconnects at once, and a slow
  // timer covers a browser that misses telling us.
  const delay = offline ? BACKOFF_MAX_MS : reconnectDelay(state.attempts);
  state.attempts += 1;
  setConnection(offline ? "offline" : "reconnecting");
  state.reconnectTimer = setTimeout(connect, delay);
}

function reconnectNow() {
  const ws = state.socket;
  if (ws && (ws.readyState === WebSocket.OPEN || ws.readyState === WebSocket.CONNECTING)) return;
  if (ws) lostSocket();
  connect();
}

function dropSocket() {
  // When the network goes away the old TCP connection often dies silently (no close event for
  // minutes, e.g. a phone moving from Wi-Fi to mobile data): give it up now and resume on a
  // fresh socket as soon as the browser is back online.
  const ws = state.socket;
  if (!ws) return;
  lostSocket();
  try {
    ws.close(1000, "offline");
  } catch {
    // already closing
  }
  scheduleReconnect();
}

function send(frame) {
  const ws = state.socket;
  if (!ws || ws.readyState !== WebSocket.OPEN || !state.ready) return false;
  ws.send(JSON.stringify(frame));
  return true;
}

window.addEventListener("online", reconnectNow);
window.addEventListener("offline", () => {
  dropSocket();
  setConnection("offline");
});
document.addEventListener("visibilitychange", () => {
  if (document.visibilityState === "visible") reconnectNow();
});

function setConnection(kind) {
  // Short, for the header; the composer's status line says what it means for the user.
  const labels = {
    connecting: "Connecting…",
    connected: "Connected",
    reconnecting: "Reconnecting…",
    offline: "Offline",
    "logged-out": "Logged out",
  };
  connectionEl.dataset.state = kind;
  connectionEl.textContent = labels[kind] || kind;
  connectionEl.title = connectionEl.textContent;
  updateComposer();
}

// --- frames in ----------------------------------------------------------------------------
function onFrame(data) {
  if (typeof data !== "string") return;
  if (data.charCodeAt(0) === 123 /* { */) {
    let frame;
    try {
      frame = JSON.parse(data);
    } catch {
      return;
    }
    onJson(frame);
    return;
  }
  // Text released but not painted yet goes on the page before an HTML frame may replace its
  // answer, so what the answer showed while streaming is always everything released.
  if (state.dirty.size) paint();
  // HTML frames carry hx-swap-oob fragments: htmx's swap engine places them.
  window.htmx.swap(document.body, data, { swapStyle: "none" });
  afterHtml();
}

function onJson(frame) {
  switch (frame.type) {
    case "ready":
      state.ready = true;
      state.attempts = 0;
      setConnection("connected");
      showTier(frame);
      resumeAll();
      break;
    case "chunk":
      onChunk(frame);
      break;
    case "done":
      onDone(frame);
      break;
    case "error":
      onError(frame);
      break;
    default:
      break; // unknown frames from a newer server are ignored
  }
}

function watchFor(mid) {
  let watch = state.watches.get(mid);
  if (!watch) {
    watch = new Watch(mid);
    state.watches.set(mid, watch);
  }
  return watch;
}

function onChunk({ mid, seq, text }) {
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
          send({ type: "resume", mid, after: watch.buffer.next - 1 });
        }
      }, GAP_RESUME_MS);
    }
  } else if (watch.gapTimer) {
    clearTimeout(watch.gapTimer);
    watch.gapTimer = 0;
  }
}

function onDone(frame) {
  const watch = state.watches.get(frame.mid);
  if (watch) {
    clearTimeout(watch.gapTimer);
    state.watches.delete(frame.mid);
    state.dirty.delete(watch);
  }
  const article = articleFor(frame.mid);
  if (article && article.dataset.status === "streaming") {
    // The final HTML did not come (e.g. the conversation was deleted): paint what we have.
    if (watch) paintWatch(watch, article);
    article.dataset.status = frame.status;
    $(".body", article)?.setAttribute("aria-busy", "false");
  }
  const ours = state.started.delete(frame.mid);
  if (ours || typeof frame.tokens_left === "number") showTokensLeft(frame);
  updateComposer();
  returnFocusToPrompt();
}

function onError(frame) {
  if (state.awaiting && (!frame.mid || frame.mid === state.awaiting.mid)) {
    // A refused prompt, edit or regeneration: nothing the user typed is lost, it stays in the
    // box (still in edit mode for an edit) to send again.
    state.awaiting = null;
  }
  showAlert(frame.message || "Something went wrong.", frame.retry_after, frame.code);
  if (frame.code === "not_found" && frame.mid) {
    state.watches.delete(frame.mid);
    const article = articleFor(frame.mid);
    if (article && article.dataset.status === "streaming") article.dataset.status = "failed";
  }
  updateComposer();
  returnFocusToPrompt();
}

function resumeAll() {
  // After (re)connecting: ask for every answer still streaming on the page, from where we are.
  for (const article of streamingArticles()) {
    const watch = watchFor(article.dataset.mid);
    send({ type: "resume", mid: watch.mid, after: watch.buffer.next - 1 });
  }
}

function afterHtml() {
  const convInput = $("#conversation-id");
  const conv = convInput ? convInput.value : "";
  if (conv && messagesEl.dataset.conversation !== conv) {
    // The first prompt created the conversation: this page is now its page.
    messagesEl.dataset.conversation = conv;
    $("#main").dataset.conversation = conv;
    history.replaceState(null, "", `/c/${conv}/`);
  }
  if ($("#conversation-list > li.conv")) $("#conversation-list > li.empty")?.remove();
  // (Another tab's new conversation adds to the list, not to this page's messages.)
  if ($("article", messagesEl)) $("#empty-state")?.remove();
  let accepted = false;
  for (const article of streamingArticles()) {
    const mid = article.dataset.mid;
    if (state.watches.has(mid)) continue;
    watchFor(mid);
    state.started.add(mid);
    if (article.dataset.watch) {
      send({ type: "resume", mid, after: -1 }); // another tab's answer: follow it
    } else if (state.awaiting) {
      // Not marked for watchers, and this tab asked: the shell is our own turn, whether it
      // was appended or came in a whole new thread (an edit or a regeneration).
      accepted = true;
      if (state.awaiting.edit) {
        // The edit was saved: the box gets back the draft it held before editing began.
        leaveEditMode(state.awaiting.edit.draft);
      } else if (state.awaiting.fromBox) {
        promptEl.value = "";
        autosize();
      }
      state.awaiting = null;
      clearAlert();
    }
  }
  for (const article of messagesEl.querySelectorAll(
    'article.msg-assistant[data-watch]:not([data-status="streaming"])',
  )) {
    // Another tab's answer that finished before this tab heard of it comes rendered; one with
    // no text at all (failed at once) is asked for, so its final state and message show.
    article.removeAttribute("data-watch");
    if (!$(".body", article).childNodes.length) {
      send({ type: "resume", mid: article.dataset.mid, after: -1 });
    }
  }
  if (accepted || conv) markCurrentConversation({ moveToTop: accepted });
  if (state.editing) markEdited(state.editing.mid); // another tab's thread swap re-rendered it
  enhance(messagesEl);
  updateComposer();
  if (state.followBottom) scrollToBottom();
}

// --- the conversation list ------------------------------------------------------------------
function currentConversation() {
  return messagesEl.dataset.conversation || "";
}

function markCurrentConversation({ moveToTop = false } = {}) {
  // The sidebar shows the open conversation highlighted; the one just written to goes first
  // (after the pinned ones), as the list is newest first.
  const conv = currentConversation();
  const list = $("#conversation-list");
  if (!list) return;
  for (const item of list.querySelectorAll("li.conv")) {
    const current = item.id === `conv-${conv}`;
    item.classList.toggle("current", current);
    const link = $("a", item);
    if (current) link?.setAttribute("aria-current", "page");
    else link?.removeAttribute("aria-current");
    for (const input of item.querySelectorAll('input[name="current"]')) input.value = conv;
  }
  const item = conv && document.getElementById(`conv-${conv}`);
  if (!item) return;
  if (moveToTop) {
    // Pinned conversations stay above the others: an unpinned one goes first below them.
    const pinned = (li) => Boolean(li.querySelector(".pinned"));
    const before = pinned(item)
      ? list.firstElementChild
      : [...list.children].find((li) => li !== item && li.matches("li.conv") && !pinned(li));
    if (before && before !== item) list.insertBefore(item, before);
  }
  const title = $("a", item)?.textContent.trim();
  if (title) showTitle(title);
}

function showTitle(title) {
  $(".chat-head .title").textContent = title;
  document.title = `${title} · chatsite`;
}

document.body.addEventListener("htmx:afterSettle", (event) => {
  // A rename or a search result replaced part of the list: keep the open one marked, and
  // the page's title in step with a renamed conversation.
  if (event.target.closest?.("#conversation-list")) markCurrentConversation();
});

document.body.addEventListener("htmx:afterRequest", () => {
  // A rename or delete removed the control that had focus: give it back to the prompt.
  if (document.activeElement === document.body || !document.activeElement) returnFocusToPrompt();
});

// --- painting: linear in the answer's length, one DOM write per frame per answer ----------
function queuePaint(watch) {
  state.dirty.add(watch);
  if (state.paintQueued) return;
  state.paintQueued = true;
  requestAnimationFrame(paint);
}

function paint() {
  state.paintQueued = false;
  const stick = isNearBottom();
  for (const watch of state.dirty) {
    const article = articleFor(watch.mid);
    if (article && article.dataset.status === "streaming") paintWatch(watch, article);
  }
  state.dirty.clear();
  if (stick) scrollToBottom();
  else if (!state.followBottom) jumpBtn.hidden = false;
}

function paintWatch(watch, article) {
  if (!watch.pending.length) return;
  const body = $(".body", article);
  // Appending a new text node is O(chunk): the answer is never re-parsed while it streams.
  body.append(document.createTextNode(watch.pending.join("")));
  watch.pending.length = 0;
}

function articleFor(mid) {
  return document.getElementById(`msg-${mid}`);
}

function streamingArticles() {
  return messagesEl.querySelectorAll('article.msg-assistant[data-status="streaming"]');
}

// --- scrolling ------------------------------------------------------------------------------
function isNearBottom() {
  return messagesEl.scrollHeight - messagesEl.scrollTop - messagesEl.clientHeight < NEAR_BOTTOM_PX;
}

function scrollToBottom() {
  messagesEl.scrollTop = messagesEl.scrollHeight;
  jumpBtn.hidden = true;
}

messagesEl.addEventListener("scroll", () => {
  // Auto-scroll pauses while the reader scrolls up, and resumes at the bottom.
  state.followBottom = isNearBottom();
  if (state.followBottom) jumpBtn.hidden = true;
});

// --- the composer -----------------------------------------------------------------------------
function updateComposer() {
  // Any answer streaming in this conversation (asked here, in another tab, or before a
  // reload) blocks the box: a second prompt would be answered without the first answer.
  const streaming = streamingArticles().length > 0;
  const connected = state.ready;
  promptEl.disabled = streaming;
  sendBtn.disabled = streaming || Boolean(state.awaiting) || !connected;
  stopBtn.hidden = !streaming;
  messagesEl.setAttribute("aria-busy", String(streaming));
  messagesEl.classList.toggle("is-streaming", streaming); // chat.css hides edit and switch
  const offline = connectionEl.dataset.state === "offline";
  let reason = "";
  if (streaming && !connected) {
    reason = offline
      ? "Offline. The answer goes on at the server and catches up when you are back online."
      : "Connection lost, reconnecting. The answer goes on at the server and catches up.";
  } else if (streaming) reason = "Answering… press Stop (Esc) to interrupt.";
  else if (state.awaiting) reason = "Sending…";
  else if (offline) reason = "You are offline. Your message is kept; send it when you are back online.";
  else if (!connected) reason = "Connection lost, reconnecting… Your message is kept.";
  if (statusEl.textContent !== reason) statusEl.textContent = reason;
}

function submitPrompt() {
  const text = promptEl.value;
  if (!text.trim()) return;
  if (streamingArticles().length || state.awaiting) return;
  const frame = { type: "prompt", conversation: $("#conversation-id").value, text };
  const edit = state.editing ? { ...state.editing } : null;
  if (edit) frame.replaces = edit.mid; // a new version of that prompt; the thread goes on from it
  ask(frame, { fromBox: true, edit });
}

function ask(frame, awaiting) {
  // Send a frame that starts a turn; the tab waits for its shell (or its refusal).
  if (send(frame)) {
    state.awaiting = { mid: frame.type === "regenerate" ? frame.mid : undefined, ...awaiting };
    state.followBottom = true;
    updateComposer();
  } else {
    showAlert("Not connected right now. Your message is kept; send it again once reconnected.");
  }
}

function regenerate(article) {
  // A new version of this answer: the same prompt asked again. Retry on a failed answer does
  // the same, so a retry adds a version instead of repeating the prompt in the thread.
  if (!article || streamingArticles().length || state.awaiting) return;
  ask({ type: "regenerate", mid: article.dataset.mid }, { fromBox: false });
}

// --- editing an earlier prompt ----------------------------------------------------------------
function startEdit(article) {
  if (!article || streamingArticles().length || state.awaiting) return;
  const text = $(".body", article).textContent;
  // Editing another message while editing keeps the draft from before the first edit.
  const draft = state.editing ? state.editing.draft : promptEl.value;
  markEdited(article.dataset.mid);
  state.editing = { mid: article.dataset.mid, draft };
  editingEl.hidden = false;
  sendBtn.textContent = "Save & send";
  promptEl.setAttribute("aria-describedby", "editing-note composer-status composer-keys");
  promptEl.value = text;
  autosize();
  promptEl.focus();
  promptEl.setSelectionRange(text.length, text.length);
}

function leaveEditMode(draft) {
  // Back to a plain prompt box holding `draft` (what was typed before editing began).
  if (!state.editing) return;
  state.editing = null;
  markEdited("");
  editingEl.hidden = true;
  sendBtn.textContent = "Send";
  promptEl.setAttribute("aria-describedby", "composer-status composer-keys");
  promptEl.value = draft;
  autosize();
}

function cancelEdit() {
  if (!state.editing || state.awaiting) return;
  leaveEditMode(state.editing.draft);
  if (!promptEl.disabled) promptEl.focus();
}

function markEdited(mid) {
  for (const el of messagesEl.querySelectorAll(".is-editing")) el.classList.remove("is-editing");
  if (mid) articleFor(mid)?.classList.add("is-editing");
}

// --- versions: the "‹ 2 / 3 ›" arrows ---------------------------------------------------------
document.body.addEventListener("htmx:beforeRequest", (event) => {
  const button = event.detail.elt;
  if (!button?.matches?.(".versions button")) return;
  const article = button.closest("article");
  // Where the message was on screen, so the switched one stays in the same place.
  state.switching = {
    mid: button.dataset.versionMid,
    next: button.classList.contains("version-next"),
    top: article.getBoundingClientRect().top,
  };
});

document.body.addEventListener("htmx:beforeSwap", (event) => {
  // The whole thread is about to change under a polite live region: busy, so that a screen
  // reader does not read it all out as new; `announce` says in a few words what changed.
  if (event.detail.target === messagesEl && state.switching) {
    messagesEl.setAttribute("aria-busy", "true");
  }
});

document.body.addEventListener("htmx:afterSwap", (event) => {
  if (event.detail.target !== messagesEl || !state.switching) return;
  const { mid, next, top } = state.switching;
  state.switching = null;
  afterThreadSwap();
  messagesEl.setAttribute("aria-busy", "true");
  requestAnimationFrame(() => requestAnimationFrame(updateComposer));
  const article = articleFor(mid);
  if (!article) return;
  const label = $(".versions", article)?.getAttribute("aria-label");
  if (label) announce(`Showing ${label.toLowerCase()}.`);
  messagesEl.scrollTop += article.getBoundingClientRect().top - top;
  state.followBottom = isNearBottom();
  jumpBtn.hidden = true;
  // Focus stays on the arrows of the message just switched (the same one when it can go on),
  // so the keyboard can keep stepping through versions.
  const same = $(next ? ".version-next" : ".version-prev", article);
  const other = $(next ? ".version-prev" : ".version-next", article);
  const target = same && !same.disabled ? same : other && !other.disabled ? other : article;
  if (target === article) article.tabIndex = -1;
  target.focus({ preventScroll: true });
});

document.body.addEventListener("htmx:responseError", (event) => {
  if (!state.switching) return;
  state.switching = null;
  const notFound = event.detail.xhr?.status === 404;
  showAlert(
    notFound
      ? "That version no longer exists. Reload the page to see the conversation as it is."
      : "That version could not be shown. Try again in a moment.",
  );
});

document.body.addEventListener("htmx:sendError", () => {
  if (!state.switching) return;
  state.switching = null;
  showAlert("Not connected right now. Try switching versions again once reconnected.");
});

function afterThreadSwap() {
  // A switched-to branch may hold an answer still streaming (asked in another tab). Its shell
  // comes empty, so it is followed from its first chunk, even if this tab followed it before.
  for (const article of streamingArticles()) {
    const mid = article.dataset.mid;
    const old = state.watches.get(mid);
    if (old) {
      clearTimeout(old.gapTimer);
      state.dirty.delete(old);
      state.watches.delete(mid);
    }
    watchFor(mid);
    send({ type: "resume", mid, after: -1 });
  }
  if (state.editing) markEdited(state.editing.mid);
  // htmx wires new content when it settles (a moment later); the arrows get focus now and
  // must work at once, so wire them now (processing twice is a no-op).
  window.htmx.process(messagesEl);
  enhance(messagesEl);
  updateComposer();
}

function stopAnswer() {
  // The newest answer still streaming on this page, whichever tab asked for it.
  const all = streamingArticles();
  const article = all[all.length - 1];
  if (article) send({ type: "stop", mid: article.dataset.mid });
}

function returnFocusToPrompt() {
  // Focus goes back to the box after an action, unless the user has moved it somewhere else.
  // Not on touch screens: focusing the box there opens the on-screen keyboard over the answer.
  if (touchScreen) return;
  const active = document.activeElement;
  const idle = !active || active === document.body || composer.contains(active);
  if (idle && !promptEl.disabled) promptEl.focus();
}

composer.addEventListener("submit", (event) => {
  event.preventDefault();
  submitPrompt();
});

promptEl.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    submitPrompt();
  }
});

function autosize() {
  promptEl.style.height = "auto";
  promptEl.style.height = `${Math.min(promptEl.scrollHeight, window.innerHeight * 0.4)}px`;
}
promptEl.addEventListener("input", autosize);

document.addEventListener("keydown", (event) => {
  if (event.key === "Escape") {
    if (document.body.classList.contains("drawer-open")) {
      event.preventDefault();
      setDrawer(false);
    } else if (streamingArticles().length) {
      event.preventDefault();
      stopAnswer();
    } else if (state.editing) {
      event.preventDefault();
      cancelEdit();
    }
  } else if (event.key.toLowerCase() === "o" && event.shiftKey && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    location.assign("/");
  }
});

document.addEventListener("click", (event) => {
  const button = event.target.closest("[data-action]");
  if (!button) return;
  const action = button.dataset.action;
  if (action === "stop") stopAnswer();
  else if (action === "jump") {
    state.followBottom = true;
    scrollToBottom();
    returnFocusToPrompt(); // the button hid itself, which dropped the focus
  } else if (action === "retry" || action === "regenerate") regenerate(button.closest("article"));
  else if (action === "edit") startEdit(button.closest("article"));
  else if (action === "cancel-edit") cancelEdit();
  else if (action === "copy") copyAnswer(button);
  else if (action === "copy-code") copyCode(button);
  else if (action === "open-drawer") setDrawer(true);
  else if (action === "close-drawer") setDrawer(false);
});

async function copyText(text, button, what) {
  try {
    await navigator.clipboard.writeText(text);
    flash(button, "Copied");
    announce(`${what} copied to the clipboard.`);
  } catch {
    flash(button, "Copy failed");
    announce(`Could not copy the ${what.toLowerCase()}: the browser did not allow it.`);
  }
}

function copyAnswer(button) {
  // The answer's markdown source, as the model wrote it (not the rendered HTML's text).
  const source = $("template.source", button.closest("article"));
  copyText(source ? source.content.textContent : "", button, "Answer");
}

function copyCode(button) {
  const code = $("code", button.closest(".codeblock"));
  copyText(code ? code.textContent : "", button, "Code");
}

function flash(button, label) {
  if (!button.dataset.label) button.dataset.label = button.textContent;
  button.textContent = label;
  clearTimeout(Number(button.dataset.flashTimer));
  button.dataset.flashTimer = String(
    setTimeout(() => {
      button.textContent = button.dataset.label;
    }, FLASH_MS),
  );
}

function enhance(root) {
  for (const block of root.querySelectorAll(".codeblock:not([data-enhanced])")) {
    block.dataset.enhanced = "1";
    const button = document.createElement("button");
    button.type = "button";
    button.className = "copy-code";
    button.dataset.action = "copy-code";
    const lang = block.dataset.lang;
    // The accessible name starts with the visible text (WCAG 2.5.3), then says which code.
    if (lang) button.setAttribute("aria-label", `Copy code: ${lang}`);
    button.textContent = "Copy code";
    block.prepend(button);
  }
}

function setDrawer(open) {
  const opener = $(".open-drawer");
  document.body.classList.toggle("drawer-open", open);
  opener?.setAttribute("aria-expanded", String(open));
  $("#scrim").hidden = !open;
  // While the drawer is open the page behind it is out of reach (focus, taps, screen readers).
  $("#main").inert = open;
  if (open) $("#sidebar .close-drawer")?.focus();
  else if (opener && opener.offsetParent !== null) opener.focus();
}

// --- the tier badge and the usage meter -----------------------------------------------------
function showTier(frame) {
  // The socket decides the tier from its own handshake, which may differ from the page's.
  if (!frame.tier) return;
  const badge = $("#tier-badge");
  const info = $("#tier-info");
  const words = tierBadge(frame);
  if (badge) {
    badge.dataset.tier = words.tier;
    $(".label", badge).textContent = words.label;
    badge.title = words.title;
  }
  if (info) {
    const paragraphs = words.details.map((line) => {
      const p = document.createElement("p");
      p.textContent = line;
      return p;
    });
    $(".details", info).replaceChildren(...paragraphs);
  }
  for (const el of document.querySelectorAll("[data-model-name]")) el.textContent = frame.model;
}

function showTokensLeft(done) {
  // The done frame carries the server's count of today's tokens left (with a daily quota);
  // without it the meter takes the answer's usage off what it showed.
  if (!usageEl) return;
  const left = tokensLeftAfter(done, Number(usageEl.dataset.tokensLeft) || 0);
  usageEl.dataset.tokensLeft = String(left);
  $(".text", usageEl).textContent = tokensLeftText(left);
  const meter = $("meter", usageEl);
  if (meter) meter.value = left;
}

// --- alerts and announcements -----------------------------------------------------------------
function showAlert(message, retryAfter, code = "") {
  clearAlert();
  const p = document.createElement("p");
  p.className = "alert";
  if (code) p.dataset.code = code;
  const text = document.createElement("span");
  text.textContent = retryAfter ? withoutStaticRetryHint(message) : message;
  p.append(text);
  if (retryAfter) {
    const count = document.createElement("span");
    count.className = "countdown";
    p.append(" ", count);
    const until = Date.now() + retryAfter * 1000;
    const tick = () => {
      const left = Math.ceil((until - Date.now()) / 1000);
      count.textContent = countdownText(left);
      if (left <= 0) clearInterval(state.countdownTimer);
    };
    tick();
    state.countdownTimer = setInterval(tick, 1000);
  }
  const close = document.createElement("button");
  close.type = "button";
  close.className = "link dismiss";
  close.textContent = "Dismiss";
  close.setAttribute("aria-label", "Dismiss this message");
  close.addEventListener("click", () => {
    clearAlert();
    returnFocusToPrompt();
  });
  p.append(" ", close);
  alertsEl.append(p);
}

function clearAlert() {
  clearInterval(state.countdownTimer);
  alertsEl.replaceChildren();
}

function announce(text) {
  // Short polite messages for what has no visible text of its own (e.g. "copied").
  if (!announcer || !text) return;
  announcer.textContent = "";
  requestAnimationFrame(() => {
    announcer.textContent = text;
  });
}

// --- start ------------------------------------------------------------------------------------
for (const article of streamingArticles()) watchFor(article.dataset.mid);
enhance(document);
autosize();
scrollToBottom();
markCurrentConversation();
updateComposer();
if (!touchScreen) promptEl.focus(); // on a phone it would open the keyboard over the page
connect();
