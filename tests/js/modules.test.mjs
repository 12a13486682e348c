// The house rules of static/chat: small modules, imports that resolve and only go one way,
// and pure modules that need no page.
//
// Run with `node --test tests/js/` (node 20, no npm packages).

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { describe, test } from "node:test";

const DIR = new URL("../../static/chat/", import.meta.url);
const MAX_LINES = 450;
// No DOM, no socket, no timers of their own: each has its tests in tests/js.
const PURE = [
  "backoff.js",
  "composer-state.js",
  "deletion.js",
  "drafts.js",
  "frames.js",
  "keys.js",
  "labels.js",
  "pace.js",
  "reorder.js",
  "tail.js",
];
// What a pure module must not use: the page, the network, timers.
const PAGE_GLOBALS = new RegExp(
  [
    String.raw`\b(?:document|window|navigator|location|localStorage)\s*\.`,
    String.raw`\bWebSocket\b`,
    String.raw`\b(?:setTimeout|setInterval|requestAnimationFrame)\s*\(`,
  ].join("|"),
);

const scripts = readdirSync(DIR).filter((name) => name.endsWith(".js"));
const source = (name) => readFileSync(new URL(name, DIR), "utf8");

/** The sibling modules a script imports (every import is `… from "./name.js";`). */
function importsOf(name) {
  return [...source(name).matchAll(/^\s*(?:import|export)\b[^;]*?\bfrom\s*"([^"]+)";/gms)].map(
    (match) => match[1],
  );
}

describe("static/chat", () => {
  test("no script is longer than 450 lines", () => {
    for (const name of scripts) {
      const lines = source(name).split("\n").length;
      assert.ok(lines <= MAX_LINES, `${name} has ${lines} lines`);
    }
  });

  test("every import names a sibling module that exists", () => {
    for (const name of scripts) {
      for (const target of importsOf(name)) {
        assert.match(target, /^\.\/[\w-]+\.js$/, `${name} imports ${target}`);
        assert.ok(scripts.includes(target.slice(2)), `${name} imports ${target}, which is missing`);
      }
    }
  });

  test("imports only go one way: no module imports itself through others", () => {
    // A cycle would also break hashed static names: collectstatic rewrites each import to its
    // target's hashed name, which for a cycle never settles.
    const state = new Map(); // name -> "visiting" | "done"
    const visit = (name, path) => {
      if (state.get(name) === "done") return;
      assert.notEqual(state.get(name), "visiting", `import cycle: ${[...path, name].join(" → ")}`);
      state.set(name, "visiting");
      for (const target of importsOf(name)) visit(target.slice(2), [...path, name]);
      state.set(name, "done");
    };
    for (const name of scripts) visit(name, []);
  });

  test("pure modules import only pure modules and never touch the page", () => {
    for (const name of PURE) {
      for (const target of importsOf(name)) {
        assert.ok(PURE.includes(target.slice(2)), `${name} (pure) imports ${target}`);
      }
      const code = source(name).replace(/\/\/.*$|\/\*[\s\S]*?\*\//gm, "");
      assert.doesNotMatch(code, PAGE_GLOBALS, name);
    }
  });

  test("the pure modules load without a page", async () => {
    for (const name of PURE) await import(new URL(name, DIR));
  });
});
