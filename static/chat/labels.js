// The words the chat page shows for what the server says: countdowns, alerts, the tier badge.
//
// Pure functions (no DOM): the page's modules put their results on the page; tests/js checks them.

const CONNECTION_LABELS = {
  connecting: "Connecting…",
  connected: "Connected",
  reconnecting: "Reconnecting…",
  offline: "Offline",
  "logged-out": "Logged out",
};

/**
 * The header's word for the socket's state. Short: the composer's status line says what the
 * state means for the user.
 * @param {string} state connecting, connected, reconnecting, offline or logged-out
 * @returns {string}
 */
export function connectionLabel(state) {
  return Object.hasOwn(CONNECTION_LABELS, state) ? CONNECTION_LABELS[state] : String(state);
}

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
 * How long an `error` frame's alert counts down, in seconds; 0 for no countdown.
 *
 * At the cap on concurrent answers the wait lasts until one of them ends, which no clock can
 * promise (the frame says `"retry_when": "stream_ends"`; older servers sent a `retry_after` of
 * a few seconds, which counted down to a moment that changed nothing): no countdown then.
 * @param {{code?: string, retry_after?: number, retry_when?: string}} frame
 * @returns {number}
 */
export function alertCountdown({ code, retry_after: retryAfter, retry_when: retryWhen } = {}) {
  if (code === "too_many_streams" || retryWhen === "stream_ends") return 0;
  const seconds = Number(retryAfter);
  return Number.isFinite(seconds) && seconds > 0 ? seconds : 0;
}

/**
 * What the live countdown says `left` seconds before the user may send again.
 * @param {number} left seconds
 * @returns {string}
 */
export function countdownText(left) {
  // Short: it follows the limit's own sentence ("You can send 1 message per minute.").
  return left > 0 ? `Send again in ${formatSeconds(left)}.` : "You can send again now.";
}

/**
 * The tier badge's label, hover title and longer explanation for a `ready` frame
 * (`{tier, model, device, reason, why}`) or the page's own tier, and whether the popover's
 * tier choice applies (`choosing`: not while a picked model answers instead of the tier's).
 * `why` is the server's sentence for the reason ("Chosen because this looks like a phone.").
 * @param {{tier?: string, model?: string, device?: string, reason?: string, why?: string}} info
 * @param {{id: string, label?: string} | null} picked the model picked in the composer
 * @returns {{tier: string, label: string, title: string, details: string[], choosing: boolean}}
 */
export function tierBadge({ tier, model, device, reason, why } = {}, picked = null) {
  const lite = tier === "lite";
  const name = lite ? "Lite model" : "Full model";
  // A model picked in the composer's picker answers instead of the device's default: the
  // badge names what answers, and the details say what the default is and how to go back,
  // not what the default is good for nor (the caller hides it) a tier to switch to.
  const other = picked && picked.id && picked.id !== model ? picked : null;
  const label = other
    ? `${other.label || other.id} · picked`
    : model
      ? `${name} · ${model}`
      : name;
  const because = why || (reason ? `Chosen because: ${reason}.` : "");
  const named = `${lite ? "lite" : "full"} model${model ? ` (${model})` : ""}`;
  const details = other
    ? [
        `You picked ${other.label || other.id} for this conversation: it answers here.`,
        `This device's default is the ${named}. ${because}`.trim(),
        "To go back to the default, pick it in the model list.",
      ]
    : [
        `${name}${model ? ` (${model})` : ""} answers on this device.`,
        because,
        // A reason that is the device already names it: say it once.
        device && device !== reason ? `Detected device: ${device}.` : "",
        lite
          ? "The lite model is smaller and faster, and uses less data."
          : "The full model gives the best answers.",
      ].filter(Boolean);
  return {
    tier: lite ? "lite" : "full",
    label,
    title: [label, other ? "" : because].filter(Boolean).join(" — "),
    details,
    choosing: !other,
  };
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
