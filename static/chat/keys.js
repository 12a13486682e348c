// Which keys do what on the chat page. Pure (no DOM): composer.js and stream.js ask it about a
// KeyboardEvent's fields; tests/js checks it.

/**
 * What Enter in the prompt box does.
 *
 * - `"send"`: send the prompt (Enter on a keyboard).
 * - `"hold"`: nothing is sent and the text stays: an answer is still streaming or the last
 *   prompt is on its way, and a second turn now would be refused by the limits (or answered
 *   without the first answer). The status line says Enter works once the answer ends.
 * - `null`: the browser's own Enter: a new line (Shift+Enter; any Return on a touch screen,
 *   whose on-screen keyboard has no Shift+Enter, so the Send button sends there), or the end
 *   of an IME composition (Chinese, Japanese, …).
 * @param {{key: string, shiftKey?: boolean, isComposing?: boolean}} event
 * @param {{touch?: boolean, busy?: boolean}} [page] `touch`: a coarse pointer (a phone or a
 *   tablet); `busy`: a turn may not start now (see composer-state.js `canStartTurn`)
 * @returns {"send" | "hold" | null}
 */
export function enterAction({ key, shiftKey = false, isComposing = false }, page = {}) {
  if (key !== "Enter" || shiftKey || isComposing || page.touch) return null;
  return page.busy ? "hold" : "send";
}

/**
 * The `enterkeyhint` of the prompt box: the label of the on-screen keyboard's Return key.
 * On a touch screen Return makes a new line (the Send button sends); elsewhere it sends.
 * @param {{touch: boolean}} page
 * @returns {"enter" | "send"}
 */
export function enterKeyHint({ touch }) {
  return touch ? "enter" : "send";
}

/**
 * The page's words for what the keys do on this device: `short` under the prompt box
 * (`shortEditing` there while an earlier prompt is edited: the button then says "Save & send"),
 * `long` on the first screen, `editing` above the box while an earlier prompt is edited (a
 * phone's on-screen keyboard has no Esc key).
 * @param {{touch: boolean}} page
 * @returns {{short: string, shortEditing: string, long: string, editing: string}}
 */
export function keysHint({ touch }) {
  return touch
    ? {
        short: "Return: new line · tap Send to send",
        shortEditing: "Return: new line · tap Save & send",
        long: "Return makes a new line; tap Send to send, and Stop to end an answer.",
        editing: "Editing an earlier message — Tap Cancel to stop editing",
      }
    : {
        short: "Enter sends · Shift+Enter new line",
        shortEditing: "Enter saves & sends · Shift+Enter new line",
        long:
          "Enter sends, Shift+Enter makes a new line, Esc stops an answer, " +
          "Ctrl+Shift+O starts a new chat.",
        editing: "Editing an earlier message — Esc or Cancel to stop editing",
      };
}

/**
 * What Escape does, most local first: close a conversation's "⋯" menu, else the drawer, else
 * stop the streaming answer, else stop editing. The names are the page's `data-action`s.
 * @param {{menuOpen?: boolean, drawerOpen: boolean, streaming: boolean, editing: boolean}} page
 * @returns {"close-menu" | "close-drawer" | "stop" | "cancel-edit" | null}
 */
export function escapeAction({ menuOpen = false, drawerOpen, streaming, editing }) {
  if (menuOpen) return "close-menu";
  if (drawerOpen) return "close-drawer";
  if (streaming) return "stop";
  if (editing) return "cancel-edit";
  return null;
}

/**
 * Ctrl+Shift+O (Cmd+Shift+O on a Mac) starts a new chat, as in other chat apps.
 * @param {{key: string, shiftKey?: boolean, ctrlKey?: boolean, metaKey?: boolean}} event
 */
export function isNewChatShortcut({ key, shiftKey = false, ctrlKey = false, metaKey = false }) {
  return String(key).toLowerCase() === "o" && shiftKey && (ctrlKey || metaKey);
}
