// theme.js — light / dark theme: follows the system unless the user picked one (remembered).
const KEY = "chatsite-theme";
const root = document.documentElement;
const saved = localStorage.getItem(KEY);
if (saved === "light" || saved === "dark") root.dataset.theme = saved;

document.addEventListener("click", (event) => {
  if (!event.target.closest('[data-action="toggle-theme"]')) return;
  const dark = root.dataset.theme
    ? root.dataset.theme === "dark"
    : matchMedia("(prefers-color-scheme: dark)").matches;
  root.dataset.theme = dark ? "light" : "dark";
  localStorage.setItem(KEY, root.dataset.theme);
});
