"""Every work-around of Streaming's internals, in one module behind the version pin on mosaicml-streaming.

- ``CheckedStream`` and its MDS reader: Streaming handed only what vocagno checked (index.json through
  ``vocagno.doors.untrusted``, each shard against its hash and caps before it is decoded).
- Shared memory: Streaming names its segments by a prefix it finds free; ``registering_shared_memory`` makes a
  node's datasets register one at a time (two at once took the same prefix), its other ranks take their leader's
  prefix, ``attaching_when_sized`` waits for a segment being sized, and ``clean_leaked_shared_memory`` unlinks only
  what no process holds (Streaming's own cleaner would take another job's).
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import itertools
import json
import os
import re
import shutil
import stat
import tempfile
import threading
import time
import warnings
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from streaming import Stream
from streaming.base.format.mds.reader import MDSReader

from vocagno.data.shards import SHARD_HASH
from vocagno.doors.untrusted import (
    UntrustedFile, check_index, check_mds, decompress, mds_header_bytes, open_regular, read_bytes, read_json, reason,
)
from vocagno.doors.writing import PrivateFolder, move_inside, own_temporary, write_atomically, write_inside


__all__ = ["CheckedStream", "attaching_when_sized", "clean_leaked_shared_memory", "collecting_shared_memory",
           "local_path", "read_index", "registering_shared_memory", "release_shared_memory"]

INDEX_FILE = "index.json"  # Streaming's name for a shard folder's index


# How long a dataset waits for another job's registration before going on without the lock.
REGISTRATION_WAIT_SECONDS = 60.0


def registration_lock_path() -> str:
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return os.path.join(folder, f"vocagno_streaming_registration_{os.geteuid()}.lock")


@contextmanager
def registering_shared_memory():
    """Hold this user's lock on Streaming's shared-memory registration while this process, the local leader of a
    one-node job, opens a dataset; other ranks, and the leaders of jobs over several nodes, pass straight through.

    Streaming's leader looks for the lowest free prefix, then creates its ``_locals`` memory: two jobs starting on one
    node at the same moment pick the same prefix and the later one fails (``FileExistsError: '/000003_locals'``).
    The lock, a file of this user's in the shared memory's own folder (``/dev/shm``, one per machine as the names it
    guards), makes this user's one-node jobs register one after the other; the kernel lets it go when its holder dies.
    The holder waits inside Streaming's barriers, so a leader whose job spans nodes never takes it: two such jobs on
    the same nodes would each hold one node's lock and wait at their barrier for the other's. Nor does a holder block
    for long: after ``REGISTRATION_WAIT_SECONDS`` the dataset goes on as Streaming alone would, with a warning.

    Inside, the node's other ranks take the prefix their leader registered (``_leaders_shm_prefix``) instead of
    looking for one of their own."""
    from streaming.base import dataset as streaming_dataset
    from streaming.base.world import World

    world = World.detect()
    lock = None
    if world.is_local_leader and world.num_nodes == 1:
        path = registration_lock_path()
        try:  # no link, no FIFO (O_NONBLOCK), and only a file of this user's
            lock = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
            info = os.fstat(lock)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                os.close(lock)
                lock = None
        except OSError:  # something else holds the name: register as Streaming alone would
            lock = None
    try:
        if lock is not None:
            deadline = time.monotonic() + REGISTRATION_WAIT_SECONDS
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        warnings.warn(f"another job has held {path} for {REGISTRATION_WAIT_SECONDS:.0f} s: opening "
                                      "the dataset without it")
                        break
                    time.sleep(0.05)
        with _replacing(streaming_dataset, "get_shm_prefix", _leaders_shm_prefix, _registering, True):
            yield
    finally:
        if lock is not None:
            os.close(lock)


_registering = threading.local()  # .value: True in a thread inside registering_shared_memory


def _leaders_shm_prefix(streams_local: list[str], streams_remote: list, world, retry: int = 100) -> tuple[int, Any]:
    """Streaming's ``get_shm_prefix``, except that only each node's leader looks for a free prefix: the node's other
    ranks take the one it registered.

    Streaming has every rank look on its own, then the leader registers what it found: another job on the node that
    exits or registers between the leader's look and another rank's gives them different prefixes, and that rank
    fails ('shared memory prefix=N was not registered by local leader', or '... does not match local leader'). A
    leader that finds its prefix taken when it registers (a job that doesn't take the lock) looks again; one that
    can't register fails every rank of the job, not only itself, instead of leaving them waiting at a barrier.

    The leaders' answers go through the process group's store, not a collective: under NCCL a collective of objects
    runs on the current GPU, which a rank may not have set yet (Streaming's barrier guesses one instead). They are
    keyed by how many datasets this process opened before: the same on every rank as long as the ranks open the same
    datasets in the same order, as Streaming's barriers need too; not by the dataset's folders, which each node may
    have elsewhere (its own ``local`` cache). They are read after a barrier, as Streaming's own way does."""
    from streaming.base.constant import LOCALS, SHM_TO_CLEAN
    from streaming.base.shared import SharedMemory, prefix

    dist = torch.distributed
    if (not getattr(_registering, "value", None) or not (dist.is_available() and dist.is_initialized())
            or world.num_ranks != dist.get_world_size()  # Streaming's World (the environment's) isn't this group's
            or dist.get_backend() == "mpi"):  # MPI's process group has no store
        return prefix.get_shm_prefix(streams_local, streams_remote, world, retry)
    prefix._check_self(streams_local)
    store = dist.distributed_c10d._get_default_store()
    key = f"vocagno/shm_prefix/{next(_prefix_exchanges)}/node"
    shm = error = None
    if world.is_local_leader:
        try:
            for attempt in range(1 + retry):
                found = max(prefix._check_and_find_retrying(streams_local, streams_remote, name, retry)
                            for name in SHM_TO_CLEAN)
                packed = prefix._pack_locals(streams_local, found)
                try:
                    shm = SharedMemory(prefix._get_path(found, LOCALS), True, len(packed))
                    break
                except FileExistsError:
                    if attempt == retry:
                        raise
            shm.buf[:len(packed)] = packed
            answer = f"prefix {found}"
        except Exception as raised:  # told to every rank, then raised here
            error = raised
            answer = f"error {type(raised).__name__}: {raised}"
        store.set(f"{key}{world.node}", answer)
        store.get(f"{key}{world.node}")  # a reply: the store holds it before this rank reaches the barrier
    # No rank reads before every leader wrote: a store may hold an earlier job's answers under the same keys
    # (torchrun's agent's store outlives the workers it restarts, and restarted workers count from 0 again).
    dist.barrier()
    answers = [value.decode() for value in store.multi_get([f"{key}{node}" for node in range(world.num_nodes)])]
    if error is not None:
        raise error
    for node, answer in enumerate(answers):
        if answer.startswith("error "):
            raise RuntimeError(f"node {node}'s leader could not register its dataset's shared memory: {answer[6:]}")
    found = int(answers[world.node].removeprefix("prefix "))
    if not world.is_local_leader:
        shm = SharedMemory(prefix._get_path(found, LOCALS), False)
        their_locals, their_prefix = prefix._unpack_locals(bytes(shm.buf))
        if their_locals != streams_local or their_prefix != found:
            raise RuntimeError(f"this rank's local folders {streams_local} are not its node's leader's "
                               f"{their_locals}: give every rank the same local")
    return found, shm


_prefix_exchanges = itertools.count()  # how many datasets this process opened (C's count: safe in threads)


_replacing_lock = threading.Lock()
_replaced: dict[tuple[int, str], list] = {}  # (id(owner), name): [the original, how many threads are inside]


@contextmanager
def _replacing(owner: Any, name: str, replacement: Any, mark: threading.local, value: Any):
    """``owner.name`` is ``replacement`` while any thread is inside, and ``mark.value`` is ``value`` in this thread
    only: by it the replacement tells this thread's calls from other threads', which it hands to the original."""
    outer, mark.value = getattr(mark, "value", None), value
    key = (id(owner), name)
    with _replacing_lock:
        entry = _replaced.setdefault(key, [getattr(owner, name), 0])
        if entry[1] == 0:
            setattr(owner, name, replacement)
        entry[1] += 1
    try:
        yield
    finally:
        mark.value = outer
        with _replacing_lock:
            entry[1] -= 1
            if entry[1] == 0:
                setattr(owner, name, entry[0])
                del _replaced[key]


# How long a rank waits for a shared memory another rank created to be given its size.
SHARED_MEMORY_SIZE_WAIT_SECONDS = 30.0


@contextmanager
def attaching_when_sized():
    """Streaming's shared memories this thread opens inside, each waited for until the rank that created it has given
    it its size.

    Every rank of a node opens the same names at once (a dataset's barrier, epoch, cache and shard states; its
    resumption state): the first creates each, which is two steps (the name, then its size), and the others attach
    7 ms after they found the name taken. On a loaded node the creator may not have sized it yet: the other rank failed
    with 'cannot mmap an empty file' (a run of the suite's test_multinode died of it)."""
    from streaming.base.shared import memory

    with _replacing(memory, "BuiltinSharedMemory", _sized_shared_memory, _attaching, True):
        yield


_attaching = threading.local()  # .value: True in a thread inside attaching_when_sized


def _sized_shared_memory(name=None, create=False, size=0):
    from multiprocessing import shared_memory

    deadline = time.monotonic() + SHARED_MEMORY_SIZE_WAIT_SECONDS
    while True:
        try:
            return shared_memory.SharedMemory(name, create, size)
        except ValueError as error:  # mmap's, of a memory created and not yet sized
            if create or not getattr(_attaching, "value", None) or "empty file" not in str(error):
                raise
            if time.monotonic() > deadline:
                raise RuntimeError(f"shared memory {name!r} was created but not sized within "
                                   f"{SHARED_MEMORY_SIZE_WAIT_SECONDS:g} s: the rank creating it died or hangs"
                                   ) from None
            time.sleep(0.005)


# collecting_shared_memory's: atexit.register replaced while any thread collects, each thread's own memories collected.
_collecting = threading.local()  # .value: the list a thread collects into
_exit_register = atexit.register


@contextmanager
def collecting_shared_memory(collected: list):
    """Streaming's shared memories this thread opens inside, into ``collected`` instead of onto the exit's list.

    Streaming keeps every shared memory it opens until the process exits (``atexit``): its own, and every other
    prefix its lookup walks past (each dataset's on the machine, six files each). A process opening datasets one after
    the other (an evaluation loop, a notebook, a test suite) ran out of descriptors, and a long job pinned the memory
    dead jobs left, which ``clean_leaked_shared_memory`` then took for held. Other threads' memories (another
    dataset's resumption state) go to the exit's list as before."""
    with _replacing(atexit, "register", _collect, _collecting, collected):
        yield


def _collect(function, *args, **kwargs):
    from streaming.base.shared.memory import SharedMemory

    into = getattr(_collecting, "value", None)
    if into is not None and isinstance(getattr(function, "__self__", None), SharedMemory) and not args and not kwargs:
        into.append(function.__self__)
        return function
    return _exit_register(function, *args, **kwargs)


def release_shared_memory(memories: list, owner_pid: int) -> None:
    """What Streaming does at exit for ``memories``: close them, unlinking those this process created. Only in the
    process that opened them: a forked copy of a dataset (a loader's worker) leaves them to it."""
    if os.getpid() == owner_pid:
        for memory in memories:
            try:
                memory.cleanup()
            except Exception:  # an array still views it, or the system refused: left to the exit, as Streaming would
                _exit_register(memory.cleanup)


def clean_leaked_shared_memory(locals_: list[str], shm_dir: str = "/dev/shm") -> list[str]:
    """Unlink the Streaming shared memory a killed run left on one of ``locals_`` (this run's local folders), and
    return the names unlinked.

    A run killed with its whole process group (a node's death, ``scancel``) leaves its shared memory, which refuses a
    new dataset on the same ``local`` with a remote ("Reused local directory"). Streaming's
    ``clean_stale_shared_memory`` unlinks prefixes from 0 up whatever they belong to: a job still reading its shards
    on the same node loses its memory and the next dataset takes its prefix. Here a prefix is junk only when its
    registration names one of ``locals_`` and no process this user can see maps or holds open any of its files
    (Linux's ``/proc``; without it nothing is unlinked); a file is unlinked only if it is still the file examined.
    A live process that merely looked the prefix up (plain Streaming datasets map every prefix they walk past until
    they exit; ``TeacherGuidedDataset`` lets them go once open) keeps it: then Streaming refuses the run, saying so.
    Every rank may call it: a name another rank unlinked first is skipped.
    """
    from streaming.base.constant import LOCALS, SHM_TO_CLEAN

    shm_dir = os.path.realpath(shm_dir)  # /dev/shm may be a link (/run/shm): /proc names the real path
    if not os.path.isdir("/proc/self/fd") or not os.path.isdir(shm_dir):
        return []
    ours = [os.path.abspath(local) for local in locals_]
    streaming_name = re.compile(r"(\d{6})_(?:%s)" % "|".join(map(re.escape, SHM_TO_CLEAN)))
    by_prefix: dict[str, dict[str, tuple[int, int]]] = {}
    for entry in os.scandir(shm_dir):
        match = streaming_name.fullmatch(entry.name)
        try:
            info = entry.stat(follow_symlinks=False) if match else None
        except FileNotFoundError:
            continue
        if info is not None and info.st_uid == os.geteuid():
            by_prefix.setdefault(match.group(1), {})[entry.name] = (info.st_dev, info.st_ino)
    ours_by_prefix = {prefix: files for prefix, files in by_prefix.items()
                      if _registers_one_of(os.path.join(shm_dir, f"{prefix}_{LOCALS}"), ours)}
    if not ours_by_prefix:
        return []
    held = _held_files(shm_dir)
    unlinked = []
    for prefix, files in sorted(ours_by_prefix.items()):
        if held & set(files.values()):
            continue
        for name, identity in sorted(files.items()):
            path = os.path.join(shm_dir, name)
            try:
                info = os.stat(path)
                if (info.st_dev, info.st_ino) == identity:
                    os.unlink(path)
                    unlinked.append(name)
            except FileNotFoundError:  # another rank's
                continue
    return unlinked


def _registers_one_of(locals_file: str, ours: list[str]) -> bool:
    """Whether a Streaming prefix's registration (its ``_locals`` memory: int32 size, then its local folders and
    prefix joined by NUL) names one of ``ours`` or a folder inside one."""
    try:
        with open(locals_file, "rb") as f:
            data = f.read(1 << 20)
    except (FileNotFoundError, PermissionError):
        return False
    size = int(np.frombuffer(data[:4], np.int32)[0]) if len(data) >= 4 else 0
    registered = data[4:size].decode("utf-8", errors="replace").split("\0")[:-1]
    return any(folder == local or folder.startswith(local + os.sep) for folder in registered for local in ours)


def _held_files(shm_dir: str) -> set[tuple[int, int]]:
    """(device, inode) of every file in ``shm_dir`` a process this user can inspect maps or has open (its 0600 files
    can be held by no other user's process but root's)."""
    held = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:  # address perms offset dev inode path
                    fields = line.split(maxsplit=5)
                    if len(fields) == 6 and fields[5].startswith(shm_dir + "/"):
                        major, minor = (int(part, 16) for part in fields[3].split(":"))
                        held.add((os.makedev(major, minor), int(fields[4])))
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # ended meanwhile, or another user's
        for descriptor in descriptors:
            try:
                info = os.stat(f"/proc/{pid}/fd/{descriptor}")
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
            held.add((info.st_dev, info.st_ino))
    return held


def read_index(folder: str | os.PathLike, source: str | None = None) -> dict:
    """A shard folder's ``index.json``, read through the one way in (``untrusted.read_json``: a regular file within
    the ``json_bytes`` cap) and checked by ``untrusted.check_index`` (names inside the folder, counts and sizes its
    bytes can hold, a ``SHARD_HASH`` hash for every file) before Streaming or vocagno allocates anything from it."""
    return check_index(read_json(INDEX_FILE, folder), source or os.path.join(folder, INDEX_FILE), SHARD_HASH)


def local_path(remote: str | None) -> str | None:
    """The folder a remote names on this machine (a plain path, ``file://``), else None (an object store)."""
    if remote is None:
        return None
    if remote.startswith("file://"):
        return remote[len("file://"):]
    return None if "://" in remote else remote


class CheckedStream(Stream):
    """Streaming's ``Stream`` handed only what vocagno checked (every work-around of Streaming's internals lives
    here, behind the version pin on mosaicml-streaming).

    - ``index.json`` is read by ``read_index`` (``check_index``) and the shard readers are built from that checked
      object: a remote's index is fetched to a name of this process's own, checked, then put in place, so Streaming
      never sees an index vocagno refused, and a shard name can't lead a download or a decompression out of
      ``local``.
    - Every shard file the index names is opened by ``untrusted.open_regular`` (no link, device or FIFO) and must
      have the size the index says: those already in ``local`` before Streaming counts them as present, a remote's
      on this machine before it is copied, each download once it is in.
    - A compressed shard is read within its size, checked against its hash, then decompressed by
      ``untrusted.decompress`` into exactly the raw size the index says (a small file that would expand to gigabytes
      is refused past it).
    - Every file put into ``local`` goes in below ``local/split`` through no link (``writing.write_inside``,
      ``move_inside``): a download lands in a private folder of its own, is checked there (size, MDS header, the
      hash of an uncompressed shard), then is moved into place; a compressed file is removed through no link either.
      A folder of ``local`` that is a link (a shared cache someone else wrote) can't lead a write or a removal out.
    - A sample whose bytes don't decode as its shard's columns say is refused naming the shard file and the sample
      (``_CheckedMDSReader``), whatever the decoder meets in crafted bytes."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._sizes: dict[str, int] = {}  # every file the checked index names -> its bytes
        self._hashes: dict[str, dict] = {}  # every file the checked index names -> its hashes

    def get_shards(self, world, allow_unsafe_types: bool) -> list:
        from streaming.base.constant import TICK
        from streaming.base.util import wait_for_file_to_exist

        folder = os.path.join(self.local, self.split)
        filename = os.path.join(folder, INDEX_FILE)
        if not os.path.lexists(filename):
            if world.is_local_leader:
                if not self.remote:
                    raise RuntimeError(f"No `remote` provided, but local file {filename} does not exist either")
                self._fetch_index(folder, filename)
            else:
                wait_for_file_to_exist(filename, TICK, self.download_timeout,
                                       f"Index file {os.path.join(self.remote or '', self.split, INDEX_FILE)} -> "
                                       f"{filename} took too long to download or failed to download: see the local "
                                       "leader's error")
        index = read_index(folder)
        self._sizes, self._hashes, self._samples, self._raw_of = {}, {}, {}, {}  # by basename; a zip's raw file
        shards = []
        for info in index["shards"]:
            raw = info["raw_data"]["basename"]
            self._sizes[raw], self._samples[raw] = info["raw_data"]["bytes"], info["samples"]
            self._hashes[raw] = info["raw_data"]["hashes"]
            if info.get("zip_data") is not None:
                self._sizes[info["zip_data"]["basename"]] = info["zip_data"]["bytes"]
                self._hashes[info["zip_data"]["basename"]] = info["zip_data"]["hashes"]
                self._raw_of[info["zip_data"]["basename"]] = raw
            shard = _CheckedMDSReader.from_json(self.local, self.split, info)  # check_index: MDS only
            shard.validate(allow_unsafe_types)
            shards.append(shard)
        return shards

    def _fetch_index(self, folder: str, filename: str) -> None:
        """The remote's ``index.json`` into ``filename``, checked first: fetched into a name of this process's own
        (read within its cap from a remote on this machine, downloaded from an object store), put in place once
        ``read_index`` passed it."""
        from streaming.base.util import retry

        os.makedirs(folder, exist_ok=True)
        source = os.path.join(self.remote, self.split, INDEX_FILE)
        on_machine = local_path(self.remote)
        if on_machine is not None:
            data = read_bytes(INDEX_FILE, folder=os.path.join(on_machine, self.split), cap_name="json_bytes")
            try:
                index = json.loads(data)
            except (ValueError, RecursionError) as error:
                raise UntrustedFile(f"{source}: refused: not JSON ({str(error).splitlines()[0][:120]})") from None
            check_index(index, source, SHARD_HASH)
            write_atomically(filename, data)
            return
        own = own_temporary(filename)
        try:
            retry(clean_up_fn=self._downloader.clean_up, num_attempts=self.download_retry)(
                lambda: self._downloader.download(source, str(own), self.download_timeout))()
            check_index(read_json(own.name, folder), source, SHARD_HASH)
            os.replace(own, filename)
        finally:
            if os.path.lexists(own):
                os.remove(own)

    def _check_file(self, folder: str, basename: str, path: str | None = None) -> None:
        """The shard file ``basename`` of the index, at ``path`` (else ``basename``) inside ``folder``: a regular file
        (reached through no link) of the size the index says; an MDS shard's header, the samples the index says
        (``untrusted.check_mds``)."""
        expected = self._sizes[basename]
        where = os.path.join(folder, path or basename)
        with open_regular(path or basename, None, folder, "shard_bytes") as f:  # its size compared below
            size = f.raw.size  # what fstat gave when it was opened
            if size != expected:
                raise UntrustedFile(f"{where}: refused: {size:,} bytes, its index says {expected:,}")
            if basename in self._samples:
                samples = self._samples[basename]
                check_mds(f.read(mds_header_bytes(samples)), samples, size, where)

    def set_up_local(self, shards: list, cache_usage_per_shard) -> None:
        """Streaming's, once every shard file the index names that stands in ``local`` is checked (``_check_file``):
        Streaming counts a file there as present and reads it as it is, through a link, at any size or header."""
        folder = os.path.join(self.local, self.split)
        for basename in self._sizes:
            if os.path.lexists(os.path.join(folder, basename)):
                self._check_file(folder, basename)
        super().set_up_local(shards, cache_usage_per_shard)

    def _check_hash(self, data: bytes, basename: str, where: str) -> None:
        """Streaming's check of a shard file against the hash its index gives (``validate_hash``), on ``data``."""
        from streaming.base.hashing import get_hash

        if not self.validate_hash:
            return
        hashes = self._hashes[basename]
        if self.validate_hash not in hashes:
            raise UntrustedFile(f"{where}: refused: its index gives no {self.validate_hash} hash "
                                f"({', '.join(sorted(hashes)) or 'none'})")
        if get_hash(self.validate_hash, data) != hashes[self.validate_hash]:
            raise ValueError(f"Checksum failure: {where}")

    def _present(self, basename: str) -> bool:
        """Whether the shard file ``basename`` is in ``local``: a regular file reached through no link. Anything else
        standing at its name, or a link on the way to it, is refused (``UntrustedFile``), not read or written
        through (Streaming's own test follows links)."""
        try:
            open_regular(basename, None, os.path.join(self.local, self.split), "shard_bytes").close()
        except FileNotFoundError:
            return False
        return True

    def _place(self, basename: str, write) -> None:
        """``write(folder)`` (``writing.write_inside`` or ``move_inside``) of the shard file ``basename`` into
        ``local/split``; a link on its way there is refused in one line naming it."""
        folder = os.path.join(self.local, self.split)
        try:
            write(folder)
        except NotADirectoryError:
            raise UntrustedFile(f"{os.path.join(folder, basename)}: refused: a folder on its way is a link or not a "
                                "folder: vocagno writes no shard through a link (its index.json names it)") from None

    def _remove(self, basename: str) -> None:
        """Remove the shard file ``basename`` of ``local/split``, its folders opened without following a link: where
        one is a link (or gone), nothing is removed, so no file the link leads to is."""
        *parents, name = basename.split("/")
        fd = os.open(os.path.join(self.local, self.split), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in parents:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = inner
            os.unlink(name, dir_fd=fd)
        except (FileNotFoundError, NotADirectoryError):  # removed by another rank, or a link (O_NOFOLLOW: ENOTDIR)
            pass
        except OSError as error:
            if error.errno != errno.ELOOP:
                raise
        finally:
            os.close(fd)

    def _prepare_shard_part(self, raw_info, zip_info=None, compression: str | None = None) -> int:
        """Streaming's, with every test, write and removal in ``local`` through no link: the raw file when it is
        present; else the compressed file (downloaded when missing) decompressed; else the raw file downloaded."""
        if self._present(raw_info.basename):
            if zip_info and not self.safe_keep_zip and self._present(zip_info.basename):
                self._remove(zip_info.basename)
                return -zip_info.bytes
            return 0
        if zip_info is None:
            self._download_file(raw_info.basename)  # its hash checked before it is placed
            return raw_info.bytes
        delta = raw_info.bytes
        if not self._present(zip_info.basename):
            self._download_file(zip_info.basename)
            delta += zip_info.bytes
        folder = os.path.join(self.local, self.split)
        self._decompress_shard_part(zip_info, os.path.join(folder, zip_info.basename),
                                    os.path.join(folder, raw_info.basename), compression)
        return delta - (0 if self.safe_keep_zip else zip_info.bytes)

    def _download_file(self, from_basename: str, to_basename: str | None = None) -> str:
        """The shard file ``from_basename`` from the remote into ``local/split``: copied (a remote on this machine,
        read as ``open_regular`` allows) or downloaded (Streaming's downloader, its retries and timeout) into a new
        private folder inside ``local/split``, checked there (``_check_file``; an uncompressed shard's hash), then
        moved into place through no link."""
        from streaming.base.util import retry

        if from_basename not in self._sizes or to_basename is not None:
            raise ValueError(f"{from_basename}: not a shard file of {self.local}'s checked index.json")
        folder = os.path.join(self.local, self.split)
        os.makedirs(folder, exist_ok=True)
        try:
            private = PrivateFolder(folder, ".download-")
        except PermissionError as error:
            raise UntrustedFile(f"{os.path.join(folder, from_basename)}: refused: {error}") from None
        with private:
            landed = str(private.path / "file")  # through its descriptor: the folder itself, whatever its name holds
            on_machine = local_path(self.remote)
            if on_machine is not None:  # a link to /dev/zero, a FIFO, a file larger than its index says: refused
                source = os.path.join(on_machine, self.split)
                self._check_file(source, from_basename)
                with (open_regular(from_basename, self._sizes[from_basename], source, "shard_bytes") as f,
                      open(os.open("file", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                   0o600, dir_fd=private.fd), "wb") as out):
                    shutil.copyfileobj(f, out)
            else:
                remote = None if self.remote is None else os.path.join(self.remote, self.split, from_basename)
                retry(clean_up_fn=self._downloader.clean_up, num_attempts=self.download_retry)(
                    lambda: self._downloader.download(remote, landed, self.download_timeout))()
            where = os.path.join(folder, from_basename)
            try:
                self._check_file(str(private.path), from_basename, "file")
            except UntrustedFile as error:  # named as the file it downloads
                raise UntrustedFile(str(error).replace(landed, where)) from None
            if from_basename not in self._raw_of:  # a compressed file's hash is checked when it is decompressed
                self._check_hash(read_bytes("file", self._sizes[from_basename], str(private.path), "shard_bytes"),
                                 from_basename, where)
            self._place(from_basename, lambda into: move_inside(landed, into, from_basename))
        return os.path.join(folder, from_basename)

    def _decompress_shard_part(self, zip_info, zip_filename: str, raw_filename: str, compression: str | None) -> None:
        data = read_bytes(zip_info.basename, zip_info.bytes, os.path.join(self.local, self.split), "shard_bytes")
        if len(data) != zip_info.bytes:
            raise UntrustedFile(f"{zip_filename}: refused: {len(data):,} bytes, its index says {zip_info.bytes:,}")
        self._check_hash(data, zip_info.basename, zip_filename)
        basename = self._raw_of[zip_info.basename]
        raw = decompress(compression, data, self._sizes[basename], zip_filename)
        del data
        check_mds(raw, self._samples[basename], len(raw), zip_filename)
        self._place(basename, lambda into: write_inside(into, basename, raw))
        if not self.safe_keep_zip:
            self._remove(zip_info.basename)


class _CheckedMDSReader(MDSReader):
    """Streaming's MDS shard reader, whose samples that don't decode as the shard's columns say are refused
    (``UntrustedFile``) naming the shard file and the sample: crafted bytes within a sound header make Streaming's
    decoder raise whatever it meets (IndexError, KeyError, ValueError, ...). A sample is read through the way in (a
    missing file still raises ``FileNotFoundError``: how Streaming knows to download it)."""

    def get_sample_data(self, idx: int) -> bytes:
        """Streaming's, through ``untrusted.open_regular`` (no link, device or FIFO: a file swapped after the shard was
        checked is checked again), its sample's offsets inside the file before a byte is read or allocated."""
        folder = os.path.join(self.dirname, self.split or "")
        where = os.path.join(folder, self.raw_data.basename)
        with open_regular(self.raw_data.basename, None, folder, "shard_bytes") as f:
            size = f.raw.size
            f.seek((1 + idx) * 4)
            pair = f.read(8)
            begin, end = (int(x) for x in np.frombuffer(pair.ljust(8, b"\0"), np.uint32))
            if len(pair) != 8 or not begin <= end <= size:
                raise UntrustedFile(f"{where}: refused: its sample {idx} lies outside the file (bytes {begin:,} to "
                                    f"{end:,} of {size:,})")
            f.seek(begin)
            data = f.read(end - begin)
        if not data:
            raise IndexError(f"Relative sample index {idx} is not present in the {self.raw_data.basename} file.")
        return data

    def get_item(self, idx: int) -> dict[str, Any]:
        data = self.get_sample_data(idx)
        try:
            with np.errstate(all="ignore"):  # crafted sizes overflow; what comes of them is refused below
                return self.decode_sample(data)
        except (LookupError, ValueError, TypeError, ArithmeticError) as error:  # IndexError, KeyError, ...
            where = os.path.join(self.dirname, self.split or "", self.raw_data.basename)
            raise UntrustedFile(f"{where}: refused: its sample {idx} does not decode as its columns say "
                                f"({reason(error)})") from None
