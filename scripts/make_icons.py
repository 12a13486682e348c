"""Draw chatsite's app icons (static/chat/icons/): a speech bubble on the accent colour.

Pure Python (zlib + struct), so the icons are made here, from this script, with nothing
downloaded: `python scripts/make_icons.py` writes the PNGs and the SVG again.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "static" / "chat" / "icons"
ACCENT = (0x24, 0x56, 0xD6)  # --accent in static/chat/chat.css
WHITE = (0xFF, 0xFF, 0xFF)
SAMPLES = 4  # per axis: 16 samples a pixel smooth the edges


def _rounded_rect(x: float, y: float, box: tuple[float, float, float, float], r: float) -> bool:
    left, top, right, bottom = box
    if not (left <= x <= right and top <= y <= bottom):
        return False
    cx = min(max(x, left + r), right - r)
    cy = min(max(y, top + r), bottom - r)
    return (x - cx) ** 2 + (y - cy) ** 2 <= r * r


def _tail(x: float, y: float) -> bool:
    # A triangle under the bubble's lower left: (0.30, 0.64) (0.46, 0.64) (0.26, 0.80).
    ax, ay, bx, by, cx, cy = 0.30, 0.64, 0.46, 0.64, 0.26, 0.80

    def side(px: float, py: float, qx: float, qy: float) -> float:
        return (x - qx) * (py - qy) - (px - qx) * (y - qy)

    d1, d2, d3 = side(ax, ay, bx, by), side(bx, by, cx, cy), side(cx, cy, ax, ay)
    return not ((d1 < 0 or d2 < 0 or d3 < 0) and (d1 > 0 or d2 > 0 or d3 > 0))


def _colour(x: float, y: float, *, maskable: bool) -> tuple[int, int, int, int]:
    """The icon at (x, y) in the unit square; a maskable icon fills the square and keeps its
    drawing inside the central safe zone (80%)."""
    if maskable:
        x, y = (x - 0.5) / 0.8 + 0.5, (y - 0.5) / 0.8 + 0.5
    elif not _rounded_rect(x, y, (0.0, 0.0, 1.0, 1.0), 0.22):
        return (0, 0, 0, 0)
    bubble = _rounded_rect(x, y, (0.18, 0.22, 0.82, 0.66), 0.12) or _tail(x, y)
    dot = any((x - cx) ** 2 + (y - 0.44) ** 2 <= 0.052**2 for cx in (0.34, 0.50, 0.66))
    if bubble and not dot:
        return (*WHITE, 255)
    return (*ACCENT, 255)


def draw(size: int, *, maskable: bool = False) -> bytes:
    rows = []
    step = 1 / (size * SAMPLES)
    for py in range(size):
        row = bytearray(b"\x00")  # filter: none
        for px in range(size):
            acc = [0, 0, 0, 0]
            for sy in range(SAMPLES):
                for sx in range(SAMPLES):
                    x = px / size + (sx + 0.5) * step
                    y = py / size + (sy + 0.5) * step
                    r, g, b, a = _colour(x, y, maskable=maskable)
                    acc[0] += r * a
                    acc[1] += g * a
                    acc[2] += b * a
                    acc[3] += a
            n = SAMPLES * SAMPLES
            alpha = acc[3] // n
            if acc[3]:
                row += bytes((acc[0] // acc[3], acc[1] // acc[3], acc[2] // acc[3], alpha))
            else:
                row += bytes(4)
        rows.append(bytes(row))
    return _png(size, b"".join(rows))


def _png(size: int, raw: bytes) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", size, size, 8, 6, 0, 0, 0)  # 8-bit RGBA
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


SVG = """<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 100 100">
<rect width="100" height="100" rx="22" fill="#2456d6"/>
<rect x="18" y="22" width="64" height="44" rx="12" fill="#fff"/>
<path d="M30 64 46 64 26 80Z" fill="#fff"/>
<g fill="#2456d6"><circle cx="34" cy="44" r="5.2"/><circle cx="50" cy="44" r="5.2"/>
<circle cx="66" cy="44" r="5.2"/></g>
</svg>
"""


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "icon.svg").write_text(SVG, encoding="utf-8")
    for name, size, maskable in (
        ("icon-192.png", 192, False),
        ("icon-512.png", 512, False),
        ("maskable-512.png", 512, True),
        ("apple-touch-icon.png", 180, True),  # iOS rounds the corners itself
    ):
        (OUT / name).write_bytes(draw(size, maskable=maskable))
        print(f"wrote {OUT / name}")


if __name__ == "__main__":
    main()
