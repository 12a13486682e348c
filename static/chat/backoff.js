// When the chat socket tries again after it dropped: exponential backoff with full jitter.
// Also how long a refused handshake or `resume` waits: the server's `retry_after`, jittered.
//
// Pure logic (no DOM, no timers): socket.js asks it how long to wait before reconnect attempt n.

/** The first retry waits up to this long. */
export const BACKOFF_BASE_MS = 400;
/** No retry waits longer than this, however many attempts failed. */
export const BACKOFF_MAX_MS = 15000;

/**
 * How long to wait before reconnect attempt `attempt` (0 for the first retry).
 *
 * Full jitter (a uniform pick in [0, cap)) rather than a fixed delay, so that when a server
 * restarts, its thousands of tabs do not all come back in the same millisecond.
 *
 * @param {number} attempt how many attempts already failed in a row (0, 1, 2, …)
 * @param {{base?: number, max?: number, random?: () => number}} [options] `random` returns a
 *   float in [0, 1) (Math.random by default; tests pass a fixed one)
 * @returns {number} milliseconds, in [0, min(max, base · 2^attempt))
 */
export function reconnectDelay(attempt, { base = BACKOFF_BASE_MS, max = BACKOFF_MAX_MS, random = Math.random } = {}) {
  const n = Number.isFinite(attempt) && attempt > 0 ? Math.floor(attempt) : 0;
  // 2 ** 60 is still finite, but cap the exponent so the arithmetic never needs to care.
  const cap = Math.min(max, base * 2 ** Math.min(n, 30));
  return Math.floor(random() * cap);
}

/**
 * The next reconnect after the socket dropped: how long to wait, and what the page says
 * meanwhile.
 *
 * Offline, attempts would only fail: the `online` event reconnects at once, and the longest
 * wait covers a browser that misses telling us.
 * @param {number} attempt how many attempts already failed in a row
 * @param {{offline?: boolean, random?: () => number, retryAfter?: unknown}} [options]
 *   `offline`: the browser says it has no network (`navigator.onLine === false`);
 *   `retryAfter`: the seconds an `error` before the close said to wait (a refused handshake)
 * @returns {{delay: number, connection: "offline" | "reconnecting"}}
 */
export function nextReconnect(attempt, { offline = false, random = Math.random, retryAfter } = {}) {
  if (offline) return { delay: BACKOFF_MAX_MS, connection: "offline" };
  const delay = reconnectDelay(attempt, { random });
  // The server refused the handshake and said when to come back (CHAT_SOCKET_RATE, a cap on
  // sockets): not sooner, or the next tries are refused too.
  const seconds = Number(retryAfter);
  if (!Number.isFinite(seconds) || seconds <= 0) return { delay, connection: "reconnecting" };
  return {
    delay: Math.max(delay, resumeRetryDelay(seconds, { random })),
    connection: "reconnecting",
  };
}

/** A refused `resume` without a usable `retry_after` is asked again after this long. */
export const RESUME_RETRY_DEFAULT_S = 5;
/** ... plus up to this much, so that a user's tabs refused together do not ask together. */
export const RESUME_RETRY_JITTER_MS = 1000;

/**
 * How long a page waits before it asks again for an answer whose `resume` was refused
 * (`rate_limited`, docs/protocol.md): the frame's `retry_after`, and a jitter on top.
 *
 * @param {unknown} retryAfter the error frame's `retry_after`, in seconds
 * @param {{random?: () => number}} [options] `random` returns a float in [0, 1)
 * @returns {number} milliseconds
 */
export function resumeRetryDelay(retryAfter, { random = Math.random } = {}) {
  const seconds = Number(retryAfter);
  const wait = Number.isFinite(seconds) && seconds > 0 ? seconds : RESUME_RETRY_DEFAULT_S;
  return Math.round(wait * 1000 + random() * RESUME_RETRY_JITTER_MS);
}
