// The thread a window at a time (issue 13, finding 17): "Load earlier messages" fetches the
// window before the first message shown and keeps the reader's place; a fork frame (an edit, a
// regeneration) drops what followed the message its branch goes on from, so that htmx only
// appends the new messages instead of the server sending the whole thread.
import { announce, showAlert } from "./alerts.js";
import { enhance } from "./copy.js";
import * as scroll from "./scroll.js";
import { articleFor, isStreaming, messages, showBusy } from "./thread.js";

// A load on its way: its button, and the first message shown with where it was on screen.
let loading = null;

export function start() {
  document.body.addEventListener("htmx:beforeRequest", (event) => {
    const button = event.detail.elt;
    if (!button?.matches?.(".load-earlier-button")) return;
    const anchor = button.closest(".load-earlier").nextElementSibling;
    loading = { button, anchor, top: anchor?.getBoundingClientRect().top ?? 0 };
    button.setAttribute("aria-busy", "true");
    button.textContent = "Loading earlier messages…";
  });

  document.body.addEventListener("htmx:beforeSwap", (event) => {
    // Fifty messages arrive under a polite live region: busy, so that a screen reader does not
    // read them all out as new; `announce` says in a few words what happened.
    if (loading && event.detail.requestConfig?.elt === loading.button) {
      messages.setAttribute("aria-busy", "true");
    }
  });

  document.body.addEventListener("htmx:afterSwap", (event) => {
    // htmx fires this once per element swapped in: the first one finds them all in place.
    if (!loading || event.detail.requestConfig?.elt !== loading.button) return;
    const { anchor, top } = loading;
    loading = null;
    showBusy(isStreaming());
    if (anchor?.isConnected) scroll.keepInPlace(anchor, top);
    window.htmx.process(messages); // the new control must work at once
    enhance(messages);
    const added = anchor ? countBefore(anchor) : 0;
    announce(`Showing ${added} earlier message${added === 1 ? "" : "s"}.`);
    // The keyboard stays at the top of the thread: on the next control if more come before.
    const next = messages.querySelector(".load-earlier-button");
    const target = next || anchor;
    if (target) {
      if (!next) target.tabIndex = -1;
      target.focus({ preventScroll: true });
    }
  });

  const failed = (message) => () => {
    if (!loading) return;
    const { button } = loading;
    loading = null;
    button.removeAttribute("aria-busy");
    button.textContent = "Load earlier messages";
    showAlert(message);
  };
  document.body.addEventListener(
    "htmx:responseError",
    failed("The earlier messages could not be loaded. Reload the page and try again."),
  );
  document.body.addEventListener(
    "htmx:sendError",
    failed("Not connected right now. Try loading earlier messages again once reconnected."),
  );

  document.body.addEventListener("htmx:oobBeforeSwap", (event) => {
    const fragment = event.detail.fragment;
    if (event.detail.target !== messages || !fragment?.hasAttribute?.("data-fork-after")) return;
    dropAfterFork(fragment);
  });
}

/**
 * A fork frame is about to be appended: drop every message after the one its branch goes on
 * from. If the page does not show that message (another window, or a first prompt edited),
 * the page drops every message and keeps the frame's "Load earlier messages" control, which
 * fetches what comes before the new messages; otherwise that control is not needed.
 * @param {Element} fragment
 */
function dropAfterFork(fragment) {
  const after = fragment.getAttribute("data-fork-after");
  const anchor = after ? articleFor(after) : null;
  if (anchor && anchor.parentElement === messages) {
    while (anchor.nextElementSibling) anchor.nextElementSibling.remove();
    for (const control of fragment.querySelectorAll(".load-earlier")) control.remove();
  } else {
    messages.replaceChildren();
  }
}

function countBefore(element) {
  let n = 0;
  for (let e = element.previousElementSibling; e; e = e.previousElementSibling) {
    if (e.tagName === "ARTICLE") n += 1;
  }
  return n;
}
