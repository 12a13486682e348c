// The chat socket's frames as the page sees them: what a frame from the server is, and the
// frames the page sends. Pure (no DOM, no socket): socket.js reads with it, answers.js and
// composer.js build with it. The wire protocol itself is in docs/protocol.md.

/**
 * What a frame from the server is.
 *
 * A text frame starting with `{` is JSON (`ready`, `chunk`, `done`, `error`); anything else is
 * HTML, fragments with `hx-swap-oob` for htmx to place. A binary frame, or JSON that does not
 * parse, is ignored (`null`): a newer or broken server must not break the page.
 * @param {unknown} data `MessageEvent.data`
 * @returns {{json: object} | {html: string} | null}
 */
export function readFrame(data) {
  if (typeof data !== "string") return null;
  if (data.charCodeAt(0) !== 123 /* { */) return { html: data };
  try {
    return { json: JSON.parse(data) };
  } catch {
    return null;
  }
}

/**
 * The answer an HTML frame continues for a tab that did not ask (another tab pressed Continue:
 * the answer's shell, out of band, marked `data-watch`), or null for any other frame. The
 * server sends it to every tab showing the conversation, but which version of a message a tab
 * shows is the tab's own (the "‹ 1 / 2 ›" arrows): where another version is on show, the
 * frame has no place, and handed to htmx it would log `htmx:oobErrorNoTarget`.
 * @param {string} html
 * @returns {string | null} the answer's mid
 */
export function continuedAnswer(html) {
  const found = CONTINUED.exec(html);
  return found ? found[1] : null;
}

// The shell chat/bubbles.py makes for watchers (chat.fragments.continuation_html).
const CONTINUED =
  /^\s*<article class="msg msg-assistant" id="msg-([^"\s]+)"[^>]*\sdata-watch="1"[^>]*\shx-swap-oob="true"[^>]*>/;

/**
 * Ask a question: a new turn in `conversation` (empty: a new conversation). With `replaces`,
 * the turn is a new version of that earlier prompt and the thread goes on from it.
 * @param {string} conversation
 * @param {string} text
 * @param {string} [replaces] the mid of the prompt being edited
 * @param {string} [model] the model picked for it (one of the `ready` frame's `models`)
 */
export function promptFrame(conversation, text, replaces, model) {
  const frame = { type: "prompt", conversation, text };
  if (replaces) frame.replaces = replaces;
  if (model) frame.model = model;
  return frame;
}

/**
 * Ask again for a new version of the answer `mid` (Retry and Regenerate).
 * @param {string} mid
 * @param {string} [model] the model picked for it
 */
export function regenerateFrame(mid, model) {
  const frame = { type: "regenerate", mid };
  if (model) frame.model = model;
  return frame;
}

/** Go on with the stopped, cut or length-limited answer `mid`. @param {string} mid */
export function continueFrame(mid) {
  return { type: "continue", mid };
}

/** Stop the answer `mid`, whichever tab asked for it. @param {string} mid */
export function stopFrame(mid) {
  return { type: "stop", mid };
}

/**
 * Send every chunk of answer `mid` with `seq > after`, then the live ones.
 * @param {string} mid
 * @param {number} after the last seq the page shows in order (-1: none, send them all)
 */
export function resumeFrame(mid, after) {
  return { type: "resume", mid, after };
}
