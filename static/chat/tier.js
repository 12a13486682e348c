// The tier badge under the composer (which model answers on this device, and why) and the
// usage meter (today's tokens left). The badge's popover is plain HTML (`popover`) outside the
// composer form; its choice posts with htmx, which swaps in the new badge and popover.
import { tierBadge, tokensLeftAfter, tokensLeftText } from "./labels.js";

const usage = document.getElementById("usage-meter");

/**
 * Listen for a tier choice made in the popover. The server answered with the new badge and
 * popover and a `tier-chosen` event; `chosen` reconnects the socket, whose handshake then
 * carries the choice (the next `ready` frame shows it).
 * @param {() => void} chosen
 */
export function start(chosen) {
  document.body.addEventListener("tier-chosen", () => chosen());
  // Typing wins over reading about the tier: where the popover cannot be placed above the
  // prompt box (no CSS anchor positioning) it may cover it, so it closes when the box is
  // focused (a tap, Tab, the page giving focus back after an action).
  document.getElementById("prompt")?.addEventListener("focus", () => {
    const info = document.getElementById("tier-info"); // swapped by a choice: look it up
    if (info?.matches(":popover-open")) info.hidePopover();
  });
}

/**
 * Show the tier of a `ready` frame. The socket decides the tier from its own handshake, which
 * may differ from the page's.
 * @param {{tier?: string, model?: string, device?: string, reason?: string}} ready
 */
let lastReady = null;
let lastPicked = null;

export function showTier(ready, picked = lastPicked) {
  if (!ready.tier) return;
  lastReady = ready;
  lastPicked = picked;
  const words = tierBadge(ready, picked);
  // Looked up each time: a tier choice swaps both for new ones.
  const badge = document.getElementById("tier-badge");
  const info = document.getElementById("tier-info");
  if (badge) {
    badge.dataset.tier = words.tier;
    badge.querySelector(".label").textContent = words.label;
    badge.title = words.title;
  }
  if (info) {
    const paragraphs = words.details.map((line) => {
      const p = document.createElement("p");
      p.textContent = line;
      return p;
    });
    info.querySelector(".details").replaceChildren(...paragraphs);
    // While a picked model answers, switching the device's tier would change nothing here.
    const choice = info.querySelector("#tier-choice");
    if (choice) choice.hidden = !words.choosing;
  }
  for (const el of document.querySelectorAll("[data-model-name]")) el.textContent = ready.model;
}

/**
 * Show which model answers once the picker's choice changed (null: the device's default).
 * @param {{id: string, label: string} | null} picked
 */
export function showPicked(picked) {
  if (lastReady) showTier(lastReady, picked);
}

/**
 * Update the meter after an answer's `done` frame. The frame carries the server's count of
 * today's tokens left (with a daily quota); without it the meter takes the answer's usage off
 * what it showed.
 */
export function showTokensLeft(done) {
  if (!usage) return;
  const left = tokensLeftAfter(done, Number(usage.dataset.tokensLeft) || 0);
  usage.dataset.tokensLeft = String(left);
  usage.querySelector(".text").textContent = tokensLeftText(left);
  const meter = usage.querySelector("meter");
  if (meter) meter.value = left;
}
