// The composer: the prompt box, Send and Stop, its status line, editing an earlier prompt,
// and the turn this tab asked for until the server accepts or refuses it.
import { announce, clearAlert, showAlert } from "./alerts.js";
import { canStartTurn, composerState } from "./composer-state.js";
import { loadDraft, saveDraft } from "./drafts.js";
import { continueFrame, promptFrame, regenerateFrame } from "./frames.js";
import { enterAction, enterKeyHint, keysHint } from "./keys.js";
import { selectedModel } from "./models.js";
import * as scroll from "./scroll.js";
import { connectionState, isReady, send, stopKept } from "./socket.js";
import { articleFor, isStreaming, messages, showBusy } from "./thread.js";

const form = document.getElementById("composer");
const promptEl = document.getElementById("prompt");
const sendButton = document.getElementById("send");
const stopButton = document.getElementById("stop");
const statusEl = document.getElementById("composer-status");
const editingEl = document.getElementById("editing");
const keysEl = document.getElementById("composer-keys");
const touchScreen = matchMedia("(pointer: coarse)").matches;

// A turn was asked for and neither accepted nor refused yet: `fromBox` holds the text sent from
// the prompt box (cleared once accepted, if the box still holds just that), `edit` the edit it
// saves, `mid` the answer a regeneration asks again (its refusal names that mid).
let awaiting = null;
// Editing an earlier prompt: its mid, and the draft the box held before (given back after).
let editing = null;

export function start() {
  // On a touch screen the keyboard's Return key makes a new line; the Send button sends.
  promptEl.enterKeyHint = enterKeyHint({ touch: touchScreen });
  const hint = keysHint({ touch: touchScreen });
  keysEl.textContent = hint.short;
  document.getElementById("editing-note").textContent = hint.editing;
  for (const el of document.querySelectorAll("[data-keys-hint]")) el.textContent = hint.long;
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    submitPrompt();
  });
  promptEl.addEventListener("keydown", (event) => {
    const busy = !canStartTurn({ streaming: isStreaming(), awaiting: Boolean(awaiting) });
    const action = enterAction(event, { touch: touchScreen, busy });
    if (!action) return;
    event.preventDefault();
    if (action === "send") submitPrompt();
    // Held: the text stays where it is; the status line already says when Enter works again.
    else announce("Not sent: an answer is still coming. Your text stays here.");
  });
  promptEl.addEventListener("input", autosize);
  promptEl.addEventListener("input", keepDraft);
  // An unsent draft survives a reload (sessionStorage: this tab's, never the server's).
  restoreText(loadDraft(sessionStorage, storageOwner(), conversationId()));
  watchHeight();
  // The box gets narrower while Stop shows beside it, and wider once Stop is gone (the window
  // and the compact layout change it too): its height follows its text at the new width, so
  // it shrinks back instead of staying as tall as the narrow box needed.
  let width = promptEl.clientWidth;
  new ResizeObserver(() => {
    if (promptEl.clientWidth === width) return; // autosize's own height change
    width = promptEl.clientWidth;
    autosize();
  }).observe(promptEl);
  document.body.addEventListener("htmx:afterRequest", () => {
    // A rename or delete removed the control that had focus: give it back to the prompt.
    if (document.activeElement === document.body || !document.activeElement) returnFocusToPrompt();
  });
}

/** Put the controls and the status line in step with the page (call after any change). */
export function update() {
  const streaming = isStreaming();
  const view = composerState({
    streaming,
    connected: isReady(),
    offline: connectionState() === "offline",
    connecting: connectionState() === "connecting",
    touch: touchScreen,
    stopKept: stopKept(),
    awaiting: Boolean(awaiting),
  });
  sendButton.disabled = view.sendDisabled;
  stopButton.hidden = view.stopHidden;
  showBusy(streaming);
  if (statusEl.textContent !== view.status) {
    statusEl.textContent = view.status;
    statusEl.title = view.status; // one line on the page (it may be cut): the whole of it here
  }
}

/**
 * Mark the page short (`data-viewport="short"` on <html>, chat.css makes the composer compact)
 * while the visible height is at most this: a phone's keyboard open leaves 300-400 px. The
 * visual viewport, not the window: iOS shrinks only that one for the keyboard.
 */
const SHORT_VIEWPORT_PX = 480;

function watchHeight() {
  const view = window.visualViewport;
  const measure = () => {
    // At the page's own zoom: pinching in to read does not make the page compact.
    const height = view ? view.height * view.scale : window.innerHeight;
    const short = height <= SHORT_VIEWPORT_PX;
    const root = document.documentElement;
    if (short === (root.dataset.viewport === "short")) return;
    if (short) root.dataset.viewport = "short";
    else delete root.dataset.viewport;
  };
  (view ?? window).addEventListener("resize", measure);
  measure();
}

/** The box grows with its text, up to 40% of the window. */
export function autosize() {
  promptEl.style.height = "auto";
  promptEl.style.height = `${Math.min(promptEl.scrollHeight, window.innerHeight * 0.4)}px`;
}

/** Focus the box as the page opens; not on a phone: there it opens the keyboard over the page. */
export function focusOnLoad() {
  if (!touchScreen) promptEl.focus();
}

/**
 * Focus goes back to the box after an action, unless the user has moved it somewhere else.
 * Not on touch screens: focusing the box there opens the on-screen keyboard over the answer.
 */
export function returnFocusToPrompt() {
  if (touchScreen) return;
  const active = document.activeElement;
  const idle = !active || active === document.body || form.contains(active);
  if (idle) promptEl.focus();
}

/**
 * The server accepted this tab's turn (its answer's shell arrived). The box gets back the
 * draft it held before editing, or is emptied if the prompt came from it.
 * @returns {boolean} whether this tab was waiting for a turn
 */
export function accept() {
  if (!awaiting) return false;
  if (awaiting.edit) leaveEditMode(awaiting.edit.draft);
  else if (awaiting.fromBox !== undefined && promptEl.value === awaiting.fromBox) {
    // Only what was sent leaves the box: anything typed since stays.
    promptEl.value = "";
    autosize();
  }
  // Sent: the draft goes (a new chat's is now its conversation's, under its new id).
  if (awaiting.fromBox !== undefined) {
    saveDraft(sessionStorage, storageOwner(), awaiting.conversation, "");
  }
  keepDraft();
  awaiting = null;
  clearAlert();
  return true;
}

/**
 * An `error` frame. A refused prompt, edit or regeneration loses nothing the user typed: it
 * stays in the box (still in edit mode for an edit) to send again.
 */
export function refused(frame) {
  if (awaiting && (!frame.mid || frame.mid === awaiting.mid)) awaiting = null;
}

/** The socket dropped: nobody knows whether the turn arrived; the text is still in the box. */
export function connectionLost() {
  awaiting = null;
}

/** A new version of this answer: the same prompt asked again (Retry and Regenerate). */
export function regenerate(article) {
  // Retry on a failed answer does the same, so a retry adds a version instead of repeating
  // the prompt in the thread.
  if (!article || !canStartTurn({ streaming: isStreaming(), awaiting: Boolean(awaiting) })) return;
  ask(regenerateFrame(article.dataset.mid, selectedModel()), {});
}

/** Go on with a stopped, cut or length-limited answer, in the same message (Continue). */
export function continueAnswer(article) {
  if (!article || !canStartTurn({ streaming: isStreaming(), awaiting: Boolean(awaiting) })) return;
  ask(continueFrame(article.dataset.mid), { mid: article.dataset.mid });
}

/**
 * A starter prompt from the first screen, sent as it is. The box is left alone (a draft typed
 * there is not replaced), unless the prompt cannot go now: then an empty box keeps it, as the
 * "not connected" alert promises.
 * @param {string} text
 */
export function sendStarter(text) {
  if (!text || !canStartTurn({ streaming: isStreaming(), awaiting: Boolean(awaiting) })) return;
  if (!isReady() && !promptEl.value) {
    promptEl.value = text;
    autosize();
  }
  ask(promptFrame(conversationId(), text, undefined, selectedModel()), {});
}

/**
 * The conversation the next prompt goes to ("" for a new one). Read from the form's hidden
 * input each time: the server's first answer in a new conversation replaces that input.
 */
export function conversationId() {
  const input = document.getElementById("conversation-id");
  return input ? input.value : "";
}

/** Whose this page's stored drafts are: an opaque value per user (drafts.js). */
export function storageOwner() {
  return document.getElementById("main")?.dataset.storageOwner ?? "";
}

/** What the prompt box holds now (sent or not). */
export function boxText() {
  return promptEl.value;
}

/** Put `text` in the prompt box (what the user typed on a page that is gone), as its draft. */
export function restoreText(text) {
  if (!text) return;
  promptEl.value = text;
  autosize();
  keepDraft();
}

/** The box's text is this conversation's draft; not while it holds an earlier prompt to edit
 * (the draft from before the edit is kept, and comes back after it). */
function keepDraft() {
  if (!editing) saveDraft(sessionStorage, storageOwner(), conversationId(), promptEl.value);
}

export function isEditing() {
  return editing !== null;
}

/** Edit this earlier prompt: its text goes in the box, and sending makes a new version of it. */
export function startEdit(article) {
  if (!article || !canStartTurn({ streaming: isStreaming(), awaiting: Boolean(awaiting) })) return;
  const text = article.querySelector(".body").textContent;
  // Editing another message while editing keeps the draft from before the first edit.
  const draft = editing ? editing.draft : promptEl.value;
  markEdited(article.dataset.mid);
  editing = { mid: article.dataset.mid, draft };
  editingEl.hidden = false;
  sendButton.textContent = "Save & send";
  keysEl.textContent = keysHint({ touch: touchScreen }).shortEditing;
  promptEl.setAttribute("aria-describedby", "editing-note composer-status composer-keys");
  promptEl.value = text;
  autosize();
  promptEl.focus();
  promptEl.setSelectionRange(text.length, text.length);
}

export function cancelEdit() {
  if (!editing || awaiting) return;
  leaveEditMode(editing.draft);
  promptEl.focus();
}

/** Mark the message being edited again after the thread was re-rendered around it. */
export function showEditing() {
  if (editing) markEdited(editing.mid);
}

function submitPrompt() {
  const text = promptEl.value;
  if (!text.trim()) return;
  if (!canStartTurn({ streaming: isStreaming(), awaiting: Boolean(awaiting) })) return;
  // An edit makes a new version of that prompt; the thread goes on from it.
  const edit = editing ? { ...editing } : null;
  const conversation = conversationId();
  ask(promptFrame(conversation, text, edit?.mid, selectedModel()), {
    fromBox: text,
    edit,
    conversation,
  });
}

function ask(frame, waiting) {
  // Send a frame that starts a turn; the tab waits for its shell (or its refusal).
  if (send(frame)) {
    awaiting = { mid: frame.type === "prompt" ? undefined : frame.mid, ...waiting };
    scroll.follow();
    update();
  } else {
    showAlert("Not connected right now. Your message is kept; send it again once reconnected.");
  }
}

function leaveEditMode(draft) {
  // Back to a plain prompt box holding `draft` (what was typed before editing began).
  if (!editing) return;
  editing = null;
  markEdited("");
  editingEl.hidden = true;
  sendButton.textContent = "Send";
  keysEl.textContent = keysHint({ touch: touchScreen }).short;
  promptEl.setAttribute("aria-describedby", "composer-status composer-keys");
  promptEl.value = draft;
  autosize();
  keepDraft();
}

function markEdited(mid) {
  for (const el of messages.querySelectorAll(".is-editing")) el.classList.remove("is-editing");
  if (mid) articleFor(mid)?.classList.add("is-editing");
}
