// Copy buttons: the answer's markdown source, and each code block's code (the buttons on code
// blocks are added here, as the server's sanitiser lets no button through).
import { announce } from "./alerts.js";

const FLASH_MS = 1500;

/** The answer's markdown source, as the model wrote it (not the rendered HTML's text). */
export function copyAnswer(button) {
  const source = button.closest("article").querySelector("template.source");
  copyText(source ? source.content.textContent : "", button, "Answer");
}

export function copyCode(button) {
  const code = button.closest(".codeblock").querySelector("code");
  copyText(code ? code.textContent : "", button, "Code");
}

/** A shared conversation's link (templates/chat/partials/share_result.html). */
export function copyLink(button) {
  copyText(button.dataset.link || "", button, "Link");
}

/**
 * Give every code block under `root` that has none yet its "Copy code" button. Called for the
 * page as loaded and after each swap; a block rendered while streaming would be enhanced the
 * same way.
 * @param {ParentNode} root
 */
export function enhance(root) {
  for (const block of root.querySelectorAll(".codeblock:not([data-enhanced])")) {
    block.dataset.enhanced = "1";
    const button = document.createElement("button");
    button.type = "button";
    button.className = "copy-code";
    button.dataset.action = "copy-code";
    const lang = block.dataset.lang;
    // The accessible name starts with the visible text (WCAG 2.5.3), then says which code.
    if (lang) button.setAttribute("aria-label", `Copy code: ${lang}`);
    button.textContent = "Copy code";
    block.prepend(button);
  }
}

async function copyText(text, button, what) {
  try {
    await navigator.clipboard.writeText(text);
    flash(button, "Copied");
    announce(`${what} copied to the clipboard.`);
  } catch {
    flash(button, "Copy failed");
    announce(`Could not copy the ${what.toLowerCase()}: the browser did not allow it.`);
  }
}

function flash(button, label) {
  if (!button.dataset.label) button.dataset.label = button.textContent;
  button.textContent = label;
  clearTimeout(Number(button.dataset.flashTimer));
  button.dataset.flashTimer = String(
    setTimeout(() => {
      button.textContent = button.dataset.label;
    }, FLASH_MS),
  );
}
