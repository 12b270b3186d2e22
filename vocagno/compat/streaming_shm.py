"""Streaming's shared memory, worked around: every use of its private prefix, memory and exit functions, behind the
exact pin on mosaicml-streaming (``vocagno.compat.streaming.STREAMING``, the version each was checked against).

Streaming names a dataset's shared memory by the lowest prefix it finds free, registering it in a ``_locals`` segment.

- ``registering_shared_memory``: a node's one-node jobs register one at a time, and its other ranks take their
  leader's prefix instead of looking for one of their own (``_leaders_shm_prefix`` replaces ``get_shm_prefix``, using
  ``prefix``'s private ``_check_self``, ``_check_and_find_retrying``, ``_pack_locals``, ``_unpack_locals`` and
  ``_get_path``). Upstream: mosaicml/streaming#884 (two processes opening datasets at once: ``FileExistsError:
  '/000002_locals'``) and mosaicml/streaming#901 (the ranks of a node disagree on the prefix).
- ``attaching_when_sized``: a rank attaching a segment another rank created but has not sized yet waits for its size
  (``memory.BuiltinSharedMemory`` replaced): no upstream issue for it ('cannot mmap an empty file'; the closest,
  mosaicml/streaming#901, is about the ``_locals`` segment's contents).
- ``collecting_shared_memory`` / ``release_shared_memory``: the segments a dataset opens are let go with it, not at
  the process's exit (``atexit.register`` replaced while a dataset opens): mosaicml/streaming#457 (a process opening
  many datasets runs out of descriptors).
- ``clean_leaked_shared_memory``: a killed run's segments unlinked, only those no process holds (it parses the
  ``_locals`` layout and the ``NNNNNN_name`` names ``_get_path`` makes): Streaming's ``clean_stale_shared_memory``
  unlinks every prefix, another running job's too (no upstream issue for that; a killed run's leftovers:
  mosaicml/streaming#781).

No public API of the pinned version serves any of them: ``get_shm_prefix`` still races, and a dataset's segments
still go to ``atexit`` with no way to pass ``SharedMemory``'s ``auto_cleanup``.
"""

from __future__ import annotations

import atexit
import fcntl
import itertools
import os
import re
import stat
import tempfile
import threading
import time
import warnings
from contextlib import contextmanager
from typing import Any, Callable

import numpy as np
import torch

from vocagno.compat.torch import default_store

__all__ = ["attaching_when_sized", "clean_leaked_shared_memory", "collecting_shared_memory",
           "registering_shared_memory", "release_shared_memory"]


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


def _looking_again(register: Callable[[], Any], retry: int) -> Any:
    """``register()`` (a search for a free prefix, then the creation of its ``_locals``), again while a job that takes
    no lock registers the prefix found after the search, at most ``retry`` more times (none when negative). A look
    that finds taken what the look before found fails: Streaming's search can land on a prefix whose ``_locals`` is
    held, and looking again won't help."""
    taken_before = None
    for attempt in range(1 + max(retry, 0)):
        try:
            return register()
        except FileExistsError as taken:
            if attempt >= retry or taken.filename == taken_before:
                raise
            taken_before = taken.filename


_registering = threading.local()  # .value: True in a thread inside registering_shared_memory


def _leaders_shm_prefix(streams_local: list[str], streams_remote: list, world, retry: int = 100) -> tuple[int, Any]:
    """Streaming's ``get_shm_prefix``, except that only each node's leader looks for a free prefix: the node's other
    ranks take the one it registered.

    Streaming has every rank look on its own, then the leader registers what it found: another job on the node that
    exits or registers between the leader's look and another rank's gives them different prefixes, and that rank
    fails ('shared memory prefix=N was not registered by local leader', or '... does not match local leader'). A
    leader that finds its prefix taken when it registers (a job that doesn't take the lock) looks again, until a look
    finds the prefix the one before found (Streaming's search can land on a prefix whose ``_locals`` is held: looking
    again won't help); one that can't register fails every rank of the job, not only itself, instead of leaving them
    waiting at a barrier.
    Without a process group (one process, or ranks with none), Streaming's own search runs, looked again in the same
    way.

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
        if dist.is_available() and dist.is_initialized():  # its barriers: every rank calls it once
            return prefix.get_shm_prefix(streams_local, streams_remote, world, retry)
        # No barrier in it: its leader may look again.
        return _looking_again(lambda: prefix.get_shm_prefix(streams_local, streams_remote, world, retry), retry)
    prefix._check_self(streams_local)
    store = default_store()
    key = f"vocagno/shm_prefix/{next(_prefix_exchanges)}/node"
    shm = error = None
    if world.is_local_leader:
        try:
            def register() -> tuple[int, bytes, Any]:
                found = max(prefix._check_and_find_retrying(streams_local, streams_remote, name, retry)
                            for name in SHM_TO_CLEAN)
                packed = prefix._pack_locals(streams_local, found)
                return found, packed, SharedMemory(prefix._get_path(found, LOCALS), True, len(packed))

            found, packed, shm = _looking_again(register, retry)
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
