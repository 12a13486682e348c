"""The README is the front door: it opens with the two commands and shows every screenshot
`make screenshots` takes (desktop and phone, light and dark, each scene)."""

from __future__ import annotations

import re

from tests.servers import ROOT

README = (ROOT / "README.md").read_text()
SCENES = ("first-screen-{d}-{t}", "{d}-{t}", "limit-{d}-{t}", "tier-{d}-{t}")


def test_the_readme_opens_with_the_two_commands() -> None:
    first_block = re.search(r"```sh\n(.*?)```", README, re.S)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands[:2] == ["make run", "make test"]


def test_the_readme_shows_every_screenshot_and_each_one_exists() -> None:
    shown = set(re.findall(r"docs/screenshots/([\w-]+\.png)", README))
    expected = {
        scene.format(d=device, t=theme) + ".png"
        for scene in SCENES
        for device in ("desktop", "phone")
        for theme in ("light", "dark")
    }
    assert shown == expected
    for name in shown:
        assert (ROOT / "docs" / "screenshots" / name).stat().st_size > 10_000, name
