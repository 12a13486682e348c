// The "‹ 2 / 3 ›" arrows on a message with several versions: htmx fetches the other branch of
// the thread; this keeps the switched message where it was on screen, keeps the keyboard on
// its arrows, says what changed, and follows any answer the new branch still streams.
import { announce, showAlert } from "./alerts.js";
import * as answers from "./answers.js";
import * as composer from "./composer.js";
import { enhance } from "./copy.js";
import * as scroll from "./scroll.js";
import { articleFor, messages } from "./thread.js";

// A switch on its way: which message, which arrow, and where the message was on screen.
let switching = null;

export function start() {
  document.body.addEventListener("htmx:beforeRequest", (event) => {
    const button = event.detail.elt;
    if (!button?.matches?.(".versions button")) return;
    const article = button.closest("article");
    switching = {
      mid: button.dataset.versionMid,
      next: button.classList.contains("version-next"),
      top: article.getBoundingClientRect().top,
    };
  });

  document.body.addEventListener("htmx:beforeSwap", (event) => {
    // The whole thread is about to change under a polite live region: busy, so that a screen
    // reader does not read it all out as new; `announce` says in a few words what changed.
    if (event.detail.target === messages && switching) messages.setAttribute("aria-busy", "true");
  });

  document.body.addEventListener("htmx:afterSwap", (event) => {
    if (event.detail.target !== messages || !switching) return;
    const { mid, next, top } = switching;
    switching = null;
    afterThreadSwap();
    messages.setAttribute("aria-busy", "true");
    requestAnimationFrame(() => requestAnimationFrame(composer.update));
    const article = articleFor(mid);
    if (!article) {
      // The switched message is too far above the new branch's end for the server to send
      // that much (issue 13, finding 17): it sent the branch's latest window, shown as a page
      // load shows it, with "Load earlier messages" to go back up.
      scroll.follow();
      scroll.scrollToBottom();
      announce("Showing the other version: the latest messages of its branch.");
      messages.focus({ preventScroll: true });
      return;
    }
    const label = article.querySelector(".versions")?.getAttribute("aria-label");
    if (label) announce(`Showing ${label.toLowerCase()}.`);
    scroll.keepInPlace(article, top);
    // Focus stays on the arrows of the message just switched (the same one when it can go on),
    // so the keyboard can keep stepping through versions.
    const same = article.querySelector(next ? ".version-next" : ".version-prev");
    const other = article.querySelector(next ? ".version-prev" : ".version-next");
    const target = same && !same.disabled ? same : other && !other.disabled ? other : article;
    if (target === article) article.tabIndex = -1;
    target.focus({ preventScroll: true });
  });

  document.body.addEventListener("htmx:responseError", (event) => {
    if (!switching) return;
    switching = null;
    const notFound = event.detail.xhr?.status === 404;
    showAlert(
      notFound
        ? "That version no longer exists. Reload the page to see the conversation as it is."
        : "That version could not be shown. Try again in a moment.",
    );
  });

  document.body.addEventListener("htmx:sendError", () => {
    if (!switching) return;
    switching = null;
    showAlert("Not connected right now. Try switching versions again once reconnected.");
  });
}

function afterThreadSwap() {
  answers.restartAll();
  composer.showEditing();
  // htmx wires new content when it settles (a moment later); the arrows get focus now and
  // must work at once, so wire them now (processing twice is a no-op).
  window.htmx.process(messages);
  enhance(messages);
  composer.update();
}
