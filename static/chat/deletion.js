// A conversation deleted in another tab or browser (the server's `conversation_deleted` frame):
// what this page does about it, the words it shows, and what it carries across the reload to
// the new chat. Pure (no DOM; storage is passed in): stream.js acts, tests/js checks.

import { ownedKey } from "./drafts.js";

/** The sessionStorage key that carries the box's text and the notice across the reload. */
export function handoffKey(owner) {
  return ownedKey(owner, "deleted-elsewhere");
}

/**
 * What the page does when told that `deleted` is gone.
 * @param {{deleted: string, open: string, here: boolean}} page `open`: the conversation the page
 *   shows ("" for a new chat); `here`: this page asked for that deletion itself (its own
 *   response drops the list entry, and makes the page a new chat: nothing more to do)
 * @returns {"ignore"|"drop"|"reset"} `drop`: take it out of the list; `reset`: that too, and
 *   the page becomes a new chat
 */
export function deletionOutcome({ deleted, open, here }) {
  if (!deleted || here) return "ignore";
  return deleted === open ? "reset" : "drop";
}

/**
 * The notice the new chat shows.
 * @param {string} title the deleted conversation's title ("" if the page did not know it)
 * @param {boolean} kept whether the box held text, now in the new chat's box
 */
export function deletedNotice(title, kept) {
  const which = title ? `“${title}”` : "This conversation";
  const rest = kept ? " this is a new chat. What you had typed is kept." : " this is a new chat.";
  return `${which} was deleted in another tab or window, so${rest}`;
}

/**
 * Keep what the page had (its title and the box's text) for the new chat that replaces it.
 * @param {Storage} storage sessionStorage: this tab only, and it survives the reload
 * @param {string} owner the page's `data-storage-owner` (drafts.js)
 * @param {{title: string, text: string}} what
 */
export function handOff(storage, owner, { title, text }) {
  try {
    const what = { title: String(title), text: String(text) };
    storage.setItem(handoffKey(owner), JSON.stringify(what));
  } catch {
    // Storage full or refused: the new chat still shows, without the text or the notice.
  }
}

/**
 * What a page handed over before it became this new chat (once: it is removed), or null.
 * @param {Storage} storage
 * @param {string} owner
 * @returns {{title: string, text: string} | null}
 */
export function takeHandoff(storage, owner) {
  let raw = null;
  try {
    raw = storage.getItem(handoffKey(owner));
    storage.removeItem(handoffKey(owner));
  } catch {
    return null;
  }
  if (!raw) return null;
  try {
    const { title, text } = JSON.parse(raw);
    return { title: typeof title === "string" ? title : "", text: typeof text === "string" ? text : "" };
  } catch {
    return null;
  }
}
