// theme.js — light / dark theme: follows the system unless the user picked one (remembered).
//
// A classic script loaded in <head> (not a deferred module) so the saved theme is set before
// the first paint: no flash of the wrong theme on a reload.
(() => {
  const KEY = "chatsite-theme";
  const root = document.documentElement;
  const system = matchMedia("(prefers-color-scheme: dark)");
  let saved = null;
  try {
    saved = localStorage.getItem(KEY);
  } catch {
    // storage may be blocked (private mode, policies): then the system decides
  }
  if (saved === "light" || saved === "dark") root.dataset.theme = saved;

  const isDark = () => (root.dataset.theme ? root.dataset.theme === "dark" : system.matches);

  function reflect() {
    // The toggle says what it does ("Dark theme", pressed or not), for sight and for AT.
    for (const button of document.querySelectorAll('[data-action="toggle-theme"]')) {
      button.setAttribute("aria-pressed", String(isDark()));
    }
  }

  document.addEventListener("click", (event) => {
    if (!event.target.closest('[data-action="toggle-theme"]')) return;
    root.dataset.theme = isDark() ? "light" : "dark";
    try {
      localStorage.setItem(KEY, root.dataset.theme);
    } catch {
      // not remembered, but switched for this page
    }
    reflect();
  });
  system.addEventListener("change", reflect);
  document.addEventListener("DOMContentLoaded", reflect);
})();
