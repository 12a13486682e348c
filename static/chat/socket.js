// The tab's one chat socket: connect, reconnect with backoff, online / offline / visibility,
// `send`, and telling JSON frames from HTML frames. It knows nothing of answers or the
// composer: stream.js hands it the handlers that do.
import { nextReconnect } from "./backoff.js";
import { readFrame } from "./frames.js";
import { connectionLabel } from "./labels.js";

const CLOSE_LOGGED_OUT = 4401; // the server's close code for a socket without a session

const connectionEl = document.getElementById("connection");

let socket = null;
let ready = false; // the server said `ready`: frames may be sent
let attempts = 0; // reconnect attempts that failed in a row
// What an `error` before `ready` said to wait (a refused handshake: CHAT_SOCKET_RATE or a cap
// on sockets), in seconds: the reconnect after its close waits at least that long.
let refusedFor = 0;
let reconnectTimer = 0;
let connection = connectionEl.dataset.state;
// This tab is logging out (its Log out was pressed): the server closes the socket as the
// session ends, before the logout's own page arrives; going to the login page then would
// cancel that page, and the word it brings that the logout worked.
let leaving = false;
// Frames that mean the same however late they arrive (a stop), asked for while the socket was
// down: sent on the next socket as soon as it is ready, before the page hears `ready` (and so
// before it resumes the answers). Keyed, so pressing Stop twice keeps one.
const kept = new Map();

/**
 * @typedef {object} SocketHandlers
 * @property {(frame: object) => void} json a JSON frame (`ready` once the socket noted it)
 * @property {(html: string) => void} html an HTML frame, for htmx to swap
 * @property {() => void} lost the socket is gone: nobody knows whether what was last sent arrived
 * @property {(state: string) => void} connection the connection's state changed
 * @property {() => string} conversation the conversation the page shows ("" for a new chat):
 *   the socket URL names it, so other tabs' turns elsewhere send this tab only what its
 *   conversation list needs
 */
/** @type {SocketHandlers} */
let on = { json() {}, html() {}, lost() {}, connection() {}, conversation: () => "" };

/** Start listening to the network and connect. @param {SocketHandlers} handlers */
export function start(handlers) {
  on = handlers;
  window.addEventListener("online", reconnectNow);
  window.addEventListener("offline", () => {
    dropSocket();
    setConnection("offline");
  });
  document.addEventListener("visibilitychange", () => {
    // iOS Safari kills background sockets: coming back is the moment to reconnect and resume.
    if (document.visibilityState === "visible") reconnectNow();
  });
  connect();
}

/** The user logs out in this tab: the logout's response, not the socket, leads on. */
export function leave() {
  leaving = true;
}

/**
 * Send a frame if the socket is open and ready; false (and nothing sent) otherwise. Nothing is
 * queued while offline: a queued prompt sent after a reconnect could be a duplicate question.
 * @param {object} frame
 * @returns {boolean}
 */
export function send(frame) {
  if (!socket || socket.readyState !== WebSocket.OPEN || !ready) return false;
  socket.send(JSON.stringify(frame));
  return true;
}

/**
 * Connect again now, on a fresh socket: what the handshake says changed (the tier choice's
 * cookie). Streaming answers resume on the new socket as after any reconnect.
 */
export function renew() {
  const ws = socket;
  if (ws) {
    lostSocket();
    try {
      ws.close(1000, "renew");
    } catch {
      // already closing
    }
  }
  attempts = 0;
  connect();
}

/**
 * Send a frame that may arrive late without harm (a stop): now if the socket is ready, else
 * kept and sent right after the next `ready`. Only such frames: a prompt sent late could ask
 * the same question twice (the page keeps its text instead).
 * @param {{type: string, mid: string}} frame
 * @returns {boolean} whether it went now
 */
export function sendOrKeep(frame) {
  if (send(frame)) return true;
  kept.set(`${frame.type} ${frame.mid}`, frame);
  return false;
}

/** Whether a stop waits for the socket to come back (the page says so). */
export function stopKept() {
  for (const frame of kept.values()) if (frame.type === "stop") return true;
  return false;
}

/** Whether frames can be sent now. */
export function isReady() {
  return ready;
}

/** connecting, connected, reconnecting, offline or logged-out. */
export function connectionState() {
  return connection;
}

function socketUrl() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const conversation = on.conversation();
  const query = conversation ? `?conversation=${encodeURIComponent(conversation)}` : "";
  return `${scheme}://${location.host}/ws/chat/${query}`;
}

function connect() {
  clearTimeout(reconnectTimer);
  if (socket) return;
  setConnection(attempts ? "reconnecting" : "connecting");
  const ws = new WebSocket(socketUrl());
  socket = ws;
  ws.addEventListener("message", (event) => {
    // Frames still arriving on a socket we gave up on are ignored: `resume` on the new one
    // sends everything after what we show, so nothing is lost and nothing doubles.
    if (socket === ws) onMessage(event.data);
  });
  ws.addEventListener("close", (event) => {
    if (socket !== ws) return;
    lostSocket();
    if (event.code === CLOSE_LOGGED_OUT) {
      setConnection("logged-out");
      if (leaving) return;
      location.assign(`/accounts/login/?next=${encodeURIComponent(location.pathname)}`);
      return;
    }
    scheduleReconnect();
  });
}

function onMessage(data) {
  const frame = readFrame(data);
  if (!frame) return;
  if (frame.html !== undefined) {
    on.html(frame.html);
    return;
  }
  if (!ready && frame.json.type === "error") refusedFor = Number(frame.json.retry_after) || 0;
  if (frame.json.type === "ready") {
    ready = true;
    attempts = 0;
    refusedFor = 0;
    for (const keptFrame of kept.values()) socket.send(JSON.stringify(keptFrame));
    kept.clear();
    setConnection("connected");
  }
  on.json(frame.json);
}

function lostSocket() {
  socket = null;
  ready = false;
  on.lost();
}

function scheduleReconnect() {
  clearTimeout(reconnectTimer);
  const next = nextReconnect(attempts, {
    offline: navigator.onLine === false,
    retryAfter: refusedFor,
  });
  refusedFor = 0;
  attempts += 1;
  setConnection(next.connection);
  reconnectTimer = setTimeout(connect, next.delay);
}

function reconnectNow() {
  const ws = socket;
  if (ws && (ws.readyState === WebSocket.OPEN || ws.readyState === WebSocket.CONNECTING)) return;
  if (ws) lostSocket();
  connect();
}

function dropSocket() {
  // When the network goes away the old TCP connection often dies silently (no close event for
  // minutes, e.g. a phone moving from Wi-Fi to mobile data): give it up now and resume on a
  // fresh socket as soon as the browser is back online.
  const ws = socket;
  if (!ws) return;
  lostSocket();
  try {
    ws.close(1000, "offline");
  } catch {
    // already closing
  }
  scheduleReconnect();
}

function setConnection(state) {
  connection = state;
  connectionEl.dataset.state = state;
  connectionEl.textContent = connectionLabel(state);
  connectionEl.title = connectionEl.textContent;
  on.connection(state);
}
