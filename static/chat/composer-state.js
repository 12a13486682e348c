// What the composer shows for the state of the page: which controls work and what its status
// line says. Pure (no DOM): composer.js puts the result on the page; tests/js checks it.

/**
 * @param {{streaming: boolean, connected: boolean, offline: boolean, awaiting: boolean,
 *   connecting?: boolean, touch?: boolean, stopKept?: boolean}} page
 *   `streaming`: an answer streams in this conversation (asked here, in another tab, or before
 *   a reload); `connected`: the socket is open and said `ready`; `offline`: the browser says
 *   it has no network; `awaiting`: this tab asked for a turn that is neither accepted nor
 *   refused yet; `connecting`: a first connection (as the page opens, or a fresh socket after the
 *   tier choice) rather than one lost; `touch`: a touch screen, where Return makes a new line
 *   and the Send button sends; `stopKept`: Stop was pressed while the socket was down, and
 *   goes out once it is back.
 * @returns {{sendDisabled: boolean, stopHidden: boolean, status: string}} The prompt box itself
 *   is never locked: typing the next question while reading the answer loses nothing. Sending
 *   is what waits (`canStartTurn`): a second turn now would be refused by the limits, or
 *   answered without the first answer.
 */
export function composerState({
  streaming,
  connected,
  offline,
  awaiting,
  connecting = false,
  touch = false,
  stopKept = false,
}) {
  let status = "";
  if (streaming && !connected && stopKept) {
    status = offline
      ? "Offline. This answer will stop when reconnected."
      : "Reconnecting… This answer will stop when reconnected.";
  } else if (streaming && !connected) {
    status = offline
      ? "Offline. The answer shows when you are back."
      : "Reconnecting… The answer goes on at the server.";
  } else if (streaming) {
    // The box stays open while an answer streams: the status line says what Enter (or Send)
    // does meanwhile, since it will not send until the answer ends. One short line: the
    // composer must not grow when an answer starts (chat.css keeps it to one line).
    status = touch
      ? "Answering… Send works once this answer ends."
      : "Answering… Enter works when it ends · Esc stops";
  } else if (awaiting) status = "Sending…";
  else if (offline) {
    status = "You are offline. Your message is kept; send it when you are back online.";
  } else if (!connected && connecting) status = "Connecting…";
  else if (!connected) status = "Connection lost, reconnecting… Your message is kept.";
  return {
    sendDisabled: streaming || awaiting || !connected,
    stopHidden: !streaming,
    status,
  };
}

/**
 * Whether the page may start a turn now (send, edit, retry or regenerate): not while an answer
 * streams, nor while the last request is still on its way.
 * @param {{streaming: boolean, awaiting: boolean}} page
 */
export function canStartTurn({ streaming, awaiting }) {
  return !streaming && !awaiting;
}
