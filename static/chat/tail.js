// The open tail of a streaming answer — the text after its last rendered block — read line by
// line for a live preview: what each line is (heading, list item, quote, rule, code fence, a
// line of code, paragraph text, blank) and the bold, italic and inline-code spans of its text.
// Pure (no DOM): live.js builds the elements, with textContent only. The server's block, when
// it comes, replaces the preview; this only keeps raw markup off the screen meanwhile.

const FENCE_RE = /^ {0,3}(`{3,}|~{3,})[ \t]*([^\s`]*)/;
const HEADING_RE = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/;
// A list item at any indent: where it nests depends on the items open above it.
const ITEM_RE = /^( *)([-+*]|\d{1,9}[.)])([ \t]+)(.*)$/;
const QUOTE_RE = /^ {0,3}>[ \t]?(.*)$/;
const RULE_RE = /^ {0,3}(?:(?:\*[ \t]*){3,}|(?:-[ \t]*){3,}|(?:_[ \t]*){3,})$/;
const MATH_OPEN_RE = /^ {0,3}(\$\$|\\\[)[ \t]*$/;
const LABEL_RE = /[^\w+#.-]/g; // the server's code label keeps these characters (code.py)

/** Reads the tail's lines in order; it remembers whether a code fence is open. */
export class TailReader {
  constructor() {
    this.fence = null; // {marker, length, lang} while a fence is open
    this.mathCloser = ""; // "$$" or "\\]" while a display formula's lines are open
    // The list items open above the line, outermost first: the column their text starts at.
    // An item indented to an open item's text nests inside it, as markdown-it nests it
    // ("- a" then "  - b": b is a's sub-item, however it looked while streaming).
    this.items = [];
    this.blank = false; // the last complete line was blank
  }

  /**
   * What one line is. `complete`: its line break came (only complete lines open or close a
   * fence; the line being written is read without changing what the reader remembers).
   * @param {string} line the line without its line break
   * @param {boolean} complete
   * @returns {{kind: string, text?: string, level?: number, lang?: string}}
   */
  read(line, complete = true) {
    if (this.fence) {
      const close = FENCE_RE.exec(line);
      if (
        close &&
        close[1][0] === this.fence.marker &&
        close[1].length >= this.fence.length &&
        !close[2]
      ) {
        if (complete) this.fence = null;
        return { kind: "fence-close" };
      }
      return { kind: "code", text: line };
    }
    if (this.mathCloser) {
      const closes = line.trimEnd().endsWith(this.mathCloser);
      if (closes && complete) this.mathCloser = "";
      const text = closes ? line.trimEnd().slice(0, -this.mathCloser.length) : line;
      return { kind: "math", text };
    }
    const opener = MATH_OPEN_RE.exec(line);
    if (opener) {
      // A display formula on lines of its own: `$$` (or `\[`) alone, its lines, then `$$`.
      if (complete) this.mathCloser = opener[1] === "$$" ? "$$" : "\\]";
      return { kind: "math", text: "" };
    }
    const fence = FENCE_RE.exec(line);
    if (fence) {
      const lang = fence[2].replace(LABEL_RE, "").slice(0, 32);
      if (complete) this.fence = { marker: fence[1][0], length: fence[1].length, lang };
      return { kind: "fence", lang };
    }
    if (!line.trim()) {
      if (complete) this.blank = true;
      return { kind: "blank" };
    }
    const info = this.readBlock(line, complete);
    if (complete) {
      // Text goes on in the item above (lazily, or indented after a blank line); anything
      // else ends the open items.
      const inItem = info.kind === "text" && (!this.blank || /^ /.test(line));
      if (!inItem && info.depth === undefined && !/bullet|ordered/.test(info.kind)) this.items = [];
      this.blank = false;
    }
    return info;
  }

  readBlock(line, complete) {
    const item = RULE_RE.test(line) ? null : this.listItem(line, complete);
    if (item) return item;
    if (RULE_RE.test(line)) return { kind: "rule" };
    let match = HEADING_RE.exec(line);
    if (match) return { kind: "heading", level: match[1].length, text: match[2] || "" };
    match = QUOTE_RE.exec(line);
    if (match) return { kind: "quote", text: match[1] };
    return { kind: "text", text: line.trim() };
  }

  /**
   * A list item (bullet or ordered) and its `depth`: how many open items it nests in (left
   * out at 0). A line indented 4 or more columns past every open item is not an item.
   * @returns {{kind: string, text: string, depth?: number} | null}
   */
  listItem(line, complete) {
    const match = ITEM_RE.exec(line.replace(/\t/g, "    "));
    if (!match) return null;
    const [, spaces, marker, gap, text] = match;
    const indent = spaces.length;
    const open = this.items.filter((column) => column <= indent);
    const parent = open.length ? open[open.length - 1] : 0;
    if (indent - parent > 3) return null; // indented code, or text of the item above
    // The item's text starts after the marker and its spaces (one, if more than four follow).
    const column = indent + marker.length + (gap.length > 4 ? 1 : gap.length);
    if (complete) this.items = [...open, column];
    const kind = /\d/.test(marker) ? "ordered" : "bullet";
    return open.length ? { kind, text, depth: open.length } : { kind, text };
  }
}

/**
 * The text as spans: `{text, strong?, em?, code?}`. `**x**`/`__x__` strong, `*x*`/`_x_` em,
 * `` `x` `` code; markers are not shown. A marker whose partner has not come yet opens its span
 * to the end of the text (it is being written), except where it cannot open (before a space,
 * `_` inside a word).
 * @param {string} text
 * @returns {{text: string, strong?: boolean, em?: boolean, code?: boolean}[]}
 */
export function inlineSpans(text) {
  const spans = [];
  let strong = false;
  let em = false;
  let plain = "";
  const flush = () => {
    if (plain) spans.push(styled(plain, strong, em));
    plain = "";
  };
  let i = 0;
  while (i < text.length) {
    const char = text[i];
    const math = mathAt(text, i);
    if (math) {
      flush();
      if (math.tex) spans.push({ text: math.tex, math: true });
      i = math.end;
    } else if (char === "\\" && i + 1 < text.length && /[!-/:-@[-`{-~]/.test(text[i + 1])) {
      plain += text[i + 1];
      i += 2;
    } else if (char === "`") {
      let run = 1;
      while (text[i + run] === "`") run += 1;
      const fence = "`".repeat(run);
      const close = text.indexOf(fence, i + run);
      flush();
      const end = close === -1 ? text.length : close;
      const code = text.slice(i + run, end);
      if (code) spans.push({ ...styled(code, strong, em), code: true });
      i = close === -1 ? text.length : close + run;
    } else if (char === "*" || char === "_") {
      const double = text[i + 1] === char;
      const width = double ? 2 : 1;
      const before = text[i - 1] ?? " ";
      const after = text[i + width] ?? "";
      const isOpen = double ? strong : em;
      const wordy = char === "_" && /\w/.test(before) && /\w/.test(after || " ");
      const canClose = isOpen && !/\s/.test(before) && !wordy;
      const canOpen = !isOpen && after !== "" && !/\s/.test(after) && !wordy;
      if (canClose || canOpen) {
        flush();
        if (double) strong = !strong;
        else em = !em;
      } else {
        plain += text.slice(i, i + width);
      }
      i += width;
    } else {
      plain += char;
      i += 1;
    }
  }
  flush();
  return spans;
}

/**
 * A formula starting at `i`, as the server's parser sees one (chat/rendering/mathml.py):
 * `$$…$$`, `\\(…\\)` and `\\[…\\]` (open to the end of the text while being written), and
 * `$…$` only once its closer has come (no space inside either end, no digit after it: "$5 and
 * $10" is money, not a formula). Returns the formula's source and where it ends, or null.
 */
function mathAt(text, i) {
  const two = text.slice(i, i + 2);
  const closer = { $$: "$$", "\\(": "\\)", "\\[": "\\]" }[two];
  if (closer) {
    const close = text.indexOf(closer, i + 2);
    const end = close === -1 ? text.length : close;
    return { tex: text.slice(i + 2, end).trim(), end: close === -1 ? end : close + 2 };
  }
  if (text[i] !== "$" || text[i - 1] === "\\" || /\s/.test(text[i + 1] ?? " ")) return null;
  for (let j = i + 1; j < text.length; j += 1) {
    if (text[j] === "\\") j += 1;
    else if (text[j] === "$") {
      if (/\s/.test(text[j - 1]) || /\d/.test(text[j + 1] ?? "")) return null;
      return { tex: text.slice(i + 1, j), end: j + 1 };
    }
  }
  return null;
}

const TEX_SYMBOLS = {
  alpha: "α", beta: "β", gamma: "γ", delta: "δ", epsilon: "ε", varepsilon: "ε", zeta: "ζ",
  eta: "η", theta: "θ", iota: "ι", kappa: "κ", lambda: "λ", mu: "μ", nu: "ν", xi: "ξ",
  pi: "π", rho: "ρ", sigma: "σ", tau: "τ", phi: "φ", varphi: "φ", chi: "χ", psi: "ψ",
  omega: "ω", Gamma: "Γ", Delta: "Δ", Theta: "Θ", Lambda: "Λ", Xi: "Ξ", Pi: "Π",
  Sigma: "Σ", Phi: "Φ", Psi: "Ψ", Omega: "Ω", sum: "∑", prod: "∏", int: "∫", oint: "∮",
  infty: "∞", partial: "∂", nabla: "∇", cdot: "·", times: "×", div: "÷", pm: "±", mp: "∓",
  le: "≤", leq: "≤", ge: "≥", geq: "≥", ne: "≠", neq: "≠", approx: "≈", equiv: "≡",
  sim: "∼", propto: "∝", to: "→", rightarrow: "→", leftarrow: "←", Rightarrow: "⇒",
  Leftrightarrow: "⇔", in: "∈", notin: "∉", subset: "⊂", subseteq: "⊆", cup: "∪", cap: "∩",
  forall: "∀", exists: "∃", emptyset: "∅", ldots: "…", cdots: "⋯", dots: "…", quad: " ",
  qquad: "  ", circ: "∘", degree: "°", sqrt: "√", neg: "¬", land: "∧", lor: "∨",
};

const TEX_ARGUMENTS = new Set(["frac", "dfrac", "tfrac", "sqrt", "text", "mathrm", "mathbf", "operatorname"]);

/**
 * A formula's source as plain text for the preview, until its block's MathML comes: symbols
 * for the common commands, `\\frac{a}{b}` as a/b, superscripts and subscripts as their own
 * pieces; braces and unknown commands' backslashes dropped. Never markup.
 * @param {string} tex
 * @returns {{text: string, sup?: boolean, sub?: boolean}[]}
 */
export function texPreview(tex) {
  const pieces = [];
  const push = (text, kind) => {
    if (!text) return;
    const last = pieces[pieces.length - 1];
    if (last && !last.sup === !kind?.sup && !last.sub === !kind?.sub) last.text += text;
    else pieces.push({ text, ...kind });
  };
  const group = (at) => {
    // The argument at `at`: a {group} or one character / command; returns [text, end].
    if (tex[at] === "{") {
      let depth = 0;
      for (let j = at; j < tex.length; j += 1) {
        if (tex[j] === "{") depth += 1;
        else if (tex[j] === "}" && --depth === 0) return [plain(tex.slice(at + 1, j)), j + 1];
      }
      return [plain(tex.slice(at + 1)), tex.length];
    }
    const command = /^\\([a-zA-Z]+)/.exec(tex.slice(at));
    if (command) return [TEX_SYMBOLS[command[1]] ?? command[1], at + command[0].length];
    return [tex[at] ?? "", at + 1];
  };
  const plain = (inner) =>
    texPreview(inner)
      .map((piece) => piece.text)
      .join("");
  let i = 0;
  while (i < tex.length) {
    const char = tex[i];
    if (char === "^" || char === "_") {
      const [text, end] = group(i + 1);
      push(text, char === "^" ? { sup: true } : { sub: true });
      i = end;
    } else if (char === "\\") {
      const command = /^\\([a-zA-Z]+)/.exec(tex.slice(i));
      if (!command) {
        push(tex[i + 1] ?? "");
        i += 2;
        continue;
      }
      i += command[0].length;
      const name = command[1];
      if (TEX_ARGUMENTS.has(name)) while (tex[i] === " ") i += 1;
      if (name === "frac" || name === "dfrac" || name === "tfrac") {
        const [top, afterTop] = group(i);
        const [bottom, end] = group(afterTop);
        const wrapped = (t) => (t.length > 1 ? `(${t})` : t);
        push(`${wrapped(top)}/${wrapped(bottom)}`);
        i = end;
      } else if (name === "sqrt") {
        const [inner, end] = group(i);
        push(inner.length > 1 ? `√(${inner})` : `√${inner}`);
        i = end;
      } else if (name === "left" || name === "right" || name === "displaystyle") {
        // sizing only
      } else if (name === "text" || name === "mathrm" || name === "mathbf" || name === "operatorname") {
        const [inner, end] = group(i);
        push(inner);
        i = end;
      } else {
        push(TEX_SYMBOLS[name] ?? name);
      }
    } else if (char === "{" || char === "}") {
      i += 1;
    } else {
      push(char);
      i += 1;
    }
  }
  return pieces;
}

function styled(text, strong, em) {
  const span = { text };
  if (strong) span.strong = true;
  if (em) span.em = true;
  return span;
}

/**
 * `text` without its first `count` code points, and how many of them it did not hold.
 * @returns {{rest: string, missing: number}}
 */
export function dropCodePoints(text, count) {
  let i = 0;
  let dropped = 0;
  while (dropped < count && i < text.length) {
    const unit = text.charCodeAt(i);
    const next = text.charCodeAt(i + 1);
    i += unit >= 0xd800 && unit <= 0xdbff && next >= 0xdc00 && next <= 0xdfff ? 2 : 1;
    dropped += 1;
  }
  return { rest: text.slice(i), missing: count - dropped };
}
