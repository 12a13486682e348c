"""The chat page's ES modules as shipped: all preloaded, importing each other by hashed name."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import ROOT, base_env

CHAT = ROOT / "static" / "chat"
PAGE = ROOT / "templates" / "chat" / "page.html"
# Every import in static/chat is `… from "./name.js";` (tests/js/modules.test.mjs checks it).
IMPORT = re.compile(r"""^\s*(?:import|export)\b[^;]*?\bfrom\s*"\./([^"]+)";""", re.M | re.S)


def imports_of(text: str) -> set[str]:
    return set(IMPORT.findall(text))


def reachable_from(entry: str) -> set[str]:
    """Every module `entry` imports, directly or through others."""
    seen: set[str] = set()
    todo = [entry]
    while todo:
        for target in imports_of((CHAT / todo.pop()).read_text(encoding="utf-8")) - seen:
            seen.add(target)
            todo.append(target)
    return seen


def test_the_page_preloads_every_module_the_entry_imports_and_no_other() -> None:
    # A module missing here still loads, one import level later; one too many is fetched for
    # nothing. Either way the list in page.html has gone stale.
    preloaded = set(
        re.findall(
            r"""<link rel="modulepreload" href="\{% static 'chat/([^']+)' %\}">""",
            PAGE.read_text(encoding="utf-8"),
        )
    )
    assert preloaded == reachable_from("stream.js")


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """collectstatic's output with hashed names, as `make cluster` and production build it."""
    root = tmp_path_factory.mktemp("static")
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=base_env(DJANGO_STATIC_MANIFEST="1", DJANGO_STATIC_ROOT=str(root)),
        check=True,
    )
    return root


def test_collectstatic_points_every_module_import_at_the_hashed_file(collected: Path) -> None:
    manifest: dict[str, str] = json.loads((collected / "staticfiles.json").read_text())["paths"]
    scripts = sorted(path.name for path in CHAT.glob("*.js"))
    assert scripts, "no scripts in static/chat"
    for name in scripts:
        hashed = manifest[f"chat/{name}"]
        assert re.fullmatch(rf"chat/{re.escape(name[:-3])}\.[0-9a-f]{{12}}\.js", hashed)
        # The shipped file imports exactly the final hashed names of what the source imports:
        # a stale hash would load an old module next to a new one after an upgrade.
        wanted = {
            manifest[f"chat/{target}"].removeprefix("chat/")
            for target in imports_of((CHAT / name).read_text(encoding="utf-8"))
        }
        shipped = imports_of((collected / hashed).read_text(encoding="utf-8"))
        assert shipped == wanted, name
        for target in shipped:
            assert (collected / "chat" / target).is_file(), f"{name} imports a missing {target}"
