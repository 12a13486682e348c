// Unsent drafts of the prompt box, one per conversation and one for the new chat, kept in the
// browser (never on the server) so that a reload does not lose them. Pure (storage is passed in:
// the page gives sessionStorage, see docs/architecture-js.md): composer.js calls, tests/js checks.

const PREFIX = "chatsite.draft.";

/** The storage key of conversation `conversation`'s draft ("" is the new chat). */
export function draftKey(conversation) {
  return `${PREFIX}${conversation || "new"}`;
}

/**
 * Keep `text` as the conversation's draft; an empty box keeps nothing.
 * @param {Storage} storage
 * @param {string} conversation "" for the new chat
 * @param {string} text
 */
export function saveDraft(storage, conversation, text) {
  try {
    if (text) storage.setItem(draftKey(conversation), text);
    else storage.removeItem(draftKey(conversation));
  } catch {
    // Storage full or refused (a private window's quota): the box still holds the text.
  }
}

/** The conversation's draft ("" when there is none). @param {Storage} storage */
export function loadDraft(storage, conversation) {
  try {
    return storage.getItem(draftKey(conversation)) ?? "";
  } catch {
    return "";
  }
}

/** Forget every draft (logging out: the next person on this tab must not see them). */
export function clearDrafts(storage) {
  try {
    const keys = [];
    for (let i = 0; i < storage.length; i++) {
      const key = storage.key(i);
      if (key?.startsWith(PREFIX)) keys.push(key);
    }
    for (const key of keys) storage.removeItem(key);
  } catch {
    // Nothing kept, or nothing reachable: nothing to forget.
  }
}
