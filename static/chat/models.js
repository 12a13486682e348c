// The model picker in the composer: which models this user may pick on this device (the
// `ready` frame's `models`, the tier's default first) and the one picked for the next turn.
const pickerEl = document.getElementById("model-picker");
let lastDefault = pickerEl ? pickerEl.options[0]?.value ?? null : null;

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

/** Call `changed(picked())` whenever the user picks another model. */
export function onPick(changed) {
  if (pickerEl) pickerEl.addEventListener("change", () => changed(picked()));
}
