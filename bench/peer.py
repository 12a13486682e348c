"""The benchmark's peer: LiteLLM proxy (in a virtual environment of its own) before the model.

`make bench-full` (or `python -m bench.run --peer`) measures it beside chatsite with the same
load as the direct side, so every change is judged against a peer and not only against ourselves.
It is optional: `start()` raises `PeerUnavailable` with a one-line reason when LiteLLM cannot be
installed or started, and the runner carries on without it. Why it is installed and configured
this way: docs/decisions/benchmark-peer.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.procs import ROOT, Proc, free_port, stop, wait_for_port

NAME = "LiteLLM proxy"
# The newest 1.108 release whose `proxy` extra resolves from the package index this project
# uses (1.108.8 to 1.108.14 pin sub-packages that are not published there). Issue 18's figures
# were taken with 1.108, so this keeps them comparable.
LITELLM_VERSION = "1.108.7"
REQUIREMENT = f"litellm[proxy]=={LITELLM_VERSION}"
# Gitignored; `rm -rf` it to reinstall. BENCH_PEER_VENV points elsewhere, e.g. at one install
# shared by several checkouts (it is ~750 MB).
VENV = Path(os.environ.get("BENCH_PEER_VENV") or ROOT / "bench" / ".peer-venv").resolve()
INSTALL_SECONDS = 1800.0  # a first install downloads ~250 MB of wheels
STARTUP_SECONDS = 180.0  # it imports for 15-40 s on this machine before it listens
MODEL = "demo-full"

# What the proxy runs with, and why. No database (no DATABASE_URL): nothing to write spend
# logs or keys to, as a one-process deployment in front of one model would run it. A master key
# because 1.108 refuses to start without one, and chatsite authenticates every turn too.
ENVIRONMENT = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the price list from the internet
    "LITELLM_TELEMETRY_DISABLED": "true",  # no usage telemetry
    "LITELLM_LOG": "ERROR",  # quiet: uvicorn's access log and LiteLLM's info lines off
    "LITELLM_MODE": "PRODUCTION",  # no loading of a .env file from the working directory
    "LITELLM_DONT_SHOW_FEEDBACK_BOX": "true",
    "PYTHONUNBUFFERED": "1",
}
SWITCHED_OFF = [
    "database (no DATABASE_URL): no spend logs, no key or user tables",
    "telemetry (LITELLM_TELEMETRY_DISABLED=true)",
    "remote model price map (LITELLM_LOCAL_MODEL_COST_MAP=True)",
    "success/failure callbacks (none configured) and message logging",
    "uvicorn access log and info logging (LITELLM_LOG=ERROR)",
]


class PeerUnavailable(Exception):
    """The peer cannot run here; the message is the one line the benchmark prints."""


@dataclass
class Peer:
    """A started LiteLLM proxy: the process, its OpenAI-style base URL and its key."""

    proc: Proc
    api_key: str
    version: str
    config: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """What results.json records about the peer (never its key)."""
        return {
            "name": NAME,
            "version": self.version,
            "requirement": REQUIREMENT,
            "config": self.config,
            "environment": ENVIRONMENT,
            "switched_off": SWITCHED_OFF,
        }


def python() -> Path:
    return VENV / "bin" / "python"


def installed_version() -> str | None:
    """The litellm version in the peer's virtual environment, or None (read from its metadata
    folder: importing litellm takes seconds)."""
    for path in VENV.glob("lib/python*/site-packages/litellm-*.dist-info"):
        return path.name.removeprefix("litellm-").removesuffix(".dist-info")
    return None


def ensure_installed(log: Any = print) -> str:
    """Install the pinned LiteLLM into bench/.peer-venv unless it is there; returns its version.

    Its own virtual environment, so neither its ~100 dependencies nor their pins touch the
    project's .venv.
    """
    if installed_version() == LITELLM_VERSION and (VENV / "bin" / "litellm").exists():
        return LITELLM_VERSION
    log(f"peer: installing {REQUIREMENT} into {VENV} (first use: a few minutes)")
    try:
        if not python().exists():
            _run([sys.executable, "-m", "venv", str(VENV)], 300)
        _run([str(python()), "-m", "pip", "install", "--quiet", REQUIREMENT], INSTALL_SECONDS)
    except (OSError, subprocess.SubprocessError) as exc:
        raise PeerUnavailable(f"could not install {REQUIREMENT}: {_last_line(exc)}") from exc
    version = installed_version()
    if version != LITELLM_VERSION:
        raise PeerUnavailable(f"installing {REQUIREMENT} left litellm {version} in {VENV}")
    return version


def config_for(upstream: str) -> dict[str, Any]:
    """The proxy's config: one model, the demo model behind it as an OpenAI-compatible API."""
    return {
        "model_list": [
            {
                "model_name": MODEL,
                "litellm_params": {
                    "model": f"openai/{MODEL}",
                    "api_base": upstream,
                    "api_key": "demo-needs-no-key",
                },
            }
        ],
        "litellm_settings": {
            "callbacks": [],
            "success_callback": [],
            "failure_callback": [],
            "turn_off_message_logging": True,
        },
        "general_settings": {"disable_spend_logs": True},
    }


@contextlib.contextmanager
def start(upstream: str, log: Any = print) -> Iterator[Peer]:
    """LiteLLM proxy (one uvicorn worker: one process, as chatsite's one daphne) in front of
    `upstream`, installed first if need be; warmed by one answer; stopped after."""
    version = ensure_installed(log)
    workdir = Path(tempfile.mkdtemp(prefix="litellm-bench-"))
    config = config_for(upstream)
    # JSON is YAML: no YAML writer needed in the project's environment.
    (workdir / "config.yaml").write_text(json.dumps(config, indent=2))
    api_key = "sk-bench-" + secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env.update(ENVIRONMENT, LITELLM_MASTER_KEY=api_key)
    port = free_port()
    log_path = workdir / "server.log"
    command = [str(VENV / "bin" / "litellm"), "--config", "config.yaml"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    try:
        with log_path.open("wb") as out:
            popen = subprocess.Popen(
                command, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT
            )
            try:
                proc = Proc("litellm", popen, f"http://127.0.0.1:{port}/v1", log_path)
                try:
                    wait_for_port(port, popen, log_path, STARTUP_SECONDS)
                    _warm(proc.base, api_key)
                except (RuntimeError, httpx.HTTPError, LookupError, ValueError) as exc:
                    raise PeerUnavailable(f"did not start: {_last_line(exc)}") from exc
                yield Peer(proc, api_key, version, config)
            finally:
                stop(popen)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _warm(base: str, api_key: str) -> None:
    """One answer before measuring: LiteLLM imports its provider code on the first request
    (about 1.4 s here), a one-off that is not what a relay costs per answer."""
    response = httpx.post(
        base + "/chat/completions",
        headers={"Authorization": f"Bearer {api_key}"},
        json={"model": MODEL, "messages": [{"role": "user", "content": "/long 3"}]},
        timeout=120,
        trust_env=False,
    )
    response.raise_for_status()
    if not response.json()["choices"][0]["message"]["content"]:
        raise RuntimeError("its warm-up answer was empty")


def _run(command: list[str], timeout: float) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("ERROR")] or lines or ["no output"]
        raise subprocess.SubprocessError(f"exit {done.returncode}: {errors[-1]}")


def _last_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]


def main() -> int:
    """`python -m bench.peer`: install the peer (or report why it cannot be), then exit."""
    started = time.monotonic()
    try:
        version = ensure_installed()
    except PeerUnavailable as exc:
        print(f"peer: {NAME} unavailable: {exc}")
        return 1
    print(f"peer: {NAME} {version} ready in {VENV} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
