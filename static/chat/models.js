// The model picker in the composer: which models this user may pick on this device (the
// `ready` frame's `models`, the tier's default first) and the one picked for the next turn.
//
// A pick sticks to its conversation as soon as it is made, not only with the next prompt: the
// server stores it for a conversation that exists (`POST /c/<id>/model/`), and a new chat's
// pick waits in this tab's session storage until its first prompt creates the conversation
// (which then stores it). A reload or a later visit shows the pick (docs/protocol.md).
import { ownedKey } from "./drafts.js";

const pickerEl = document.getElementById("model-picker");
let lastDefault = pickerEl ? pickerEl.options[0]?.value ?? null : null;
// Kept under the page's owner like the drafts: stream.js drops an earlier user's on load.
const NEW_CHAT_PICK = ownedKey(
  document.getElementById("main")?.dataset.storageOwner ?? "",
  "new-chat-model",
);

/** The model picked for the next prompt ("" when the page has no picker). */
export function selectedModel() {
  return pickerEl ? pickerEl.value : "";
}

/**
 * Show the models of a `ready` frame. The pick stays where it is while it is still offered;
 * otherwise the tier's default (the first) is picked.
 * @param {{models?: {id: string, label: string}[]}} ready
 */
export function showModels(ready) {
  if (!pickerEl || !Array.isArray(ready.models) || !ready.models.length) return;
  const current = pickerEl.value;
  const options = ready.models.map(({ id, label }) => {
    const option = document.createElement("option");
    option.value = id;
    option.textContent = label || id;
    return option;
  });
  pickerEl.replaceChildren(...options);
  // A new default (the tier changed, e.g. chosen in the badge's popover) is picked with it;
  // otherwise the pick stays while it is still offered.
  const fresh = ready.models[0].id;
  const kept = fresh === lastDefault && ready.models.some(({ id }) => id === current);
  pickerEl.value = kept ? current : fresh;
  lastDefault = fresh;
  pickerEl.closest(".model-picker").hidden = ready.models.length < 2;
}

/** The model picked, as `{id, label}` (null when the page has no picker or it is hidden). */
export function picked() {
  if (!pickerEl || pickerEl.closest(".model-picker").hidden) return null;
  const option = pickerEl.selectedOptions[0];
  return option ? { id: option.value, label: option.textContent } : null;
}

/** The default's label (the first option), e.g. to say how to go back to it. */
export function defaultLabel() {
  return pickerEl?.options[0]?.textContent ?? "";
}

/**
 * Call `changed(picked())` whenever the user picks another model, after keeping the pick for
 * the conversation `conversation()` names ("" for a new chat).
 * @param {(picked: {id: string, label: string} | null) => void} changed
 * @param {() => string} conversation
 */
export function onPick(changed, conversation) {
  if (!pickerEl) return;
  if (!conversation()) restoreNewChatPick();
  pickerEl.addEventListener("change", () => {
    keep(conversation(), pickerEl.value);
    changed(picked());
  });
}

/** The conversation now exists (its first prompt stored the pick): the tab's copy goes. */
export function adopted(conversation) {
  if (conversation) storage()?.removeItem(NEW_CHAT_PICK);
}

function keep(conversation, model) {
  if (!conversation) {
    storage()?.setItem(NEW_CHAT_PICK, model);
    return;
  }
  // htmx sends the CSRF header (`hx-headers` on <body>); a refusal (a model no longer
  // allowed) shows nowhere: the next prompt names the model and is refused in words.
  window.htmx.ajax("POST", `/c/${encodeURIComponent(conversation)}/model/`, {
    source: document.body,
    values: { model },
    swap: "none",
  });
}

function restoreNewChatPick() {
  const model = storage()?.getItem(NEW_CHAT_PICK);
  if (model && [...pickerEl.options].some((option) => option.value === model)) {
    pickerEl.value = model;
  }
}

function storage() {
  try {
    return window.sessionStorage;
  } catch {
    return null; // storage blocked (privacy settings): a new chat's pick lasts until a reload
  }
}
