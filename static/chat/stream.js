// stream.js — the chat page's entry module: wires the socket, the answers, the composer and
// the sidebar together, and starts them. Each module owns its own state; they talk through the
// functions they export, and only this file knows all of them. Map: docs/architecture-js.md.
import * as alerts from "./alerts.js";
import * as answers from "./answers.js";
import * as composer from "./composer.js";
import * as copy from "./copy.js";
import { deletedNotice, deletionOutcome, handOff, takeHandoff } from "./deletion.js";
import { forgetAll, forgetOthers, saveDraft } from "./drafts.js";
import * as earlier from "./earlier.js";
import { continuedAnswer } from "./frames.js";
import { escapeAction, isNewChatShortcut } from "./keys.js";
import { alertCountdown } from "./labels.js";
import * as models from "./models.js";
import * as scroll from "./scroll.js";
import * as sidebar from "./sidebar.js";
import * as socket from "./socket.js";
import * as thread from "./thread.js";
import * as tier from "./tier.js";
import * as versions from "./versions.js";

// --- frames in ------------------------------------------------------------------------------
const QUEUED = new Set(["chunk", "block", "blocks"]);
// The alert of a refused `resume` (its own code: only its retry takes it away).
const RESUME_REFUSED = "resume_limited";

/**
 * @param {object} frame a JSON frame
 * @param {boolean} handshake whether it came before the socket's `ready` (a refused handshake)
 */
function onJson(frame, handshake = false) {
  switch (frame.type) {
    case "ready":
      models.showModels(frame);
      tier.showTier(frame, models.picked());
      answers.resumeAll();
      break;
    case "chunk":
      answers.onChunk(frame);
      break;
    case "block":
      answers.onBlock(frame);
      break;
    case "blocks": // a resume's replay: several `block` frames in one
      for (const block of frame.blocks) answers.onBlock(block);
      break;
    case "done": {
      const startedHere = answers.onDone(frame, () => alerts.clearAlert(RESUME_REFUSED));
      if (startedHere || typeof frame.tokens_left === "number") tier.showTokensLeft(frame);
      alerts.clearAlert("too_many_streams"); // an answer ended: a slot is free again
      composer.update();
      composer.returnFocusToPrompt();
      break;
    }
    case "error":
      composer.refused(frame);
      if (answers.onError(frame, () => alerts.clearAlert(RESUME_REFUSED))) {
        // A refused resume: the page asks again by itself, so no "send again" countdown.
        alerts.showAlert(frame.message || "This answer goes on in a moment.", 0, RESUME_REFUSED);
        break;
      }
      // Before `ready` it is a refused handshake (a cap, or CHAT_SOCKET_RATE): the socket
      // reconnects by itself after the wait, so there is nothing for the user to count down to.
      alerts.showAlert(
        frame.message || "Something went wrong.",
        handshake ? 0 : alertCountdown(frame),
        frame.code,
      );
      composer.update();
      composer.returnFocusToPrompt();
      break;
    case "conversation_deleted":
      onDeleted(frame.conversation);
      break;
    case "usage":
      tier.showTokensLeft(frame); // tokens counted after an answer (its title)
      break;
    default:
      break; // unknown frames from a newer server are ignored
  }
}

/**
 * A conversation was deleted in another tab or browser: it leaves the list; if this page shows
 * it, the page becomes a new chat (at `/`, in place of this history entry, as when it is
 * deleted here), with a notice and the box's text.
 * @param {string} id
 */
function onDeleted(id) {
  const outcome = deletionOutcome({
    deleted: id,
    open: composer.conversationId(),
    here: sidebar.deletedHere(id),
  });
  if (outcome === "ignore") return;
  const title = sidebar.titleOf(id) || document.getElementById("chat-title")?.textContent || "";
  sidebar.dropConversation(id);
  if (outcome !== "reset") return;
  const owner = composer.storageOwner();
  handOff(sessionStorage, owner, { title: title.trim(), text: composer.boxText() });
  saveDraft(sessionStorage, owner, id, ""); // its draft moves to the new chat
  location.replace("/");
}

/** The page that was here before showed a conversation deleted elsewhere: say so. */
function showHandoff() {
  const handed = takeHandoff(sessionStorage, composer.storageOwner());
  if (!handed) return;
  composer.restoreText(handed.text);
  alerts.showAlert(deletedNotice(handed.title, Boolean(handed.text)), 0, "conversation_deleted");
}

function onHtml(html) {
  const continued = continuedAnswer(html);
  if (continued && !thread.articleFor(continued)) return; // this tab shows another version
  answers.paintNow();
  // HTML frames carry hx-swap-oob fragments: htmx's swap engine places them.
  // A finished answer keeps the body it showed live, so that body is not parsed again.
  window.htmx.swap(document.body, answers.withoutKeptBodies(html), { swapStyle: "none" });
  const conv = composer.conversationId();
  sidebar.adoptConversation(conv);
  models.adopted(conv);
  thread.dropEmptyState();
  // A new answer shell not marked for watchers, while this tab waits, is its own turn
  // accepted, whether appended or in a whole new thread (an edit or a regeneration).
  const accepted = answers.followNew() && composer.accept();
  if (accepted || conv) sidebar.markCurrent({ moveToTop: accepted });
  composer.showEditing(); // another tab's thread swap may have re-rendered it
  copy.enhance(thread.messages);
  composer.update();
  if (scroll.following()) scroll.scrollToBottom();
}

// --- what buttons and keys do ----------------------------------------------------------------
// Every control with a `data-action` (the page's own and those in server-rendered fragments)
// is handled here, by name; Escape reuses the same names.
const actions = new Map([
  [
    "stop",
    () => {
      answers.stopNewest();
      composer.update(); // offline, the status line says the stop waits for the socket
    },
  ],
  [
    "jump",
    () => {
      scroll.follow();
      scroll.scrollToBottom();
      composer.returnFocusToPrompt(); // the button hid itself, which dropped the focus
    },
  ],
  ["retry", (button) => composer.regenerate(button.closest("article"))],
  ["regenerate", (button) => composer.regenerate(button.closest("article"))],
  ["continue", (button) => composer.continueAnswer(button.closest("article"))],
  ["edit", (button) => composer.startEdit(button.closest("article"))],
  ["cancel-edit", () => composer.cancelEdit()],
  ["starter", (button) => composer.sendStarter(button.dataset.prompt)],
  ["copy", (button) => copy.copyAnswer(button)],
  ["copy-code", (button) => copy.copyCode(button)],
  ["copy-link", (button) => copy.copyLink(button)],
  ["close-menu", () => sidebar.closeMenu()],
  ["open-system-prompt", () => sidebar.openSystemPrompt()],
  ["open-drawer", () => sidebar.setDrawer(true)],
  ["close-drawer", () => sidebar.setDrawer(false)],
]);

document.addEventListener("click", (event) => {
  const button = event.target.closest("[data-action]");
  if (button) actions.get(button.dataset.action)?.(button);
});

document.addEventListener("keydown", (event) => {
  if (event.key === "Escape") {
    const action = escapeAction({
      menuOpen: sidebar.isMenuOpen(),
      drawerOpen: sidebar.isDrawerOpen(),
      streaming: thread.isStreaming(),
      editing: composer.isEditing(),
    });
    if (action) {
      event.preventDefault();
      actions.get(action)();
    }
  } else if (isNewChatShortcut(event)) {
    event.preventDefault();
    location.assign("/");
  }
});

// --- start ------------------------------------------------------------------------------------
document.addEventListener("htmx:oobBeforeSwap", answers.onOobBeforeSwap);
document.getElementById("logout").addEventListener("submit", () => {
  socket.leave();
  forgetAll(sessionStorage); // the next person on this tab must not find them
});
// A tab outlives a login (a Log out in another tab, an expired session): what an earlier user
// of this tab kept goes before anything is restored (docs/security.md).
forgetOthers(sessionStorage, composer.storageOwner());
alerts.onDismiss(composer.returnFocusToPrompt);
scroll.start();
composer.start();
sidebar.start();
versions.start();
earlier.start();
tier.start(socket.renew);
models.onPick(tier.showPicked, composer.conversationId);
answers.watchPage();
copy.enhance(document);
composer.autosize();
scroll.scrollToBottom();
sidebar.markCurrent();
composer.update();
composer.focusOnLoad();
showHandoff();
document.addEventListener("visibilitychange", answers.releaseIfHidden);
socket.start({
  // Chunks and blocks only queue what is painted; any other frame waits for the blocks before it.
  json: (frame) => {
    // Whether it came before `ready` is decided as it arrives: its handling may wait.
    const handshake = !socket.isReady();
    answers.inTurn(() => onJson(frame, handshake), !QUEUED.has(frame.type));
  },
  html: (html) => answers.inTurn(() => onHtml(html)),
  lost: composer.connectionLost,
  connection: composer.update,
  conversation: composer.conversationId,
});
