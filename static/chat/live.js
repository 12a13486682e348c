// One streaming answer on the page, shown as it will look: the server's rendered blocks
// (`block` frames: sanitised HTML, placed once, never touched again) followed by the open tail,
// previewed line by line with elements built from textContent (never innerHTML). Work per
// chunk is proportional to the chunk: complete tail lines are added once; only the line being
// written is redrawn. Offsets are in code points, as the server counts them.
import { enhance } from "./copy.js";
import { TailReader, dropCodePoints, inlineSpans, texPreview } from "./tail.js";

export class LiveView {
  /** @param {HTMLElement} body the answer's `.body` */
  constructor(body) {
    this.body = body;
    body.classList.add("is-live"); // chat.css: each block laid out on its own
    this.placed = 0; // blocks placed, in index order
    this.chars = 0; // characters of HTML placed (pace.js)
    this.waiting = new Map(); // index -> a block frame that came before an earlier one
    this.end = 0; // code points of the answer that the placed blocks cover
    this.skip = 0; // code points still to arrive that placed blocks already cover
    this.lines = ""; // the tail's complete lines (what a new block may cover)
    this.line = ""; // the line being written
    this.resetTail();
    // An answer going on (Continue) comes with the blocks of its earlier text placed and the
    // text of its open block, which the continuation extends: the same paragraph goes on
    // (docs/protocol.md, Continue). Read once, then dropped, so the body ends as a reload's.
    const { open, placed, end } = body.dataset;
    if (open !== undefined) {
      this.placed = Number(placed) || 0;
      this.end = Number(end) || 0;
      for (const name of ["open", "placed", "end"]) delete body.dataset[name];
      this.addText(JSON.parse(open));
    }
  }

  /** The answer's next text, in order. */
  addText(text) {
    if (this.skip) {
      const { rest, missing } = dropCodePoints(text, this.skip);
      this.skip = missing;
      text = rest;
    }
    if (!text) return;
    this.dropPartial();
    const parts = (this.line + text).split("\n");
    this.line = parts.pop();
    for (const line of parts) {
      this.lines += `${line}\n`;
      this.drawLine(line.replace(/\r$/, ""), true);
    }
    if (this.line) {
      // What the line being written changes is undone before it is drawn again.
      this.saved = {
        group: this.group,
        groupKind: this.groupKind,
        code: this.code,
        lists: this.lists,
      };
      this.drawLine(this.line, false);
    }
  }

  /**
   * `block` frames: each is placed when every block before it is, replacing the tail's text it
   * covers, until `deadline` (a `performance.now()` time) or `chars` characters of HTML
   * placed, whichever comes first (at least one block is placed). The
   * tail is drawn again once, after the last block placed, not after each: a batch of blocks
   * (a page that fell behind) costs the blocks plus one tail, not blocks × tail.
   * @returns {boolean} whether blocks ready to place are left (for the next animation frame)
   */
  addBlocks(frames, deadline = Infinity, chars = Infinity) {
    for (const frame of frames) {
      if (frame.index >= this.placed) this.waiting.set(frame.index, frame); // a resume resends
    }
    let end = -1;
    const from = this.chars;
    for (let next; (next = this.waiting.get(this.placed)); ) {
      if (end >= 0 && (this.chars - from >= chars || performance.now() > deadline)) break;
      this.waiting.delete(this.placed);
      this.place(next);
      end = next.end;
    }
    if (end >= 0) this.coverTo(end);
    return this.waiting.has(this.placed);
  }

  /** The final HTML is exactly the placed blocks: keep them, drop the preview. */
  close() {
    this.tail?.remove();
    this.tail = null;
  }

  place(frame) {
    const block = document.createElement("template");
    block.innerHTML = frame.html; // sanitised by the server's one sanitiser
    enhance(block.content); // copy buttons for its code blocks: O(the block), not the answer
    if (this.tail) this.tail.before(block.content);
    else this.body.append(block.content);
    this.placed += 1;
    this.chars += frame.html.length;
  }

  /** The placed blocks now cover the answer up to `end`: the tail's text after it is drawn anew. */
  coverTo(end) {
    const { rest, missing } = dropCodePoints(this.lines + this.line, end - this.end);
    this.end = end;
    this.skip += missing;
    this.tail?.remove();
    this.resetTail();
    this.lines = "";
    this.line = "";
    this.addText(rest);
  }

  resetTail() {
    this.tail = null;
    this.reader = new TailReader();
    this.group = null; // the element the next line of the same kind goes into
    this.groupKind = "";
    this.lists = []; // the open list at each depth, outermost (this.group) first
    this.code = null; // the <code> of an open fence
    this.partial = []; // the nodes of the line being written
    this.saved = null; // the group before the line being written was drawn
  }

  ensureTail() {
    if (!this.tail) {
      this.tail = document.createElement("div");
      this.tail.className = "live-tail";
      this.body.append(this.tail);
    }
    return this.tail;
  }

  dropPartial() {
    for (const node of this.partial) node.remove();
    this.partial = [];
    if (this.saved) Object.assign(this, this.saved);
    this.saved = null;
  }

  endGroup() {
    this.group = null;
    this.groupKind = "";
    this.lists = [];
  }

  /** Add one line to the preview; a line being written (`complete` false) is redrawn later. */
  drawLine(line, complete) {
    const info = this.reader.read(line, complete);
    const tail = this.ensureTail();
    const made = (node) => {
      if (!complete) this.partial.push(node);
      return node;
    };
    switch (info.kind) {
      case "fence": {
        this.endGroup();
        const block = el("div", "codeblock");
        const bar = el("div", "codeblock-bar");
        if (info.lang) bar.append(el("span", "codeblock-lang", info.lang));
        const pre = el("pre", "code");
        this.code = document.createElement("code");
        pre.append(this.code);
        block.append(bar, pre);
        tail.append(made(block));
        if (complete) {
          this.group = block;
          this.groupKind = "code";
        }
        break;
      }
      case "code":
        this.code?.append(made(document.createTextNode(`${info.text}\n`)));
        break;
      case "fence-close":
        if (complete) {
          this.code = null;
          this.endGroup();
        }
        break;
      case "blank":
        if (complete && this.groupKind !== "code") this.endGroup();
        break;
      case "math": {
        // A display formula's lines, as plain text until its block's MathML comes.
        const shown = this.groupFor("math", made, () => el("div", "math-preview"));
        if (info.text.trim()) {
          if (shown.childNodes.length) shown.append(made(document.createTextNode(" ")));
          const pieces = texInto(document.createDocumentFragment(), info.text);
          for (const node of [...pieces.childNodes]) shown.append(made(node));
        }
        break;
      }
      case "rule":
        this.endGroup();
        tail.append(made(document.createElement("hr")));
        break;
      case "heading": {
        this.endGroup();
        tail.append(made(spansInto(document.createElement(`h${info.level}`), info.text)));
        break;
      }
      case "bullet":
      case "ordered": {
        // A nested item goes in a list inside the last item one level up, as the server's
        // render will put it: drawn at the top level it moved right when the list's block came.
        const kind = info.kind === "bullet" ? "ul" : "ol";
        const depth = info.depth ?? 0;
        const parent = depth ? this.lists[depth - 1]?.lastElementChild : null;
        let list;
        if (parent) {
          const same = this.lists[depth];
          list = same?.parentElement === parent && same.localName === kind ? same : null;
          if (!list) parent.append(made((list = document.createElement(kind))));
        } else {
          list = this.groupFor(kind, made, () => document.createElement(kind));
        }
        this.lists = [...this.lists.slice(0, parent ? depth : 0), list];
        list.append(made(spansInto(document.createElement("li"), info.text)));
        break;
      }
      case "quote": {
        const quote = this.groupFor("quote", made, () => el("blockquote", ""));
        quote.append(made(spansInto(document.createElement("p"), info.text)));
        break;
      }
      default: {
        // Paragraph text; after a list item or a quote it continues that item (lazily).
        const inList = this.groupKind === "ul" || this.groupKind === "ol";
        const host = inList
          ? (this.lists.at(-1) ?? this.group).lastElementChild
          : this.groupKind === "quote"
            ? this.group.lastElementChild
            : this.groupFor("p", made, () => document.createElement("p"));
        if (!host) break;
        if (host.childNodes.length) host.append(made(document.createTextNode(" ")));
        const spans = spansInto(document.createDocumentFragment(), info.text);
        for (const node of [...spans.childNodes]) host.append(made(node));
      }
    }
  }

  /** The open group of this kind, or a new one (for the line being written: redrawn later). */
  groupFor(kind, made, create) {
    if (this.groupKind === kind && this.group?.isConnected) return this.group;
    const group = create();
    this.tail.append(made(group));
    this.group = group;
    this.groupKind = kind;
    this.lists = [];
    return group;
  }
}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text) node.textContent = text;
  return node;
}

/** The spans of `text` (bold, italic, code, math) appended to `parent`, as text nodes only. */
function spansInto(parent, text) {
  for (const span of inlineSpans(text)) {
    if (span.math) {
      parent.append(texInto(el("span", "math-preview"), span.text));
      continue;
    }
    let node = document.createTextNode(span.text);
    if (span.code) node = wrap("code", node);
    if (span.em) node = wrap("em", node);
    if (span.strong) node = wrap("strong", node);
    parent.append(node);
  }
  return parent;
}

/** A formula's preview (tail.js texPreview) appended to `parent`: text, <sup> and <sub>. */
function texInto(parent, tex) {
  for (const piece of texPreview(tex)) {
    const text = document.createTextNode(piece.text);
    parent.append(piece.sup ? wrap("sup", text) : piece.sub ? wrap("sub", text) : text);
  }
  return parent;
}

function wrap(tag, child) {
  const node = document.createElement(tag);
  node.append(child);
  return node;
}
