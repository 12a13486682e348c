"""The README is the front door: it opens with the two commands and shows every screenshot
`make screenshots` takes (desktop and phone, light and dark, each scene), and says how to make
an admin with a command that works."""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import signal
import sqlite3
from pathlib import Path

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


def _sh_commands() -> list[str]:
    return [
        line.split("#")[0].strip()
        for block in re.findall(r"```sh\n(.*?)```", README, re.S)
        for line in block.splitlines()
    ]


def _answer_prompts(argv: list[str], env: dict[str, str], answers: dict[str, str]) -> str:
    """Run `argv` on a terminal of its own (createsuperuser asks only on a terminal, and
    reads passwords from it), answering each prompt as a person would; its whole output."""
    pid, terminal = pty.fork()
    if pid == 0:  # the child: run the command on the new terminal
        os.chdir(ROOT)
        os.execvpe(argv[0], argv, env)
    output, pending = "", dict(answers)
    try:
        while True:
            ready, _, _ = select.select([terminal], [], [], 120)
            assert ready, f"no output for 120 s; so far: {output[-2000:]}"
            try:
                data = os.read(terminal, 4096)
            except OSError:  # the command ended and closed its terminal
                break
            if not data:
                break
            output += data.decode(errors="replace")
            asking = output.rsplit("\n", 1)[-1].strip()
            for prompt in list(pending):
                if asking.startswith(prompt) and asking.endswith(":"):
                    os.write(terminal, pending.pop(prompt).encode() + b"\n")
    except BaseException:
        os.kill(pid, signal.SIGTERM)  # still waiting for an answer: the failure says why
        raise
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(terminal)
    assert os.waitstatus_to_exitcode(status) == 0, output[-3000:]
    return output


def test_the_readme_says_how_to_make_an_admin_and_that_command_works_on_a_fresh_database(
    tmp_path: Path,
) -> None:
    # After the two setup commands, which stay first (the test above).
    commands = _sh_commands()
    assert "make superuser" in commands[2:]
    # A person's shell: no DJANGO_* settings (`make run` sets what it needs), a fresh database.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CHAT_", "LLM_"))}
    database = tmp_path / "db.sqlite3"
    env["DATABASE_URL"] = f"sqlite:///{database}"
    password = "a-long-admin-passphrase-42"
    output = _answer_prompts(
        ["make", "--no-print-directory", "superuser"],
        env,
        {
            "Username (leave blank to use '": "admin",
            "Email address:": "admin@example.com",
            "Password:": password,
            "Password (again):": password,
        },
    )
    assert "Superuser created successfully." in output
    with contextlib.closing(sqlite3.connect(database)) as connection:
        admins = connection.execute(
            "SELECT username, is_staff, is_superuser FROM auth_user"
        ).fetchall()
    assert admins == [("admin", 1, 1)]
