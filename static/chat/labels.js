// The words the chat page shows for what the server says: countdowns, alerts, the tier badge.
//
// Pure functions (no DOM): stream.js puts their results on the page; tests/js checks them.

/**
 * A short human duration: "45 s", "2 min 5 s", "3 h 20 min".
 * @param {number} seconds a whole number of seconds (rounded up if not)
 * @returns {string}
 */
export function formatSeconds(seconds) {
  const s = Math.max(0, Math.ceil(Number(seconds) || 0));
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return s % 60 ? `${m} min ${s % 60} s` : `${m} min`;
  const h = Math.floor(m / 60);
  return m % 60 ? `${h} h ${m % 60} min` : `${h} h`;
}

/**
 * The alert text for an `error` frame that carries `retry_after`.
 *
 * The server's message ends with a static "Try again in 59 s."; the page shows a live
 * countdown instead, so that sentence is dropped to avoid saying the same thing twice with
 * two different numbers a few seconds later.
 * @param {string} message
 * @returns {string}
 */
export function withoutStaticRetryHint(message) {
  const text = String(message ?? "");
  const trimmed = text.replace(/\s*Try again in [^.]*\.\s*$/, "");
  return trimmed || text;
}

/**
 * What the live countdown says `left` seconds before the user may send again.
 * @param {number} left seconds
 * @returns {string}
 */
export function countdownText(left) {
  return left > 0 ? `You can send again in ${formatSeconds(left)}.` : "You can send again now.";
}

/**
 * The tier badge's label, hover title and longer explanation for a `ready` frame
 * (`{tier, model, device, reason}`) or the page's own tier.
 * @param {{tier?: string, model?: string, device?: string, reason?: string}} info
 * @returns {{tier: string, label: string, title: string, details: string[]}}
 */
export function tierBadge({ tier, model, device, reason } = {}) {
  const lite = tier === "lite";
  const name = lite ? "Lite model" : "Full model";
  const label = model ? `${name} · ${model}` : name;
  const why = reason ? `Why: ${reason}.` : "";
  const details = [
    `${name}${model ? ` (${model})` : ""} answers on this device.`,
    why,
    device ? `Detected device: ${device}.` : "",
    lite
      ? "The lite model is smaller and faster, and uses less data."
      : "The full model gives the best answers.",
  ].filter(Boolean);
  return { tier: lite ? "lite" : "full", label, title: [label, why].filter(Boolean).join(" — "), details };
}

/**
 * "12,345 tokens left today" (never negative).
 * @param {number} tokens
 * @returns {string}
 */
export function tokensLeftText(tokens) {
  const n = Math.max(0, Math.floor(Number(tokens) || 0));
  return `${n.toLocaleString("en-US")} ${n === 1 ? "token" : "tokens"} left today`;
}

/**
 * Today's tokens left after an answer's `done` frame, for the usage meter.
 *
 * The server's own count (`tokens_left`, sent when the user has a daily quota) wins: it
 * includes what other tabs and devices spent. Without it the meter estimates, taking the
 * answer's usage off what it showed (`shown`).
 * @param {{tokens_left?: number, usage?: {prompt_tokens?: number, completion_tokens?: number}}} done
 * @param {number} shown what the meter shows now
 * @returns {number}
 */
export function tokensLeftAfter(done, shown) {
  const exact = done?.tokens_left;
  if (typeof exact === "number" && Number.isFinite(exact)) {
    return Math.max(0, Math.floor(exact));
  }
  const usage = done?.usage || {};
  const used = (Number(usage.prompt_tokens) || 0) + (Number(usage.completion_tokens) || 0);
  return Math.max(0, (Number(shown) || 0) - used);
}
