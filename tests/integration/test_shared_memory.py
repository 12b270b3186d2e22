"""``vocagno.compat.streaming_shm.clean_leaked_shared_memory`` on a shared-memory folder of its own: which Streaming
prefixes it takes for junk (registered on this run's locals, held by no process, still the file it examined) and which
it leaves."""

import ctypes
import mmap
import os
import shutil
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pytest
from streaming.base.shared.prefix import _pack_locals

from vocagno.data import dataset as data
from vocagno.compat import streaming_shm
from vocagno.compat.streaming_shm import clean_leaked_shared_memory


@contextmanager
def mapped_only(path: Path):
    """``path`` mapped into this process with no descriptor left open (Python's mmap keeps one: libc's doesn't), as
    only ``/proc/PID/maps`` shows it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(path, os.O_RDONLY)
    address = libc.mmap(None, 64, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    os.close(fd)
    assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
    try:
        yield
    finally:
        libc.munmap(address, 64)


def leave(shm, prefix: int, locals_: list[str], names=("barrier", "epoch_data")) -> list[str]:
    """What a killed Streaming dataset leaves: its registration (``_locals``) and some of its memory."""
    (shm / f"{prefix:06}_locals").write_bytes(_pack_locals(locals_, prefix))
    for name in names:
        (shm / f"{prefix:06}_{name}").write_bytes(b"\0" * 64)
    return sorted(f"{prefix:06}_{name}" for name in ("locals", *names))


@pytest.fixture
def shm():
    """A folder of its own on /dev/shm's file system (tmpfs: a freed inode number is not given to the next file)."""
    folder = Path(tempfile.mkdtemp(prefix="vocagno-test-", dir="/dev/shm"))
    yield folder
    shutil.rmtree(folder)


def test_only_junk_registered_on_this_runs_locals_is_unlinked(shm, tmp_path):
    ours = tmp_path / "cache"
    junk = leave(shm, 3, [str(ours / "train")])  # a stream's folder inside this run's local
    others = leave(shm, 4, [str(tmp_path / "cache-of-another-job")])
    prefix_of_ours = leave(shm, 5, [str(tmp_path / "cache2")])  # a name that merely begins like ours
    (shm / "000006_not_streaming").write_bytes(b"x")
    (shm / "psm_123").write_bytes(b"x")
    (shm / "000007_locals").write_bytes(b"\x02")  # too short to register anything
    assert clean_leaked_shared_memory([str(ours)], shm_dir=str(shm)) == junk
    left = sorted(os.listdir(shm))
    assert left == sorted([*others, *prefix_of_ours, "000006_not_streaming", "psm_123", "000007_locals"])


def test_a_prefix_a_process_maps_or_holds_open_is_kept_whole(shm, tmp_path):
    ours = str(tmp_path / "cache")
    mapped, opened, junk = leave(shm, 0, [ours]), leave(shm, 1, [ours]), leave(shm, 2, [ours])
    with mapped_only(shm / "000000_epoch_data"), open(shm / "000001_barrier", "rb"):
        assert clean_leaked_shared_memory([ours], shm_dir=str(shm)) == junk
        assert sorted(os.listdir(shm)) == sorted([*mapped, *opened])


def test_shared_memory_reached_through_a_link_is_found_held_by_its_real_path(shm, tmp_path):
    ours = str(tmp_path / "cache")
    files = leave(shm, 0, [ours])
    link = tmp_path / "run-shm"
    link.symlink_to(shm)
    with mapped_only(link / "000000_barrier"):  # /proc/PID/maps names the real path
        assert clean_leaked_shared_memory([ours], shm_dir=str(link)) == []
        assert sorted(os.listdir(shm)) == files
    assert clean_leaked_shared_memory([ours], shm_dir=str(link)) == files


def test_a_name_taken_again_after_it_was_examined_is_not_unlinked(shm, tmp_path, monkeypatch):
    """Between the scan and the unlink another job's dataset takes the freed name: its new file stays."""
    ours = str(tmp_path / "cache")
    files = leave(shm, 0, [ours])
    examine = streaming_shm._held_files

    def meanwhile(shm_dir):
        (shm / "000000_barrier").unlink()
        (shm / "000000_barrier").write_bytes(b"new")
        return examine(shm_dir)

    monkeypatch.setattr(streaming_shm, "_held_files", meanwhile)
    assert clean_leaked_shared_memory([ours], shm_dir=str(shm)) == [f for f in files if f != "000000_barrier"]
    assert os.listdir(shm) == ["000000_barrier"] and (shm / "000000_barrier").read_bytes() == b"new"


def test_another_users_shared_memory_is_never_unlinked(shm, tmp_path, monkeypatch):
    ours = str(tmp_path / "cache")
    files = leave(shm, 0, [ours])
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(shm).st_uid + 1)  # the files are this user's: seen as another's
    assert clean_leaked_shared_memory([ours], shm_dir=str(shm)) == []
    assert sorted(os.listdir(shm)) == files


def test_without_proc_or_the_folder_nothing_is_unlinked(shm, tmp_path, monkeypatch):
    ours = str(tmp_path / "cache")
    files = leave(shm, 0, [ours])
    assert clean_leaked_shared_memory([ours], shm_dir=str(tmp_path / "no-such-folder")) == []
    real_isdir = os.path.isdir
    monkeypatch.setattr(os.path, "isdir", lambda path: path != "/proc/self/fd" and real_isdir(path))
    assert clean_leaked_shared_memory([ours], shm_dir=str(shm)) == []
    assert sorted(os.listdir(shm)) == files


def test_a_registration_lock_held_too_long_or_not_a_file_of_ours_is_waited_for_at_most_so_long(tmp_path, monkeypatch):
    """A one-node job's leader waits for another job's registration, but never forever: a holder stuck (or hostile)
    past REGISTRATION_WAIT_SECONDS, a FIFO or a link in the lock's place, and the dataset opens as Streaming's alone."""
    import fcntl
    import time
    import warnings

    monkeypatch.setattr(streaming_shm, "REGISTRATION_WAIT_SECONDS", 0.5)
    path = tmp_path / "registration.lock"
    monkeypatch.setattr(streaming_shm, "registration_lock_path", lambda: str(path))
    with open(path, "w") as other_job:
        fcntl.flock(other_job, fcntl.LOCK_EX)  # another open file: another holder, as another process's
        began = time.monotonic()
        with (pytest.warns(UserWarning, match="opening the dataset without it"),
              streaming_shm.registering_shared_memory()):
            assert time.monotonic() - began >= 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with streaming_shm.registering_shared_memory():  # let go: taken at once
            with open(path) as other_job:
                with pytest.raises(BlockingIOError):
                    fcntl.flock(other_job, fcntl.LOCK_EX | fcntl.LOCK_NB)
        path.unlink()
        os.mkfifo(path)  # opening a FIFO to read would wait for a writer
        began = time.monotonic()
        with streaming_shm.registering_shared_memory():
            assert time.monotonic() - began < 0.5
        path.unlink()
        path.symlink_to(tmp_path / "elsewhere")
        with streaming_shm.registering_shared_memory():
            assert not (tmp_path / "elsewhere").exists()


def test_the_leader_of_a_job_over_several_nodes_never_takes_the_registration_lock(tmp_path, monkeypatch):
    """It would hold it through Streaming's barriers, which wait for its other nodes, whose leaders may wait for the
    locks of another job's leaders waiting at their own barriers: a cycle. It registers as Streaming alone would."""
    import fcntl
    import time

    monkeypatch.setattr(streaming_shm, "REGISTRATION_WAIT_SECONDS", 1)
    path = tmp_path / "registration.lock"
    monkeypatch.setattr(streaming_shm, "registration_lock_path", lambda: str(path))
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)
    with open(path, "w") as other_job:
        fcntl.flock(other_job, fcntl.LOCK_EX)
        began = time.monotonic()
        with streaming_shm.registering_shared_memory():
            assert time.monotonic() - began < 0.5
        monkeypatch.setenv("WORLD_SIZE", "2")  # the same leader in a job of one node waits
        with pytest.warns(UserWarning, match="without it"), streaming_shm.registering_shared_memory():
            assert time.monotonic() - began >= 1


def shared_memory_held() -> Counter:
    """How many descriptors this process holds open on each ``/dev/shm`` file."""
    held = Counter()
    for descriptor in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{descriptor}")
        except OSError:  # the listing's own descriptor, closed meanwhile
            continue
        if target.startswith("/dev/shm/"):
            held[os.path.basename(target)] += 1
    return held


def _converted(tmp_path: Path) -> Path:
    """Eight shipped documents converted into ``tmp_path / "shards"`` (TinyLlama's and Qwen2.5's tokenizers)."""
    from vocagno.conversion.convert import main as convert_main
    from helpers import first_documents

    assert convert_main(["--input", str(first_documents(tmp_path, 8)), "--student-tokenizer", "llama2",
                         "--teacher-tokenizer", "qwen2.5", "--seq-len", "64",
                         "--out-root", str(tmp_path / "shards")]) == 0
    return tmp_path / "shards"


def test_a_dataset_holds_only_its_own_shared_memory_and_lets_it_go_with_it(tmp_path, tokenizers):
    # Streaming keeps every shared memory it opens until the process exits: the prefixes its lookup walks past
    # (every other dataset's on the machine, six files each) and its own. A process opening datasets one after the
    # other (an evaluation loop, a notebook, these tests) ran out of descriptors, and a long job pinned what dead jobs
    # left, which clean_leaked_shared_memory then takes for held.
    _converted(tmp_path)
    before = shared_memory_held()
    first = data.TeacherGuidedDataset(local=str(tmp_path / "shards"), batch_size=1)
    own = shared_memory_held() - before
    assert own and {name[:6] for name in own} == {f"{first._shm_prefix_int:06}"}
    second = data.TeacherGuidedDataset(local=str(tmp_path / "shards"), batch_size=1)
    assert second[0]["text"] == first[0]["text"]
    seconds = shared_memory_held() - before - own  # the first's prefix, walked past, is not held again
    assert {name[:6] for name in seconds} == {f"{second._shm_prefix_int:06}"}
    assert sorted(seconds.values()) == sorted(own.values())
    del second
    assert shared_memory_held() - before == own
    assert not set(os.listdir("/dev/shm")) & set(seconds), "the second's memory is unlinked with it"
    del first
    assert shared_memory_held() == before


def test_a_prefix_another_job_registers_after_the_search_is_looked_for_again(tmp_path, monkeypatch, tokenizers):
    """A job that takes no registration lock (Streaming's own, or one past the lock's wait) registers the prefix this
    process found, after its search and before its registration (two test workers opening datasets at once): the
    dataset looks again and takes a free one, instead of failing on ``FileExistsError: '/000477_locals'``."""
    from multiprocessing import shared_memory

    from streaming.base.constant import LOCALS
    from streaming.base.shared import prefix

    _converted(tmp_path)
    pack, taken = prefix._pack_locals, []

    def another_job_first(locals_, found):
        if not taken:  # the other job's registration, on the prefix found here
            packed = pack([str(tmp_path / "another-job")], found)
            other = shared_memory.SharedMemory(prefix._get_path(found, LOCALS), create=True, size=len(packed))
            other.buf[:len(packed)] = packed
            taken.append((found, other))
        return pack(locals_, found)

    monkeypatch.setattr(prefix, "_pack_locals", another_job_first)
    try:
        dataset = data.TeacherGuidedDataset(local=str(tmp_path / "shards"), batch_size=1)
        assert taken and dataset._shm_prefix_int != taken[0][0]
        assert dataset[0]["text"]
        del dataset
    finally:
        for _, other in taken:
            other.close()
            other.unlink()


@pytest.mark.parametrize("group", ["no process group", "a one-rank gloo group"])
def test_a_prefix_found_taken_again_fails_on_the_second_look(tmp_path, monkeypatch, tokenizers, group):
    """Streaming's search can land on a prefix whose ``_locals`` another dataset holds (a leftover of a killed run
    below it in another name): every look finds that prefix again. The second look that finds the prefix it found
    taken fails as Streaming does, instead of looking 100 more times, each holding the segments it walked past."""
    import torch.distributed as dist
    from multiprocessing import shared_memory

    from streaming.base.constant import LOCALS, SHM_TO_CLEAN
    from streaming.base.shared import prefix

    _converted(tmp_path)
    held = shared_memory.SharedMemory(create=True, size=8)  # a free name of this machine's, whatever else runs
    searches = []
    if group == "no process group":
        def search(*args):
            searches.append(args)
            raise FileExistsError(17, "File exists", f"/{held.name}")

        monkeypatch.setattr(prefix, "get_shm_prefix", search)
        # An in-process Composer run (this worker's earlier tests) leaves its one-rank default group behind.
        monkeypatch.setattr(dist, "is_initialized", lambda: False)
    else:
        free = next(n for n in range(10**5, 10**6) if not os.path.exists(f"/dev/shm/{n:06}_{LOCALS}"))
        taken = shared_memory.SharedMemory(prefix._get_path(free, LOCALS), create=True, size=8)
        monkeypatch.setattr(prefix, "_check_and_find_retrying", lambda *args: searches.append(args) or free)
        made_here = not dist.is_initialized()  # else a one-rank group an in-process Composer run left
        if made_here:
            dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
        assert dist.get_world_size() == 1
    try:
        with pytest.raises(FileExistsError):
            data.TeacherGuidedDataset(local=str(tmp_path / "shards"), batch_size=1)
        # Two looks: Streaming's whole search each, or the leader's search of each name Streaming cleans.
        assert len(searches) == 2 * (1 if group == "no process group" else len(SHM_TO_CLEAN)), len(searches)
    finally:
        held.close()
        held.unlink()
        if group != "no process group":
            if made_here:
                dist.destroy_process_group()
            taken.close()
            taken.unlink()


def test_an_iteration_dropped_before_its_epoch_ends_stops_its_threads_and_no_other(tmp_path):
    """Streaming reads ahead and waits for shards in two threads an epoch, which poll every 7 ms until the epoch ends
    or the next begins. An iteration dropped before its end (a run stopping at max_duration, a report reading a few
    batches) left them polling until the process exited: 78 such threads took a fifth of a core in a pytest worker
    after three test files. Dropped, they stop; a later epoch's, begun before, runs to its end."""
    _converted(tmp_path)
    dataset = data.TeacherGuidedDataset(local=str(tmp_path / "shards"), batch_size=1)
    assert dataset.size > dataset.predownload + 2  # more than its threads read ahead: they are still at it
    dropped = iter(dataset)
    next(dropped)
    first = dataset._iterator
    del dropped
    _wait_for(lambda: first._num_exited == 2, "the dropped iteration's threads to stop")
    before = iter(dataset)
    next(before)
    later = iter(dataset)
    next(later)  # a new epoch: Streaming ends the one before
    second = dataset._iterator
    del before
    time.sleep(0.2)
    assert second._num_exited == 0, "dropping an older iteration stopped a later one's threads"
    assert len(list(later)) == dataset.size - 1


def _wait_for(condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.01)


def test_shared_memory_another_thread_opens_meanwhile_is_left_alone():
    # Streaming's resumption state (a dataset's load_state_dict) made in another thread while a dataset is built is
    # that thread's: taken for the build's and released, a resumed run would start over.
    import threading

    from streaming.base.shared.memory import SharedMemory

    name = f"vocagno_test_{os.getpid()}_resume"
    built, made = threading.Event(), []

    def other_thread():
        built.wait(30)
        made.append(SharedMemory(name, create=True, size=64))
        made[0].buf[:5] = b"state"

    thread = threading.Thread(target=other_thread)
    thread.start()
    collected = []
    with streaming_shm.collecting_shared_memory(collected):
        built.set()
        thread.join(30)
    try:
        assert made and not collected
        streaming_shm.release_shared_memory(collected, os.getpid())
        assert bytes(made[0].buf[:5]) == b"state" and os.path.exists(f"/dev/shm/{name}")  # still open, still there
    finally:
        made[0].cleanup()


def test_a_shared_memory_created_and_never_sized_is_named_after_the_wait(monkeypatch):
    """A rank that created a name and died before sizing it: the others wait for its size so long, then say so."""
    import _posixshmem

    from streaming.base.shared.memory import SharedMemory

    monkeypatch.setattr(streaming_shm, "SHARED_MEMORY_SIZE_WAIT_SECONDS", 0.2)
    name = f"vocagno_test_{os.getpid()}_never_sized"
    os.close(_posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600))
    try:
        began = time.monotonic()
        with pytest.raises(RuntimeError, match=f"shared memory '{name}' was created but not sized within 0.2 s"), \
                streaming_shm.attaching_when_sized():
            SharedMemory(name, size=64)
        assert time.monotonic() - began >= 0.2
    finally:
        _posixshmem.shm_unlink("/" + name)


def _register(name: str, locals_: list[str], prefix: int) -> bool:
    """Another job's registration of ``locals_`` at ``prefix`` in the machine's /dev/shm, unless a job holds it."""
    try:
        with open(f"/dev/shm/{name}", "xb") as registration:
            registration.write(_pack_locals(locals_, prefix))
        return True
    except FileExistsError:
        return False


def _registered(local: str) -> list[str]:
    """The registrations of ``local`` in the machine's /dev/shm (by name, another job's of its own folders may take a
    prefix as soon as it is let go)."""
    from streaming.base.shared.prefix import _unpack_locals

    found = []
    for entry in os.scandir("/dev/shm"):
        try:
            if entry.name.endswith("_locals") and os.path.abspath(local) in _unpack_locals(
                    Path(entry.path).read_bytes())[0]:
                found.append(entry.name)
        except (OSError, ValueError):  # let go meanwhile, or not a registration
            continue
    return found


def _open_the_dataset_as_one_rank(rank: int, world: int, folder: str, shards: str, meanwhile: str, other_job: str):
    """One rank of a job opening a dataset on ``shards``, while:
    - "another job exits": the job registered at ``other_job`` lets it go after the leader looked for a free prefix,
      before the other rank would look;
    - "another job registers": a job without the lock takes the prefix the leader found before the leader registers;
    - "the leader can't register": the leader's look fails (Streaming's "Reused local directory": another job reads
      this local from another remote);
    - "node 1's leader can't register": the same, on the second node of a job of two nodes of one rank each;
    - "nothing, on two nodes": that job, with nothing in the way;
    - "the leader sizes its memory slowly": the leader creates each name half a second before it sizes it, the other
      rank comes 0.2 s after it, as on a loaded node; both then read their resumption state and load it.
    On two nodes each node has its shards in a folder of its own (``shards`` and ``shards-node1``), as each node's
    own ``local`` cache. Writes what the rank got (its prefix and first sample, or its error), and a line for each of
    its looks for a free prefix (one per Streaming name, ``SHM_TO_CLEAN``), if it looked."""
    from datetime import timedelta

    import torch.distributed as dist
    from streaming.base.constant import SHM_TO_CLEAN
    from streaming.base.shared import prefix

    per_node = 1 if "node" in meanwhile else world
    shards += "-node1" if rank // per_node == 1 else ""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank % per_node), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(per_node))
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world,
                            timeout=timedelta(seconds=180))  # the leader may wait 60 s for another job's lock
    looked = Path(folder) / "the leader looked"
    look = prefix._check_and_find_retrying
    failing = 1 if meanwhile.startswith("node 1") else 0

    def look_and_say(*args, **kwargs):
        if meanwhile.endswith("can't register") and rank == failing:
            raise ValueError("Reused local directory (another job reads it from another remote)")
        found = look(*args, **kwargs)
        with open(Path(folder) / f"rank{rank} looked", "a") as looks:
            looks.write(f"{found}\n")
        answers = [int(line) for line in (Path(folder) / f"rank{rank} looked").read_text().split()]
        if meanwhile == "another job registers" and len(answers) == len(SHM_TO_CLEAN):  # the prefix the leader chose
            chosen = max(answers)
            (Path(folder) / "found").write_text(str(chosen))
            if _register(f"{chosen:06}_locals", [f"{folder}/a-third-job"], chosen):
                (Path(folder) / "taken").write_text(f"/dev/shm/{chosen:06}_locals")
        looked.touch()
        return found

    prefix._check_and_find_retrying = look_and_say
    if meanwhile == "the leader sizes its memory slowly":
        _create_shared_memory_late(0.5 if rank == 0 else 0.0, 0.2 if rank == 1 else 0.0)
    try:
        if rank == 1 and meanwhile == "another job exits":
            for _ in range(1700):  # the leader may wait 60 s for another job's registration lock
                if looked.exists():
                    break
                time.sleep(0.1)
            os.unlink(f"/dev/shm/{other_job}")
        try:
            dataset = data.TeacherGuidedDataset(local=shards, batch_size=1)
            if meanwhile == "the leader sizes its memory slowly":
                state = dataset.state_dict(0, False)
                # As in a run, no rank reads the resumption state while another writes it (Composer saves it after
                # steps every rank took): a rank reading it then found the memory named but not yet sized.
                dist.barrier()
                dataset.load_state_dict(state)
            got = f"{dataset._shm_prefix_int} {dataset[0]['text'][:40]}"
        except Exception as error:
            got = f"{type(error).__name__}: {error}"
            if (Path(folder) / f"rank{rank} looked").exists():  # what it registered is let go with the dataset
                got += f" (registrations of the local left: {_registered(shards)})"
        (Path(folder) / f"rank{rank}").write_text(got)
    finally:
        dist.destroy_process_group()


def _create_shared_memory_late(sized_after: float, created_after: float):
    """This process's new shared memories (Python's, under Streaming's and through ``multiprocessing``) created
    ``created_after`` seconds late, and sized ``sized_after`` seconds after their name: a creator descheduled
    between the two steps."""
    import _posixshmem
    from multiprocessing import resource_tracker, shared_memory

    from streaming.base.shared import memory

    builtin = shared_memory.SharedMemory

    def late(name=None, create=False, size=0):
        if not create:
            return builtin(name, create, size)
        time.sleep(created_after)
        descriptor = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        try:
            resource_tracker.register("/" + name, "shared_memory")  # as Python's own creation does
            time.sleep(sized_after)
            os.ftruncate(descriptor, size)
        finally:
            os.close(descriptor)
        return builtin(name, False, size)

    shared_memory.SharedMemory = memory.BuiltinSharedMemory = late


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("meanwhile", ["another job exits", "another job registers", "the leader can't register",
                                       "node 1's leader can't register", "nothing, on two nodes",
                                       "the leader sizes its memory slowly"])
def test_a_nodes_ranks_take_their_leaders_prefix_or_its_failure_whatever_other_jobs_do_meanwhile(tmp_path, meanwhile):
    """Streaming has every rank look for the lowest free prefix on its own: another job on the node that exits (or
    registers) between the leader's look and another rank's gave them different prefixes, and that rank failed
    ('shared memory prefix=0 was not registered by local leader'; a CI run of test_distributed died of it). Here only
    the leader looks. A job without the registration lock taking the prefix the leader found made the leader fail
    (FileExistsError): it looks again. A leader that can't register fails every rank of the job, its node's and the
    other nodes', instead of leaving them waiting; what the other nodes registered is let go. Nodes with their shards in
    folders of their own (each node's own local cache) agree as well."""
    import torch
    from streaming.base.constant import LOCALS, SHM_TO_CLEAN
    from streaming.base.shared import prefix

    _converted(tmp_path)
    shutil.copytree(tmp_path / "shards", tmp_path / "shards-node1")
    other_job = None
    while meanwhile == "another job exits" and other_job is None:  # the lowest free prefix, unless a job takes it
        walked_past = []  # the registrations the look maps, let go here rather than at the worker's exit
        with streaming_shm.collecting_shared_memory(walked_past):
            free = prefix._check_and_find([str(tmp_path / "another-job")], [None], LOCALS)
        streaming_shm.release_shared_memory(walked_past, os.getpid())
        if _register(f"{free:06}_{LOCALS}", [str(tmp_path / "another-job")], free):
            other_job = f"{free:06}_{LOCALS}"
    try:
        torch.multiprocessing.start_processes(
            _open_the_dataset_as_one_rank, nprocs=2, join=True, start_method="forkserver",
            args=(2, str(tmp_path), str(tmp_path / "shards"), meanwhile, other_job))
    finally:
        if other_job is not None:
            Path(f"/dev/shm/{other_job}").unlink(missing_ok=True)
        if (tmp_path / "taken").exists():
            Path((tmp_path / "taken").read_text()).unlink(missing_ok=True)
    first, second = ((tmp_path / f"rank{rank}").read_text() for rank in range(2))
    expected = data.TeacherGuidedDataset(local=str(tmp_path / "shards"), batch_size=1)[0]["text"][:40]
    if meanwhile.startswith("node 1"):  # two nodes: each leader looks
        assert (tmp_path / "rank0 looked").exists()
        assert second == "ValueError: Reused local directory (another job reads it from another remote)", second
        assert first == ("RuntimeError: node 1's leader could not register its dataset's shared memory: "
                         f"{second} (registrations of the local left: [])")
        return
    if meanwhile == "the leader sizes its memory slowly":
        assert not (tmp_path / "rank1 looked").exists()
        assert first == second and first.split(maxsplit=1)[1] == expected, (first, second)
        return
    if meanwhile == "nothing, on two nodes":
        assert (tmp_path / "rank0 looked").exists() and (tmp_path / "rank1 looked").exists()
        assert first.split(maxsplit=1)[1] == second.split(maxsplit=1)[1] == expected, (first, second)
        return
    assert not (tmp_path / "rank1 looked").exists(), "the leader's prefix is taken, not looked for again"
    if meanwhile == "the leader can't register":
        assert first == "ValueError: Reused local directory (another job reads it from another remote)", first
        assert second == f"RuntimeError: node 0's leader could not register its dataset's shared memory: {first}"
        return
    assert second == first, (first, second)
    taken = free if meanwhile == "another job exits" else int((tmp_path / "found").read_text())
    assert int(first.split()[0]) != taken, "the other job held it when the leader looked, or took it after"
    if meanwhile == "another job registers":  # found taken when it registered: looked again
        assert len((tmp_path / "rank0 looked").read_text().split()) == 2 * len(SHM_TO_CLEAN)
    assert first.split(maxsplit=1)[1] == expected


def _open_the_dataset_in_an_attempt(rank: int, folder: str, shards: str, port: int, attempt: int, restart: str):
    """One of two ranks of a job under torchrun opening a dataset: its store is the agent's, which outlives a failed
    attempt and what it wrote, and ``TORCHELASTIC_RESTART_COUNT`` is each node's agent's count of its failures. In
    attempt 0 node 0's leader can't register; in attempt 1 nothing is in the way, node 0's leader only looks slowly
    (rank 1, a follower or node 1's leader, asks for its answer first). Writes what the rank got."""
    from datetime import timedelta

    import torch.distributed as dist
    from streaming.base.shared import prefix

    two_nodes = restart == "on two nodes, a rank of one failed"
    counts = {"after a failure": (1, 1), "as a node joined": (0, 0), "on two nodes, a rank of one failed": (1, 0)}
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(0 if two_nodes else rank), WORLD_SIZE="2",
                      LOCAL_WORLD_SIZE="1" if two_nodes else "2",
                      TORCHELASTIC_RESTART_COUNT=str(counts[restart][rank] if attempt else 0))
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous{attempt}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=90))
    agent = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=90))
    dist.distributed_c10d._get_default_store = lambda: agent
    look = prefix._check_and_find_retrying

    def failing_or_slow_look(*args, **kwargs):
        if rank == 0 and attempt == 0:
            raise ValueError("Reused local directory (attempt 0)")
        if rank == 0:
            time.sleep(0.5)
        return look(*args, **kwargs)

    prefix._check_and_find_retrying = failing_or_slow_look
    try:
        try:
            dataset = data.TeacherGuidedDataset(local=shards + ("-node1" if two_nodes and rank else ""),
                                                batch_size=1)
            got = f"{dataset._shm_prefix_int} {dataset[0]['text'][:40]}"
        except Exception as error:
            got = f"{type(error).__name__}: {error}"
        (Path(folder) / f"rank{rank} attempt{attempt}").write_text(got)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("restart", ["after a failure", "as a node joined", "on two nodes, a rank of one failed"])
def test_a_job_restarted_by_torchrun_takes_its_leaders_answers_not_the_failed_attempts(tmp_path, restart):
    """torchrun's store outlives the workers it restarts: the ranks of the next attempt, counting their datasets from
    0 again, read the failed attempt's answer (its leader's error, or a prefix it registered and let go) before their
    own leader's, and failed with nothing in the way. torchrun's restart count tells no attempt from the last: a
    restart as a node joins does not count, and each node's agent counts only its own failures."""
    import torch

    _converted(tmp_path)
    shutil.copytree(tmp_path / "shards", tmp_path / "shards-node1")
    agent = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    for attempt in range(2):
        torch.multiprocessing.start_processes(
            _open_the_dataset_in_an_attempt, nprocs=2, join=True, start_method="forkserver",
            args=(str(tmp_path), str(tmp_path / "shards"), agent.port, attempt, restart))
    failed = [(tmp_path / f"rank{rank} attempt0").read_text() for rank in range(2)]
    assert failed[0] == "ValueError: Reused local directory (attempt 0)"
    assert failed[1].startswith(f"RuntimeError: node 0's leader could not register its dataset's shared memory: "
                                f"{failed[0]}"), failed[1]
    first, second = ((tmp_path / f"rank{rank} attempt1").read_text() for rank in range(2))
    expected = data.TeacherGuidedDataset(local=str(tmp_path / "shards"), batch_size=1)[0]["text"][:40]
    assert first.split(maxsplit=1)[1] == second.split(maxsplit=1)[1] == expected, (first, second)
