// The conversation list and the open conversation: which one is current (highlighted, first
// after a new answer, its title in the header and the tab), and the drawer it lives in on
// narrow screens.
import { groupLabel } from "./dategroups.js";
import { messages } from "./thread.js";

const main = document.getElementById("main");

export function start() {
  groupByDate();
  document.body.addEventListener("htmx:afterSettle", (event) => {
    // A rename or a search result replaced part of the list: keep the open one marked, and
    // the page's title in step with a renamed conversation.
    if (event.target.closest?.("#conversation-list")) markCurrent();
  });
  // A conversation's "⋯" menu and the header's ⚙ (the conversation's settings) are <details>
  // menus: one open at a time, closed by a click or tap anywhere else (Escape closes them
  // too: stream.js, keys.escapeAction).
  document.addEventListener(
    "toggle",
    (event) => {
      const menu = event.target;
      if (!menu.matches?.(MENUS) || !menu.open) return;
      for (const other of openMenus()) if (other !== menu) other.open = false;
      if (menu.matches("details.conv-menu")) showWholeMenu(menu);
    },
    true, // toggle does not bubble
  );
  // The share result (the link, Copy link, Stop sharing) makes an open menu taller: shown
  // down to its end, but never past its row's top (scrolled from the result, the row went out
  // of view and people lost which conversation they had shared). On a phone the menu with the
  // result is taller than the list's visible part: the row and the result stay, Delete is a
  // scroll away.
  document.body.addEventListener("htmx:afterSettle", (event) => {
    const menu = event.target.closest?.("details.conv-menu[open]");
    if (menu) showWholeMenu(menu);
  });
  document.addEventListener("click", (event) => {
    for (const menu of openMenus()) if (!menu.contains(event.target)) menu.open = false;
  });
  // The open conversation was deleted (chat/views.py `delete`): a new chat replaces this
  // history entry, so Back and a reload do not land on the deleted conversation's 404.
  document.body.addEventListener("open-conversation-deleted", () => location.replace("/"));
  // Deletions asked for here: the server tells every tab of a deletion (`conversation_deleted`),
  // this one included, which has its own response to act on.
  document.body.addEventListener("htmx:beforeRequest", (event) => {
    const id = deletedBy(event.detail.elt);
    if (id) deletingHere.add(id);
  });
  document.body.addEventListener("htmx:afterRequest", (event) => {
    const id = deletedBy(event.detail.elt);
    if (id && !event.detail.successful) deletingHere.delete(id); // still there
  });
}

const deletingHere = new Set();

/** The conversation a delete form deletes, or "" for any other element. */
function deletedBy(element) {
  if (!element?.matches?.("form.delete")) return "";
  return element.closest("li.conv")?.id.replace(/^conv-/, "") ?? "";
}

/** Whether this page asked for the deletion of conversation `id`. @param {string} id */
export function deletedHere(id) {
  return deletingHere.has(id);
}

/**
 * A conversation's title as the list shows it, without the 📌 of a pinned one (a 📌 in the
 * title itself stays); "" if the list does not show it. @param {string} id
 */
export function titleOf(id) {
  const link = document.getElementById(`conv-${id}`)?.querySelector("a");
  if (!link) return "";
  const parts = [...link.childNodes].filter((node) => !node.classList?.contains("pinned"));
  return parts.map((node) => node.textContent).join("").trim();
}

/** Take conversation `id` out of the list (deleted elsewhere). @param {string} id */
export function dropConversation(id) {
  const item = document.getElementById(`conv-${id}`);
  if (!item) return;
  const hadFocus = item.contains(document.activeElement);
  item.remove();
  if (hadFocus) document.getElementById("new-chat")?.focus();
}

/**
 * Scroll the conversation list (only it) so that an open "⋯" menu is in view from its row to
 * its end: near the list's end it would run below the list's visible edge. Where that is
 * taller than the view, the row's top wins.
 * @param {HTMLDetailsElement} menu
 */
function showWholeMenu(menu) {
  const from = menu.closest("li.conv");
  const list = menu.closest("#conversation-list");
  if (!list || !from) return;
  const view = list.getBoundingClientRect();
  const top = from.getBoundingClientRect().top;
  const bottom = menu.getBoundingClientRect().bottom;
  if (bottom > view.bottom) list.scrollTop += Math.min(bottom - view.bottom, top - view.top);
  else if (top < view.top) list.scrollTop -= view.top - top;
}

/**
 * Date headings in the list (Pinned, Today, Yesterday, …, months), in this browser's time
 * zone. Kept by watching the list: whatever changed it (a page of older conversations, a new
 * conversation from any tab, a search, a pin, a move to the top), the headings are laid again
 * from the items' order and dates, so each appears once, above its first conversation.
 */
function groupByDate() {
  const list = document.getElementById("conversation-list");
  if (!list) return;
  const observer = new MutationObserver(() => {
    observer.disconnect();
    layHeadings(list);
    observer.takeRecords();
    observer.observe(list, { childList: true });
  });
  layHeadings(list);
  observer.observe(list, { childList: true });
}

function layHeadings(list) {
  for (const heading of list.querySelectorAll(":scope > li.conv-group")) heading.remove();
  const now = new Date();
  let last = null;
  for (const item of list.querySelectorAll(":scope > li.conv")) {
    const label = groupLabel(new Date(item.dataset.updated), now, isPinned(item));
    if (label === last) continue;
    last = label;
    const heading = document.createElement("li");
    heading.className = "conv-group";
    const title = document.createElement("h2");
    title.textContent = label;
    heading.append(title);
    item.before(heading);
  }
}

const MENU_KINDS = ["details.conv-menu", "details.conversation-menu-settings"];
const MENUS = MENU_KINDS.join(", ");
const OPEN_MENUS = MENU_KINDS.map((kind) => `${kind}[open]`).join(", ");

function openMenus() {
  return document.querySelectorAll(OPEN_MENUS);
}

export function isMenuOpen() {
  return openMenus().length > 0;
}

/** Close the open "⋯" or ⚙ menu; focus goes back to its button if it was inside (on a phone
 * ⚙ is not in the header: then to the header's ⋯, which opened it). */
export function closeMenu() {
  for (const menu of openMenus()) {
    const hadFocus = menu.contains(document.activeElement);
    menu.open = false;
    if (!hadFocus) continue;
    const summary = menu.querySelector("summary");
    if (summary?.checkVisibility()) summary.focus();
    else document.querySelector("#share-menu > summary")?.focus();
  }
}

/**
 * The header ⋯ menu's "System prompt for this chat" (on a phone, where ⚙ is not in the header):
 * opens ⚙'s menu. After this click has run its course: every other menu closes on a click
 * outside it, and this one is outside ⚙'s.
 */
export function openSystemPrompt() {
  const settings = document.getElementById("conversation-settings-menu");
  if (!settings || settings.hidden) return;
  setTimeout(() => {
    settings.open = true;
    // A keyboard's user goes on typing; a phone's keyboard comes up only when asked for.
    if (!matchMedia("(pointer: coarse)").matches) document.getElementById("system-prompt")?.focus();
  });
}

/** The id of the conversation this page shows ("" before the first prompt of a new chat). */
function currentConversation() {
  return messages.dataset.conversation || "";
}

/**
 * After an HTML frame: if the first prompt created a conversation (`conv`, the id the server
 * gave the composer), this page becomes its page. The list's "No conversations yet" goes once
 * it holds one.
 * @param {string} conv
 */
export function adoptConversation(conv) {
  if (conv && messages.dataset.conversation !== conv) {
    messages.dataset.conversation = conv;
    main.dataset.conversation = conv;
    history.replaceState(null, "", `/c/${conv}/`);
  }
  // (Another tab's new conversation adds to the list, not to this page's messages.)
  if (document.querySelector("#conversation-list > li.conv")) {
    document.querySelector("#conversation-list > li.empty")?.remove();
  }
  keepPinnedFirst();
}

/**
 * Pinned conversations stay above the others. Another tab's new conversation arrives first in
 * the list (the server cannot know this tab's list): it moves to just below the pinned ones.
 */
function keepPinnedFirst() {
  const list = document.getElementById("conversation-list");
  if (!list) return;
  const items = [...list.querySelectorAll(":scope > li.conv")];
  const lastPinned = items.findLast(isPinned);
  if (!lastPinned) return;
  const above = items.slice(0, items.indexOf(lastPinned)).filter((item) => !isPinned(item));
  lastPinned.after(...above); // in their order: newest first
}

function isPinned(item) {
  return Boolean(item.querySelector(".pinned"));
}

/**
 * Highlight the open conversation in the list; with `moveToTop` (it was just written to) it
 * goes first after the pinned ones, as the list is newest first. Its title shows in the header
 * and the tab.
 */
export function markCurrent({ moveToTop = false } = {}) {
  const conv = currentConversation();
  const list = document.getElementById("conversation-list");
  if (!list) return;
  for (const item of list.querySelectorAll("li.conv")) {
    const current = item.id === `conv-${conv}`;
    item.classList.toggle("current", current);
    const link = item.querySelector("a");
    if (current) link?.setAttribute("aria-current", "page");
    else link?.removeAttribute("aria-current");
    for (const input of item.querySelectorAll('input[name="current"]')) input.value = conv;
  }
  const item = conv && document.getElementById(`conv-${conv}`);
  if (!item) return;
  if (moveToTop) {
    item.dataset.updated = new Date().toISOString(); // written to now: under Today
    // Pinned conversations stay above the others: an unpinned one goes first below them.
    const before = isPinned(item)
      ? list.firstElementChild
      : [...list.children].find((li) => li !== item && li.matches("li.conv") && !isPinned(li));
    if (before && before !== item) list.insertBefore(item, before);
  }
  const title = titleOf(conv);
  if (title) showTitle(title);
}

export function isDrawerOpen() {
  return document.body.classList.contains("drawer-open");
}

/** Open or close the conversation list's drawer (narrow screens). @param {boolean} open */
export function setDrawer(open) {
  const opener = document.querySelector(".open-drawer");
  document.body.classList.toggle("drawer-open", open);
  opener?.setAttribute("aria-expanded", String(open));
  document.getElementById("scrim").hidden = !open;
  // While the drawer is open the page behind it is out of reach (focus, taps, screen readers).
  main.inert = open;
  if (open) document.querySelector("#sidebar .close-drawer")?.focus();
  else if (opener && opener.offsetParent !== null) opener.focus();
}

function showTitle(title) {
  document.querySelector(".chat-head .title").textContent = title;
  document.title = `${title} · chatsite`;
}
