"""One writer per workdir: WORKDIR/lock names the process that trains there.

Two runs on one workdir overwrite each other's checkpoints and metrics, so a run takes
the lock before it writes anything and a second run refuses, naming the pid and host
that hold it. The lock file holds JSON {pid, host, started}. A lock whose process is
gone (same host, no such pid) is stale: the next run takes it over. On another host the
pid cannot be checked, so such a lock is only ever released by its owner or by hand.

Taking the lock is atomic: the check and the write happen under an flock of
WORKDIR/lock.guard, so two runs starting together cannot both find it free.
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import pathlib
import socket
from typing import Iterator

LOCK_FILE = "lock"
GUARD_FILE = "lock.guard"


class WorkdirLocked(RuntimeError):
    """Another live process holds the workdir; the message names it and the fix."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _read(path: pathlib.Path) -> dict | None:
    """The lock's record, or None for no file; an unreadable file counts as stale (a
    writer killed between create and write)."""
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _held_by_other(record: dict, host: str, pid: int) -> bool:
    if not record or "pid" not in record:
        return False
    if record.get("host") != host:
        return True
    other = int(record["pid"])
    return other != pid and _alive(other)


@contextlib.contextmanager
def held(workdir: str | os.PathLike) -> Iterator[pathlib.Path]:
    """Holds WORKDIR/lock while inside; raises WorkdirLocked if a live run holds it."""
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / LOCK_FILE
    host, pid = socket.gethostname(), os.getpid()
    with open(workdir / GUARD_FILE, "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        try:
            record = _read(path)
            if record and _held_by_other(record, host, pid):
                raise WorkdirLocked(
                    f"workdir {workdir} is in use by pid {record['pid']} on host "
                    f"{record.get('host')} (since {record.get('started', '?')}); wait for "
                    f"that run to end or stop it, or use another --workdir. If it is no "
                    f"longer running, delete {path}.")
            mine = {"pid": pid, "host": host,
                    "started": datetime.datetime.now().isoformat(timespec="seconds")}
            tmp = path.with_name(LOCK_FILE + f".{pid}.tmp")
            tmp.write_text(json.dumps(mine))
            os.replace(tmp, path)  # takes over a stale lock in the same step
        finally:
            fcntl.flock(guard, fcntl.LOCK_UN)
    try:
        yield path
    finally:
        # Only our own record is removed: a lock taken over since is someone else's.
        record = _read(path)
        if record and record.get("pid") == pid and record.get("host") == host:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
