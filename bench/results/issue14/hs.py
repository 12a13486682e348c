"""Handshakes/s: 500 sockets opened 50 at a time, three times, on chatsite without and with Redis.

Run from a tree's root (its bench/ must be main's): PYTHONPATH=. .venv/bin/python hs.py 500
"""

import asyncio
import contextlib
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

from bench import procs, relay

N = int(sys.argv[1]) if len(sys.argv) > 1 else 500


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="hs-"))
    out = {}
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        for redis in (False, True):
            folder = work / ("redis" if redis else "sqlite")
            folder.mkdir()
            url = procs.migrated_database(folder)
            cookies = procs.make_users(url, N, "hs-")
            prefix = f"bench:hs{uuid.uuid4().hex[:6]}:" if redis else None
            if prefix:
                stack.callback(procs.delete_redis_prefix, prefix)
            with procs.chatsite(url, "", redis_prefix=prefix) as site:
                rates = [
                    asyncio.run(relay.idle_sockets(site, cookies, N))["handshakes_per_s"]
                    for _ in range(3)
                ]
            out["redis" if redis else "sqlite"] = rates
    print(out)


main()
