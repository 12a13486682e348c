// Browser benchmark instrumentation, injected with Playwright's add_init_script before any page
// script runs. It never ships with the product: it wraps WebSocket message listeners to note
// when each `chunk` frame arrives, and uses the real requestAnimationFrame to note when the next
// frame after it was painted; it also records long tasks and JS heap samples.
(() => {
  const nativeRaf = window.requestAnimationFrame.bind(window);
  const bench = {
    t0: 0,
    chunkFrames: 0,
    chunkToPaint: [], // ms from a chunk frame's arrival to the end of the next painted frame
    htmlFrames: [], // [arrival, length] of each HTML frame (the answer's final HTML is the longest)
    longTasks: [], // [startTime, duration]
    heap: [], // usedJSHeapSize samples (bytes)
    appRafCallbacks: 0,
    appRafMs: 0, // time spent inside the page's own animation-frame callbacks
    reset() {
      this.t0 = performance.now();
      this.chunkFrames = 0;
      this.chunkToPaint = [];
      this.htmlFrames = [];
      this.longTasks = [];
      this.heap = [];
      this.appRafCallbacks = 0;
      this.appRafMs = 0;
    },
  };
  window.__bench = bench;

  let waiting = []; // arrival times of chunks not painted yet
  let paintQueued = false;
  const channel = new MessageChannel();
  // A message posted from inside an animation-frame callback is handled after that frame's
  // style, layout and paint: the moment the chunk's text is on screen (or as near as a page
  // can observe it).
  channel.port1.onmessage = () => {
    const now = performance.now();
    for (const arrived of waiting) bench.chunkToPaint.push(now - arrived);
    waiting = [];
    paintQueued = false;
  };

  function noteChunk() {
    bench.chunkFrames += 1;
    waiting.push(performance.now());
    if (!paintQueued) {
      paintQueued = true;
      nativeRaf(() => channel.port2.postMessage(0));
    }
  }

  function isChunk(data) {
    return typeof data === "string" && data.charCodeAt(0) === 123 && data.slice(0, 24).includes('"chunk"');
  }

  function wrap(listener) {
    if (typeof listener !== "function") return listener;
    return function (event) {
      if (isChunk(event.data)) noteChunk();
      else if (typeof event.data === "string" && event.data.charCodeAt(0) !== 123) {
        bench.htmlFrames.push([performance.now(), event.data.length]);
      }
      return listener.call(this, event);
    };
  }

  const wrapped = new WeakMap();
  const nativeAdd = WebSocket.prototype.addEventListener;
  const nativeRemove = WebSocket.prototype.removeEventListener;
  WebSocket.prototype.addEventListener = function (type, listener, options) {
    if (type !== "message" || typeof listener !== "function") {
      return nativeAdd.call(this, type, listener, options);
    }
    let w = wrapped.get(listener);
    if (!w) {
      w = wrap(listener);
      wrapped.set(listener, w);
    }
    return nativeAdd.call(this, type, w, options);
  };
  WebSocket.prototype.removeEventListener = function (type, listener, options) {
    return nativeRemove.call(this, type, wrapped.get(listener) || listener, options);
  };
  const onmessage = Object.getOwnPropertyDescriptor(WebSocket.prototype, "onmessage");
  Object.defineProperty(WebSocket.prototype, "onmessage", {
    configurable: true,
    get() {
      return onmessage.get.call(this);
    },
    set(listener) {
      onmessage.set.call(this, wrap(listener));
    },
  });

  // The page's own animation-frame work: how often it paints and what that costs.
  window.requestAnimationFrame = (callback) =>
    nativeRaf((ts) => {
      const start = performance.now();
      try {
        callback(ts);
      } finally {
        bench.appRafCallbacks += 1;
        bench.appRafMs += performance.now() - start;
      }
    });

  try {
    new PerformanceObserver((list) => {
      for (const entry of list.getEntries()) bench.longTasks.push([entry.startTime, entry.duration]);
    }).observe({ type: "longtask", buffered: true });
  } catch {
    bench.longTasks = null; // not supported: reported as such
  }

  setInterval(() => {
    if (performance.memory) bench.heap.push(performance.memory.usedJSHeapSize);
  }, 100);
})();
