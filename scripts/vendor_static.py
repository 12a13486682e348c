"""Fetches the pinned third-party browser files (htmx, its ws extension, axe-core); verifies them.

Usage (from the repository root):

    .venv/bin/python scripts/vendor_static.py           # update to the newest version in each range
    .venv/bin/python scripts/vendor_static.py --frozen  # re-fetch exactly the recorded versions
    .venv/bin/python scripts/vendor_static.py --check   # offline: verify files against VENDOR.json

Packages come from `npm pack`, so whichever registry npm is configured for is used; no host name
appears here. Each destination directory gets a VENDOR.json recording, per package, the exact
version, the tarball's integrity, and the sha256 of every file written, so `--check` catches a
hand-edited or truncated vendored file without any network (cheap enough for every CI run).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MANIFEST_NAME = "VENDOR.json"


@dataclass(frozen=True)
class VendoredFile:
    """One file taken out of a package tarball (paths inside it start with `package/`)."""

    source: str
    dest: str
    is_licence: bool = False


@dataclass(frozen=True)
class VendoredPackage:
    """One npm package, the version range we accept, and the files we keep from it."""

    name: str
    version_range: str
    dest_dir: str
    files: tuple[VendoredFile, ...]
    # Used only when the package.json has no "license" field; checked by hand against the
    # package's LICENSE file.
    licence_fallback: str = ""


PACKAGES: tuple[VendoredPackage, ...] = (
    VendoredPackage(
        name="htmx.org",
        version_range="~2.0",
        dest_dir="static/vendor",
        files=(
            VendoredFile("dist/htmx.min.js", "htmx.min.js"),
            VendoredFile("LICENSE", "LICENSE-htmx.txt", is_licence=True),
        ),
    ),
    # Test-only: injected into pages by the accessibility tests, never served by the app.
    VendoredPackage(
        name="axe-core",
        version_range="^4",
        dest_dir="tests/browser/vendor",
        files=(
            VendoredFile("axe.min.js", "axe.min.js"),
            VendoredFile("LICENSE", "LICENSE-axe-core.txt", is_licence=True),
            # axe.min.js bundles third-party code whose notices live here.
            VendoredFile(
                "LICENSE-3RD-PARTY.txt", "LICENSE-axe-core-3RD-PARTY.txt", is_licence=True
            ),
        ),
    ),
)


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def npm_pack(spec: str, workdir: Path) -> dict[str, Any]:
    """Run `npm pack <spec>` in workdir and return npm's JSON description of the tarball."""
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("npm is not on PATH; it is needed to fetch vendored packages")
    # --ignore-scripts: we only want the published files, never to run package code.
    result = subprocess.run(
        [npm, "pack", spec, "--json", "--ignore-scripts", "--pack-destination", str(workdir)],
        cwd=workdir,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"npm pack {spec} failed:\n{result.stderr.strip()}")
    packed = json.loads(result.stdout)
    if not isinstance(packed, list) or len(packed) != 1:
        raise SystemExit(f"npm pack {spec}: unexpected output {result.stdout[:200]!r}")
    info: dict[str, Any] = packed[0]
    return info


def read_member(archive: tarfile.TarFile, path: str) -> bytes:
    """The bytes of `package/<path>` in an npm tarball; only regular files are accepted."""
    member = archive.getmember(f"package/{path}")
    if not member.isfile():
        raise SystemExit(f"{path} in the tarball is not a regular file")
    handle = archive.extractfile(member)
    assert handle is not None  # isfile() guarantees a file object
    return handle.read()


def fetch(package: VendoredPackage, workdir: Path, pinned: dict[str, Any] | None) -> dict[str, Any]:
    """Download one package, write its files into place, and return its manifest entry.

    With `pinned` (its current manifest entry) the exact recorded version is fetched and its
    tarball must have the recorded integrity; otherwise the newest version in range is taken.
    """
    version = pinned["version"] if pinned else package.version_range
    info = npm_pack(f"{package.name}@{version}", workdir)
    if pinned and pinned.get("integrity") and info.get("integrity") != pinned["integrity"]:
        raise SystemExit(
            f"{package.name}@{version}: the registry's tarball differs from the recorded one "
            f"(integrity {info.get('integrity')!r}, recorded {pinned['integrity']!r})"
        )
    tarball = workdir / info["filename"]
    dest_dir = ROOT / package.dest_dir
    dest_dir.mkdir(parents=True, exist_ok=True)
    files: list[dict[str, Any]] = []
    with tarfile.open(tarball, "r:gz") as archive:
        package_json = json.loads(read_member(archive, "package.json"))
        for item in package.files:
            data = read_member(archive, item.source)
            target = dest_dir / item.dest
            target.write_bytes(data)
            files.append(
                {
                    "file": item.dest,
                    "source": f"package/{item.source}",
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "licence_file": item.is_licence,
                }
            )
    licence = package_json.get("license") or package.licence_fallback
    if not licence:
        raise SystemExit(f"{package.name}: no licence declared and no fallback recorded")
    print(f"{package.name}@{info['version']} -> {package.dest_dir}/ ({licence})")
    return {
        "name": package.name,
        "version": info["version"],
        "range": package.version_range,
        "licence": licence,
        "integrity": info.get("integrity", ""),
        "files": files,
    }


def recorded_entries(dest_dir: str) -> dict[str, dict[str, Any]]:
    """The manifest entries currently recorded for one destination, by package name."""
    path = ROOT / dest_dir / MANIFEST_NAME
    if not path.is_file():
        return {}
    manifest = json.loads(path.read_text(encoding="utf-8"))
    return {entry["name"]: entry for entry in manifest["packages"]}


def fetch_all(frozen: bool) -> None:
    """Fetch every package and rewrite each destination's VENDOR.json."""
    manifests: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="vendor-static-") as tmp:
        for package in PACKAGES:
            pinned = None
            if frozen:
                pinned = recorded_entries(package.dest_dir).get(package.name)
                if pinned is None:
                    raise SystemExit(f"--frozen: {package.name} is not recorded yet")
            entry = fetch(package, Path(tmp), pinned)
            manifests.setdefault(package.dest_dir, []).append(entry)
    for dest_dir, entries in manifests.items():
        manifest = {
            "generated_by": "scripts/vendor_static.py",
            "packages": entries,
        }
        path = ROOT / dest_dir / MANIFEST_NAME
        path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")


def check_all() -> list[str]:
    """Verify every recorded file against its sha256; return the problems found."""
    problems: list[str] = []
    for dest_dir in sorted({package.dest_dir for package in PACKAGES}):
        path = ROOT / dest_dir / MANIFEST_NAME
        if not path.is_file():
            problems.append(f"{path.relative_to(ROOT)} is missing")
            continue
        manifest = json.loads(path.read_text(encoding="utf-8"))
        recorded = {entry["name"] for entry in manifest["packages"]}
        expected = {package.name for package in PACKAGES if package.dest_dir == dest_dir}
        for name in sorted(expected - recorded):
            problems.append(f"{path.relative_to(ROOT)} does not record {name}")
        for entry in manifest["packages"]:
            for item in entry["files"]:
                target = ROOT / dest_dir / item["file"]
                shown = target.relative_to(ROOT)
                if not target.is_file():
                    problems.append(f"{shown} is missing ({entry['name']}@{entry['version']})")
                elif sha256_of(target) != item["sha256"]:
                    problems.append(
                        f"{shown} does not match the sha256 recorded for "
                        f"{entry['name']}@{entry['version']}"
                    )
    return problems


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check",
        action="store_true",
        help="verify vendored files against VENDOR.json without any network access",
    )
    parser.add_argument(
        "--frozen",
        action="store_true",
        help="re-fetch exactly the versions recorded in VENDOR.json (restore, don't update)",
    )
    args = parser.parse_args(argv)
    if args.check:
        problems = check_all()
        for problem in problems:
            print(f"vendor check: {problem}", file=sys.stderr)
        if problems:
            print("restore them with: scripts/vendor_static.py --frozen", file=sys.stderr)
            return 1
        print("vendored files match VENDOR.json")
        return 0
    fetch_all(frozen=args.frozen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
