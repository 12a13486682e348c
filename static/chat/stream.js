// stream.js — owns the chat socket: frames in and out, chunk ordering, resume, and the DOM.
// Ordering logic lives in reorder.js (pure); this file does the socket and the page.
import { ReorderBuffer } from "./reorder.js";

const GAP_RESUME_MS = 500; // a gap open this long is asked for again with `resume`
const BACKOFF_BASE_MS = 400;
const BACKOFF_MAX_MS = 15000;
const NEAR_BOTTOM_PX = 48;

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
  awaitingPrompt: false, // a prompt was sent and neither accepted nor refused yet
  ownTurn: "", // the mid of the answer this tab asked for and is streaming
  countdownTimer: 0,
  followBottom: true,
};

// --- socket -------------------------------------------------------------------------------
function socketUrl() {
  return `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws/chat/`;
}

function connect() {
  clearTimeout(state.reconnectTimer);
  setConnection(state.attempts ? "reconnecting" : "connecting");
  const ws = new WebSocket(socketUrl());
  state.socket = ws;
  ws.addEventListener("message", (event) => onFrame(event.data));
  ws.addEventListener("close", (event) => {
    if (state.socket !== ws) return;
    state.socket = null;
    state.ready = false;
    if (event.code === 4401) {
      setConnection("logged-out");
      location.assign(`/accounts/login/?next=${encodeURIComponent(location.pathname)}`);
      return;
    }
    scheduleReconnect();
  });
}

function scheduleReconnect() {
  // Exponential backoff with full jitter, so a restarted server is not hit by every tab at once.
  const cap = Math.min(BACKOFF_MAX_MS, BACKOFF_BASE_MS * 2 ** state.attempts);
  state.attempts += 1;
  setConnection(navigator.onLine === false ? "offline" : "reconnecting");
  state.reconnectTimer = setTimeout(connect, Math.random() * cap);
}

function reconnectNow() {
  const ws = state.socket;
  if (ws && (ws.readyState === WebSocket.OPEN || ws.readyState === WebSocket.CONNECTING)) return;
  connect();
}

function send(frame) {
  const ws = state.socket;
  if (!ws || ws.readyState !== WebSocket.OPEN || !state.ready) return false;
  ws.send(JSON.stringify(frame));
  return true;
}

window.addEventListener("online", reconnectNow);
window.addEventListener("offline", () => setConnection("offline"));
document.addEventListener("visibilitychange", () => {
  if (document.visibilityState === "visible") reconnectNow();
});

function setConnection(kind) {
  const labels = {
    connecting: "Connecting…",
    connected: "Connected",
    reconnecting: "Reconnecting…",
    offline: "Offline — will reconnect",
    "logged-out": "Logged out",
  };
  connectionEl.dataset.state = kind;
  connectionEl.textContent = labels[kind] || kind;
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
  if (frame.mid === state.ownTurn) {
    state.ownTurn = "";
    updateComposer();
    if (document.activeElement === document.body) promptEl.focus();
  }
}

function onError(frame) {
  const rejectedPrompt = state.awaitingPrompt && !frame.mid;
  if (rejectedPrompt) {
    // Nothing the user typed is lost: the prompt stays in the box to send again.
    state.awaitingPrompt = false;
  }
  showAlert(frame.message || "Something went wrong.", frame.retry_after);
  if (frame.code === "not_found" && frame.mid) {
    state.watches.delete(frame.mid);
    const article = articleFor(frame.mid);
    if (article && article.dataset.status === "streaming") article.dataset.status = "failed";
  }
  updateComposer();
}

function resumeAll() {
  // After (re)connecting: ask for every answer still streaming on the page, from where we are.
  for (const article of messagesEl.querySelectorAll('article[data-status="streaming"]')) {
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
    const title = $(`#conv-${conv} a`);
    if (title) {
      $(".chat-head .title").textContent = title.textContent;
      document.title = `${title.textContent} · chatsite`;
    }
  }
  $("#conversation-list > li.empty")?.remove();
  $("#empty-state")?.remove();
  for (const article of messagesEl.querySelectorAll('article[data-status="streaming"]')) {
    const mid = article.dataset.mid;
    if (state.watches.has(mid)) continue;
    watchFor(mid);
    if (article.dataset.watch) {
      send({ type: "resume", mid, after: -1 }); // another tab's answer: follow it
    } else if (state.awaitingPrompt) {
      // Our prompt was accepted: the box can be cleared now.
      state.awaitingPrompt = false;
      state.ownTurn = mid;
      promptEl.value = "";
      autosize();
      clearAlert();
    }
  }
  enhance(messagesEl);
  updateComposer();
  if (state.followBottom) scrollToBottom();
}

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
  else jumpBtn.hidden = false;
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
  const streaming = Boolean(state.ownTurn);
  const connected = state.ready;
  promptEl.disabled = streaming;
  sendBtn.disabled = streaming || state.awaitingPrompt || !connected;
  stopBtn.hidden = !streaming;
  let reason = "";
  if (streaming) reason = "Answering… press Stop (Esc) to interrupt.";
  else if (state.awaitingPrompt) reason = "Sending…";
  else if (!connected) reason = "Not connected — your message is kept and can be sent once reconnected.";
  statusEl.textContent = reason;
}

function submitPrompt() {
  const text = promptEl.value;
  if (!text.trim() || state.ownTurn || state.awaitingPrompt) return;
  const conversation = $("#conversation-id").value;
  if (send({ type: "prompt", conversation, text })) {
    state.awaitingPrompt = true;
    state.followBottom = true;
    updateComposer();
  } else {
    showAlert("Not connected right now. Your message is kept; send it again once reconnected.");
  }
}

function stopOwnTurn() {
  const streaming = messagesEl.querySelector('article[data-status="streaming"]:last-of-type');
  const mid = state.ownTurn || (streaming && streaming.dataset.mid);
  if (mid) send({ type: "stop", mid });
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
  if (event.key === "Escape" && state.ownTurn) {
    event.preventDefault();
    stopOwnTurn();
  } else if (event.key.toLowerCase() === "o" && event.shiftKey && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    location.assign("/");
  }
});

document.addEventListener("click", (event) => {
  const button = event.target.closest("[data-action]");
  if (!button) return;
  const action = button.dataset.action;
  if (action === "stop") stopOwnTurn();
  else if (action === "jump") {
    state.followBottom = true;
    scrollToBottom();
  } else if (action === "retry") retry(button.closest("article"));
  else if (action === "copy") copyAnswer(button);
  else if (action === "copy-code") copyCode(button);
  else if (action === "open-drawer") setDrawer(true);
  else if (action === "close-drawer") setDrawer(false);
});

function retry(article) {
  // Send the prompt that led to this answer again.
  let prev = article && article.previousElementSibling;
  while (prev && !prev.classList.contains("msg-user")) prev = prev.previousElementSibling;
  if (!prev) return;
  promptEl.value = $(".body", prev).textContent;
  submitPrompt();
}

async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
    flash(button, "Copied");
  } catch {
    flash(button, "Copy failed");
  }
}

function copyAnswer(button) {
  const source = $("template.source", button.closest("article"));
  copyText(source ? source.content.textContent || source.innerHTML : "", button);
}

function copyCode(button) {
  const code = $("code", button.closest(".codeblock"));
  copyText(code ? code.textContent : "", button);
}

function flash(button, label) {
  const old = button.textContent;
  button.textContent = label;
  setTimeout(() => (button.textContent = old), 1500);
}

function enhance(root) {
  for (const block of root.querySelectorAll(".codeblock:not([data-enhanced])")) {
    block.dataset.enhanced = "1";
    const button = document.createElement("button");
    button.type = "button";
    button.className = "copy-code";
    button.dataset.action = "copy-code";
    button.textContent = "Copy code";
    block.prepend(button);
  }
}

function setDrawer(open) {
  document.body.classList.toggle("drawer-open", open);
  $(".open-drawer")?.setAttribute("aria-expanded", String(open));
  if (open) $("#sidebar a, #sidebar input")?.focus();
}

// --- alerts -----------------------------------------------------------------------------------
function showAlert(message, retryAfter) {
  clearAlert();
  const p = document.createElement("p");
  p.className = "alert";
  p.textContent = message;
  if (retryAfter) {
    const count = document.createElement("span");
    count.className = "countdown";
    p.append(" ", count);
    const until = Date.now() + retryAfter * 1000;
    const tick = () => {
      const left = Math.ceil((until - Date.now()) / 1000);
      if (left <= 0) {
        count.textContent = "You can send again now.";
        clearInterval(state.countdownTimer);
        return;
      }
      count.textContent = `(${formatSeconds(left)} left)`;
    };
    tick();
    state.countdownTimer = setInterval(tick, 1000);
  }
  const close = document.createElement("button");
  close.type = "button";
  close.className = "link dismiss";
  close.textContent = "Dismiss";
  close.addEventListener("click", clearAlert);
  p.append(" ", close);
  alertsEl.append(p);
}

function clearAlert() {
  clearInterval(state.countdownTimer);
  alertsEl.replaceChildren();
}

function formatSeconds(s) {
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${s % 60} s`;
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

// --- start ------------------------------------------------------------------------------------
enhance(document);
autosize();
scrollToBottom();
connect();
