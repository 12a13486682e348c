// The messages of the open conversation on the page: finding an answer, the answers still
// streaming, and the thread's busy state. Everyone reads the thread through these.

/** The `<section id="messages">` that holds the thread. */
export const messages = document.getElementById("messages");

/** The message `mid` on the page (a prompt or an answer), or null. @param {string} mid */
export function articleFor(mid) {
  return document.getElementById(`msg-${mid}`);
}

/** Every answer on the page still streaming, oldest first. */
export function streamingArticles() {
  return messages.querySelectorAll('article.msg-assistant[data-status="streaming"]');
}

/** Whether an answer streams in this conversation (asked here, in another tab, before a reload). */
export function isStreaming() {
  return streamingArticles().length > 0;
}

/**
 * While an answer streams the thread is busy: a screen reader reads each answer once, when it
 * is complete, instead of every streamed word; chat.css hides edit and version switching.
 * @param {boolean} streaming
 */
export function showBusy(streaming) {
  messages.setAttribute("aria-busy", String(streaming));
  messages.classList.toggle("is-streaming", streaming);
}

/** The "Ask anything" placeholder goes once the thread has a message. */
export function dropEmptyState() {
  if (messages.querySelector("article")) document.getElementById("empty-state")?.remove();
}
