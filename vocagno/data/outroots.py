"""Where a job made of parts writes (the converter, the scoring pass): the out-root (a local folder, or any remote
Streaming supports through a local working folder), what counts as done there, and the merge that publishes the
dataset.

Guarantees:
- A part is done only when its ``part.json`` is on the out-root itself (uploaded after its shards): a part finished
  locally whose upload broke off is uploaded again, never trusted from the local copy.
- The merge verifies every shard it lists on the out-root (size and xxh3 hash, as recorded when it was written),
  then writes ``vocagno.json`` and ``index.json`` atomically (write, fsync, rename), ``index.json`` last, so a root
  reads as complete only when it is.
- One process converts a job, and one job merges, at a time: their locks name their owner (host, pid), and a lock
  whose owner is gone is taken over.
- The out-root's files may have been written by someone else (a shared folder or bucket): its settings, locks, job
  markers and parts' ``part.json`` are read by ``vocagno.doors.untrusted`` (regular files only, within the ``json_bytes``
  cap: a link to ``/dev/zero`` or a FIFO there is refused in one line naming it), a part's ``index.json`` is checked
  by ``check_index`` (``part_index``) before its names and numbers are used, and a shard is read within the
  ``shard_bytes`` cap. A remote that is a folder on this machine is written and read through no link below it
  (``vocagno.doors.writing.write_inside``, ``vocagno.doors.untrusted.read_bytes``); a remote without ``--local-root`` works in a
  private folder of the temporary folder (``work_folder``).
- A lock that says it was taken at a time no lock was (not finite, or in the future) is stale.
"""

from __future__ import annotations

import hashlib
import contextlib
import fcntl
import json
import math
import os
import re
import socket
import stat
import tempfile
import time
from pathlib import Path
from typing import Callable, TypeVar

from streaming.base.hashing import get_hash

from vocagno.errors import Refused
from vocagno.data.shards import METADATA_FILE, SHARD_HASH
from vocagno.shown import terminal
from vocagno.doors.untrusted import UntrustedFile, check_index, inside, read_bytes, read_json
from vocagno.doors.writing import move_inside, write_atomically, write_inside

T = TypeVar("T")

__all__ = ["Output", "PART_STATS", "OwnedLock", "job_marker", "all_jobs_done", "check_or_write_settings",
           "unfinished_parts", "merge_once", "publish_dataset", "merged_index", "verify_shards", "part_index",
           "work_folder"]

PART_STATS = "part.json"
MERGE_LOCK = "merge.lock"
# How far another host's clock may run ahead of this one's: a lock taken later than now by more is stale.
CLOCK_SKEW = 300.0


def _is_missing(error: Exception) -> bool:
    """Whether a download failed because the object is not there: Streaming's local and GCS downloaders raise
    FileNotFoundError (or the client's NotFound), its S3 downloader botocore's ClientError with a 404 or NoSuchKey."""
    if isinstance(error, FileNotFoundError) or type(error).__name__ == "NotFound":
        return True
    code = str(getattr(error, "response", {}).get("Error", {}).get("Code", ""))
    return code in ("404", "NoSuchKey")


class Output:
    """The out-root. ``local`` is where parts are written; for a remote, ``remote`` is where they are uploaded. A
    remote without ``://`` is a folder on this machine (``--local-root`` given with a local ``--out-root``): it is
    written and read here, through no link below it, not by Streaming's uploader and downloader (which copy through
    links)."""

    def __init__(self, out_root: str, local_root: str | None):
        remote = "://" in out_root or local_root is not None
        self.remote = out_root if remote else None
        self._on_machine = remote and "://" not in out_root
        if remote and local_root is None:
            local_root = work_folder(out_root)
        self.local = Path(local_root if remote else out_root)
        self.local.mkdir(parents=True, exist_ok=True)
        self._uploader = None
        self._downloader = None  # made at the first download, kept: a client per file costs more than a small file
        if self._on_machine:
            Path(self.remote).mkdir(parents=True, exist_ok=True)  # the folder the user named (a link there is theirs)
        elif remote:
            from streaming.base.storage import CloudUploader

            self._uploader = CloudUploader.get((str(self.local), self.remote), keep_local=True, exist_ok=True)

    def __str__(self) -> str:
        return self.remote or str(self.local)

    def _read_on_machine(self, relative: str) -> bytes | None:
        """The bytes of ``relative`` in the remote folder on this machine, or None when it is missing: a regular file
        reached through no link, within the ``json_bytes`` cap for a ``.json`` file, else ``shard_bytes``."""
        try:
            return read_bytes(relative, folder=self.remote,
                              cap_name="json_bytes" if relative.endswith(".json") else "shard_bytes")
        except FileNotFoundError:
            return None

    def _download(self, relative: str) -> bool:
        """Whether ``relative`` is on the remote; if so, its copy replaces ``local / relative`` (written through no
        link below the local folder). Streaming's downloaders skip a file that exists locally, so an object is
        downloaded to a fresh scratch file first; it is checked (its size against its cap) when it is read, once it
        has landed."""
        if self._on_machine:
            data = self._read_on_machine(relative)
            if data is None:
                return False
            _write_inside(self.local, relative, data)
            return True
        with tempfile.TemporaryDirectory(dir=self.local) as scratch:
            copy = Path(scratch) / "file"
            if not self._download_object(relative, copy):
                return False
            _write_inside(self.local, relative, copy)
        return True

    def _download_object(self, relative: str, copy: Path) -> bool:
        """Download ``relative`` from the object store to ``copy`` (a fresh name): whether it was there."""
        from streaming.base.storage import CloudDownloader

        if self._downloader is None:
            self._downloader = CloudDownloader.get(self.remote)
        try:
            self._downloader.download(f"{self.remote.rstrip('/')}/{relative}", str(copy))
        except Exception as error:
            if _is_missing(error):
                return False
            raise
        return copy.exists()

    def fetch(self, relative: str) -> bool:
        """Whether ``relative`` exists, fetched into the local folder first when the output is remote and the local
        folder lacks it. For files written once and never changed (settings, a finished part's index)."""
        path = self.local / relative
        if path.exists() or self.remote is None:
            return path.exists()
        return self._download(relative)

    def pull(self, relative: str) -> bool:
        """Whether ``relative`` is on the out-root itself (for a remote, looked up there, not in the local copy), and
        if so, the out-root's copy in the local folder."""
        if self.remote is None:
            return (self.local / relative).exists()
        return self._download(relative)

    def read_from_out_root(self, relative: str) -> bytes | None:
        """The bytes of ``relative`` as the out-root holds them, or None when it is missing."""
        if self.remote is None:
            if not os.path.lexists(self.local / relative):
                return None
            return read_bytes(relative, folder=self.local, cap_name="shard_bytes")
        if self._on_machine:
            return self._read_on_machine(relative)
        with tempfile.TemporaryDirectory(dir=self.local) as scratch:
            copy = Path(scratch) / "file"
            return read_bytes(copy, cap_name="shard_bytes") if self._download_object(relative, copy) else None

    def publish(self, *relatives: str) -> None:
        """Upload local files, in this order, when the output is remote. To a folder on this machine, each is read
        from the local folder as a file from elsewhere (a regular file, no link, within the ``shard_bytes`` cap) and
        written into the remote folder by ``write_inside``: a link planted there, at the file or at a folder on the
        way, is replaced or refused, never written through."""
        for relative in relatives if self.remote is not None else ():
            if self._on_machine:
                data = read_bytes(relative, folder=self.local, cap_name="shard_bytes")
                _write_inside(self.remote, relative, data)
            else:
                self._uploader.upload_file(relative)

    def publish_part(self, name: str) -> None:
        """Upload a finished part: its shards and index first, its ``part.json`` (what makes it done) last."""
        files = sorted(f.name for f in (self.local / name).iterdir() if f.name != PART_STATS)
        self.publish(*(f"{name}/{f}" for f in files), f"{name}/{PART_STATS}")


def _relative(relative: str) -> str:
    """``relative`` if it is a relative path of plain names (what ``write_inside`` and ``move_inside`` take)."""
    return inside("", relative, relative, "path").as_posix()


def _write_inside(folder: str | Path, relative: str, data: bytes | Path) -> None:
    """``write_inside`` of ``data`` (or ``move_inside`` of the file ``data``), refused (``UntrustedFile``) where a
    folder on the way is a link or no folder."""
    try:
        if isinstance(data, Path):
            move_inside(data, folder, _relative(relative))
        else:
            write_inside(folder, _relative(relative), data)
    except NotADirectoryError as error:
        raise UntrustedFile(str(error)) from None


def work_folder(out_root: str) -> Path:
    """The local working folder of a remote ``out_root`` given no ``--local-root``: a folder of its own in
    ``$TMPDIR/vocagno-convert-UID`` (its name the out-root's, then a hash of it). The temporary folder is every user's:
    the top folder is made private (``0700``) and used only if it is a real folder (no link) of this user's own, open
    to no one else, and so is the out-root's folder inside it; anything else there (planted by another user) is
    refused (``UntrustedFile``), not used."""
    top = Path(tempfile.gettempdir()) / f"vocagno-convert-{os.getuid()}"
    digest = hashlib.sha256(out_root.encode("utf-8", "surrogatepass")).hexdigest()[:12]  # s3://b/x_y vs s3://b/x/y
    name = re.sub(r"[^\w.-]+", "_", out_root, flags=re.ASCII)[:100]  # 100 bytes: a name may hold 255
    for folder in (top, top / f"{name}-{digest}"):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise UntrustedFile(f"{folder}: refused as the local working folder of {out_root}: it is not a private "
                                "folder of this user's own (a link, another user's, or open to others); pass "
                                "--local-root")
    return folder


def job_marker(job: int, num_jobs: int) -> str:
    """The name of job ``job`` of ``num_jobs``'s files: ``.json`` (written when it is done: its parts), ``.lock``."""
    return f"job-{job:04d}-of-{num_jobs:04d}"


def all_jobs_done(output: Output, num_jobs: int) -> bool:
    return all(output.pull(f"{job_marker(i, num_jobs)}.json") for i in range(num_jobs))


def check_or_write_settings(output: Output, name: str, wanted: dict, what: str, flag: str) -> None:
    """A job resumed on an out-root must run as the first did: refuse other settings than those ``name`` recorded
    there (naming the keys that differ), and a dataset that no such job made; record them on a fresh out-root."""
    if output.fetch(name):
        earlier = read_json(output.local / name)
        if not isinstance(earlier, dict):
            raise UntrustedFile(f"{output.local / name}: refused: not the settings a {what} records (a JSON object)")
        changed = sorted(k for k in set(wanted) | set(earlier) if wanted.get(k) != earlier.get(k))
        if changed:
            raise Refused(f"{output} holds a {what} made with other settings ({', '.join(changed)} differ); "
                          f"use another {flag}, or delete it to start over")
        return
    if output.fetch("index.json"):
        raise Refused(f"{output} holds a dataset (index.json) that no {what} made: it "
                      f"would be overwritten; use another {flag}")
    write_atomically(output.local / name, json.dumps(wanted, indent=1, ensure_ascii=False))
    output.publish(name)


def unfinished_parts(output: Output, parts: list[str]) -> list[str]:
    """The parts that are not done on the out-root (their ``part.json``), or whose index can't be fetched."""
    return [p for p in parts if not (output.pull(f"{p}/{PART_STATS}") and output.fetch(f"{p}/index.json"))]


def merge_once(output: Output, merge: Callable[[], T]) -> T | None:
    """``merge()`` under the out-root's merge lock; None, without merging, when a live job holds it (jobs that end
    together merge once: the first takes the lock and publishes the dataset)."""
    lock = OwnedLock(output.local / MERGE_LOCK, f"merging {output}")
    if not lock.acquire():
        return None
    try:
        return merge()
    finally:
        lock.release()


def publish_dataset(output: Output, parts: list[str], metadata) -> None:
    """Verify every shard of ``parts`` on the out-root, then write ``metadata`` (a ``ShardMetadata``) and the merged
    ``index.json``, atomically and in that order, and publish them."""
    problems = verify_shards(output, parts)
    if problems:
        raise Refused(f"cannot merge {output}: {len(problems)} shard(s) on it are not as written: "
                      + "; ".join(problems[:10]) + ". Delete those parts there and run the same command again.")
    metadata.write(output.local)
    write_atomically(output.local / "index.json", json.dumps(merged_index(output.local, parts)))
    output.publish(METADATA_FILE, "index.json")


def verify_shards(output: Output, parts: list[str]) -> list[str]:
    """What is wrong with the shards the parts' indexes list, as the out-root holds them (empty: nothing)."""
    problems = []
    for part in parts:
        for shard in part_index(output.local, part, output)["shards"]:
            info = shard.get("zip_data") or shard["raw_data"]
            relative = _shard_path(output, part, info["basename"])
            data = output.read_from_out_root(relative)
            if data is None:
                problems.append(f"{relative} is missing")
            elif len(data) != info["bytes"]:
                problems.append(f"{relative} has {len(data):,} bytes, its index says {info['bytes']:,}")
            elif SHARD_HASH in info.get("hashes", {}) and get_hash(SHARD_HASH, data) != info["hashes"][SHARD_HASH]:
                problems.append(f"{relative} does not match its {SHARD_HASH} hash")
    return problems


def merged_index(root: Path, parts: list[str]) -> dict:
    """Streaming's index of the parts' shards as one dataset (what ``streaming.base.util.merge_index`` writes),
    built here so that it can be written atomically."""
    shards = []
    for part in parts:
        for shard in part_index(root, part)["shards"]:
            for key in ("raw_data", "zip_data", "raw_meta", "zip_meta"):
                if shard.get(key):
                    shard[key]["basename"] = _shard_path(root, part, shard[key]["basename"])
            shards.append(shard)
    return {"version": 2, "shards": shards}


def part_index(root: Path, part: str, where: Output | Path | None = None) -> dict:
    """The ``index.json`` of the part ``part`` in the local folder ``root`` (of the out-root ``where``), read as a file
    from elsewhere (no link, within the ``json_bytes`` cap) and checked by ``check_index`` (every name inside the
    part, every number one its shards' bytes can hold) before its names and numbers are used."""
    source = f"{root if where is None else where}/{part}/index.json"
    index = read_json(f"{part}/index.json", folder=root)
    if isinstance(index, dict) and index.get("version") == 2 and index.get("shards") == []:
        return index  # a part whose documents made no sample (check_index refuses an empty dataset)
    return check_index(index, source)


def _shard_path(where: Output | Path, part: str, basename: object) -> str:
    """``part/basename`` for a shard that a part's index.json names, refused (``UntrustedFile``) if it leaves the
    part: the out-root's files may have been written by someone else."""
    return inside(part, basename, f"{where}/{part}/index.json", "shard name").as_posix()


class OwnedLock:
    """A lock file holding its owner (host, pid) and what it guards. A lock whose owner process is gone (same host),
    or older than ``stale_after`` seconds (another host, whose processes can't be seen), is taken over.

    Not ``filelock``: its ``FileLock`` (``flock``) does not hold across the hosts of every shared filesystem, and
    breaking a stale soft lock is where its ``SoftFileLock`` had two advisories in October 2026 (GHSA-fq56-3cx3-fjxp,
    GHSA-2g95-wg33-c5x2: two holders admitted). Here a lock is taken by an ``O_EXCL`` create, a takeover is judged
    under an ``flock`` beside it, and a refusal names the holder."""

    def __init__(self, path: Path, what: str, stale_after: float = 3600.0):
        self.path = path
        self.what = what
        self.stale_after = stale_after

    def acquire(self) -> bool:
        owner = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()})
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            self._holder()  # a lock that is no regular file is refused before anything is written beside it
            with self._takeover():  # one taker at a time: the second finds the first's fresh owner, alive
                held = self._holder()
                stale = "a process that is gone" if held is None else self._stale(held)
                if stale is None:
                    # the lock file's owner, as the file says: through terminal(), as anything of a file shown
                    print(terminal(f"{self.what}: held by pid {held.get('pid')} on {held.get('host')} ({self.path})"))
                    return False
                print(terminal(f"{self.what}: taking over {self.path.name} from {stale} ({_brief(held)})"))
                write_atomically(self.path, owner)
                return True
        with os.fdopen(fd, "w") as f:
            f.write(owner)
        return True

    @contextlib.contextmanager
    def _takeover(self):
        """An exclusive ``flock`` on ``LOCK.takeover`` beside the lock (released with its process, however it ends),
        held while a stale lock is judged and taken over: two processes that find the same dead owner do not both
        take its lock."""
        guard = self.path.with_name(self.path.name + ".takeover")
        fd = os.open(guard, os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device planted there: no lock of ours
                raise UntrustedFile(f"{guard}: refused: not a regular file, as a lock's guard is")
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def release(self) -> None:
        self.path.unlink(missing_ok=True)

    def _holder(self) -> dict | None:
        """The lock's owner as its file says, or None where the file holds none (its writer was killed between
        creating the lock and writing its owner). A lock that is no regular file (a link, a FIFO, a device) is
        refused (``UntrustedFile``): it was not made by a lock's owner, and reading it could hang or never end."""
        try:
            data = read_bytes(self.path, cap_name="json_bytes")
        except FileNotFoundError:  # released since: no owner
            return None
        try:
            held = json.loads(data)
        except ValueError:
            return None
        return held if isinstance(held, dict) else None

    def _stale(self, held: dict) -> str | None:
        """Why the lock ``held`` is stale (taken over), or None while its owner may be alive. A lock says when it was
        taken: one that says a time no lock was taken at (not a number, not finite, or later than now by more than
        clocks differ) was not written by a lock's owner, and would otherwise never go stale."""
        try:
            pid, since = int(held.get("pid")), float(held.get("since", 0))
        except (TypeError, ValueError, OverflowError):  # no owner it can name: as a lock whose owner never wrote
            return "a process that is gone"
        if not math.isfinite(since) or since > time.time() + CLOCK_SKEW:
            return f"a lock that says it was taken at {since!r}, not a time a lock was taken"
        if pid < 1:  # 0 or -1 would ask about a group of processes, or all of them
            return "a process that is gone"
        if held.get("host") == socket.gethostname():
            try:
                os.kill(pid, 0)
            except (ProcessLookupError, OverflowError, ValueError):  # gone, or a pid no process can have
                return "a process that is gone"
            except PermissionError:  # alive, another user's
                return None
            return None
        if time.time() - since > self.stale_after:
            return f"a process on another host that took it more than {self.stale_after:,.0f} s ago"
        return None


def _brief(held: object) -> str:
    """A lock's content as a line of at most 200 characters (a planted lock may hold anything)."""
    text = repr(held)
    return text if len(text) <= 200 else text[:200] + "..."
