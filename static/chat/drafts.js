// Unsent drafts of the prompt box, one per conversation and one for the new chat, kept in the
// browser (never on the server) so that a reload does not lose them; and whose they are. Pure
// (storage is passed in: the page gives sessionStorage, see docs/architecture-js.md):
// composer.js calls, tests/js checks.
//
// Every key the page keeps is `chatsite.<owner>.<name>`: `owner` is an opaque value the page
// is rendered with, one per user (`data-storage-owner`). A tab outlives a login: on every page
// load `forgetOthers` drops what an earlier user of the tab left (docs/security.md).

const PREFIX = "chatsite.";

/** The storage key of `name` kept for `owner`. */
export function ownedKey(owner, name) {
  return `${PREFIX}${owner}.${name}`;
}

/** The storage key of conversation `conversation`'s draft ("" is the new chat). */
export function draftKey(owner, conversation) {
  return ownedKey(owner, `draft.${conversation || "new"}`);
}

/**
 * Keep `text` as the conversation's draft; an empty box keeps nothing.
 * @param {Storage} storage
 * @param {string} owner the page's `data-storage-owner`
 * @param {string} conversation "" for the new chat
 * @param {string} text
 */
export function saveDraft(storage, owner, conversation, text) {
  try {
    if (text) storage.setItem(draftKey(owner, conversation), text);
    else storage.removeItem(draftKey(owner, conversation));
  } catch {
    // Storage full or refused (a private window's quota): the box still holds the text.
  }
}

/** The conversation's draft ("" when there is none). @param {Storage} storage */
export function loadDraft(storage, owner, conversation) {
  try {
    return storage.getItem(draftKey(owner, conversation)) ?? "";
  } catch {
    return "";
  }
}

/** Forget everything the page keeps (logging out: the next person on this tab must not see it). */
export function forgetAll(storage) {
  forgetWhere(storage, () => true);
}

/**
 * Forget everything the page keeps that is not `owner`'s: drafts, the hand-off of a deleted
 * conversation, a new chat's model pick, and keys of any older shape.
 * @param {Storage} storage
 * @param {string} owner
 */
export function forgetOthers(storage, owner) {
  const mine = ownedKey(owner, "");
  forgetWhere(storage, (key) => !owner || !key.startsWith(mine));
}

function forgetWhere(storage, drop) {
  try {
    const keys = [];
    for (let i = 0; i < storage.length; i++) {
      const key = storage.key(i);
      if (key?.startsWith(PREFIX) && drop(key)) keys.push(key);
    }
    for (const key of keys) storage.removeItem(key);
  } catch {
    // Nothing kept, or nothing reachable: nothing to forget.
  }
}
