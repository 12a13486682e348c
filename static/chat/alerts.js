// The alert line just above the prompt box (with a live countdown when the server says when to
// try again) and short spoken announcements for what has no visible text of its own.
import { countdownText, withoutStaticRetryHint } from "./labels.js";

const alertsEl = document.getElementById("alerts");
const announcer = document.getElementById("announcer");

let countdownTimer = 0;
let afterDismiss = () => {};

/** What happens after the reader dismisses an alert (the page gives focus back to the box). */
export function onDismiss(callback) {
  afterDismiss = callback;
}

/**
 * Show one alert, replacing any other.
 * @param {string} message
 * @param {number} [countdown] seconds until the user may try again: counted down live, and the
 *   alert goes when it reaches zero (0: no countdown; labels.js `alertCountdown` decides)
 * @param {string} [code] the error frame's code, for tests and styling (`data-code`)
 */
export function showAlert(message, countdown = 0, code = "") {
  clearAlert();
  const p = document.createElement("p");
  p.className = "alert";
  if (code) p.dataset.code = code;
  const words = document.createElement("span");
  words.className = "alert-text";
  const text = document.createElement("span");
  text.textContent = countdown ? withoutStaticRetryHint(message) : message;
  words.append(text);
  p.append(words);
  if (countdown) {
    const count = document.createElement("span");
    count.className = "countdown";
    words.append(" ", count);
    const until = Date.now() + countdown * 1000;
    const tick = () => {
      const left = Math.ceil((until - Date.now()) / 1000);
      if (left <= 0) {
        // The wait is over: the alert has nothing left to say.
        clearAlert();
        announce(countdownText(0));
        return;
      }
      count.textContent = countdownText(left);
    };
    tick();
    countdownTimer = setInterval(tick, 1000);
  }
  const close = document.createElement("button");
  close.type = "button";
  close.className = "icon dismiss";
  close.textContent = "✕";
  close.title = "Dismiss";
  close.setAttribute("aria-label", "Dismiss this message");
  close.addEventListener("click", () => {
    clearAlert();
    afterDismiss();
  });
  p.append(close);
  alertsEl.append(p);
}

/**
 * Take the alert away; with `code`, only an alert of that code (an answer ended: "wait for an
 * answer to end" is out of date).
 * @param {string} [code]
 */
export function clearAlert(code) {
  if (code && !alertsEl.querySelector(`.alert[data-code="${code}"]`)) return;
  clearInterval(countdownTimer);
  alertsEl.replaceChildren();
}

/** Short polite messages for what has no visible text of its own (e.g. "copied"). */
export function announce(text) {
  if (!announcer || !text) return;
  announcer.textContent = "";
  requestAnimationFrame(() => {
    announcer.textContent = text;
  });
}
