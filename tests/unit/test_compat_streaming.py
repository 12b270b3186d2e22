"""Streaming's door (``vocagno.compat.streaming`` and ``streaming_shm``) against the installed Streaming: its version is
the one the door was checked against, and every private name a work-around uses is there with the signature, the
attributes and the layout it relies on. A new Streaming fails here first, naming what changed."""

import inspect
import os
from importlib.metadata import version
from multiprocessing import shared_memory

import pytest
from streaming import Stream, StreamingDataset
from streaming.base import dataset as streaming_dataset
from streaming.base.constant import LOCALS, SHM_TO_CLEAN, TICK
from streaming.base.format.base.reader import Reader
from streaming.base.format.mds.reader import MDSReader
from streaming.base.shared import SharedMemory, memory, prefix

from vocagno.compat import streaming_shm
from vocagno.compat.streaming import STREAMING, CheckedStream, _CheckedMDSReader


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def calls(function, *names: str) -> None:
    """``function`` looks ``names`` up when it runs (a module's global, an attribute): what replacing them or
    overriding them relies on."""
    used = set(function.__code__.co_names)
    assert set(names) <= used, f"{function.__qualname__} no longer uses {sorted(set(names) - used)}"


def test_the_installed_streaming_is_the_one_the_door_was_checked_against():
    assert version("mosaicml-streaming") == STREAMING, (
        f"mosaicml-streaming {version('mosaicml-streaming')} is installed; vocagno/compat/streaming.py and "
        f"streaming_shm.py were checked against {STREAMING}: check each work-around on it, then move the pin")


def test_the_prefix_functions_the_registration_uses_keep_their_signatures():
    assert parameters(prefix.get_shm_prefix) == ["streams_local", "streams_remote", "world", "retry"]
    assert parameters(streaming_shm._leaders_shm_prefix) == parameters(prefix.get_shm_prefix)
    assert parameters(prefix._check_self) == ["streams_local"]
    assert parameters(prefix._check_and_find_retrying) == ["streams_local", "streams_remote", "shm_name", "retry"]
    assert parameters(prefix._pack_locals) == ["dirnames", "prefix_int"]
    assert parameters(prefix._unpack_locals) == ["data"]
    assert parameters(prefix._get_path) == ["prefix_int", "name"]
    # The dataset looks get_shm_prefix up in its module when it opens: registering_shared_memory replaces it there.
    assert streaming_dataset.get_shm_prefix is prefix.get_shm_prefix
    calls(StreamingDataset.__init__, "get_shm_prefix")
    assert LOCALS in SHM_TO_CLEAN and isinstance(TICK, float)


def test_the_world_the_registration_reads_has_the_fields_it_uses():
    from streaming.base.world import World

    world = World.detect()
    for name in ("is_local_leader", "num_nodes", "num_ranks", "node"):
        assert hasattr(world, name), name


def test_the_locals_layout_and_names_the_cleaner_parses_are_streamings(tmp_path):
    """``clean_leaked_shared_memory`` reads a prefix's registration and names without Streaming: they must be what
    Streaming writes (an int32 size, the local folders and the prefix joined by NUL; ``NNNNNN_name``)."""
    packed = prefix._pack_locals(["/data/a", "/data/b"], 7)
    assert prefix._unpack_locals(packed) == (["/data/a", "/data/b"], 7)
    (tmp_path / "locals").write_bytes(packed)
    assert streaming_shm._registers_one_of(str(tmp_path / "locals"), ["/data/b"])
    assert streaming_shm._registers_one_of(str(tmp_path / "locals"), ["/data"])  # a folder inside one of ours
    assert not streaming_shm._registers_one_of(str(tmp_path / "locals"), ["/data/c"])
    assert prefix._get_path(7, LOCALS) == f"000007_{LOCALS}"
    # What the cleaner unlinks: each name of SHM_TO_CLEAN under a prefix, every one a plain shared-memory name.
    assert all(name and "/" not in name for name in SHM_TO_CLEAN)


def test_streamings_shared_memory_is_made_and_kept_as_the_work_arounds_expect():
    """``attaching_when_sized`` replaces ``memory.BuiltinSharedMemory``, ``collecting_shared_memory`` catches the
    ``atexit.register(self.cleanup)`` of each ``SharedMemory``, and ``release_shared_memory`` calls ``cleanup``."""
    assert memory.BuiltinSharedMemory is shared_memory.SharedMemory
    calls(SharedMemory.__init__, "BuiltinSharedMemory", "atexit", "register", "cleanup")
    assert parameters(SharedMemory.__init__) == ["self", "name", "create", "size", "auto_cleanup"]
    assert parameters(streaming_shm._sized_shared_memory) == ["name", "create", "size"]
    collected = []
    with streaming_shm.collecting_shared_memory(collected):
        made = SharedMemory(f"vocagno_compat_{os.getpid()}", True, 8)
    try:
        assert collected == [made] and made.shm.size >= 8 and len(made.buf) >= 8
    finally:
        streaming_shm.release_shared_memory(collected, os.getpid())
    with pytest.raises(FileNotFoundError):  # cleanup unlinked what this process created
        shared_memory.SharedMemory(f"vocagno_compat_{os.getpid()}")


def test_the_stream_methods_checked_stream_overrides_keep_their_signatures_and_callers(tmp_path):
    for name in ("get_shards", "set_up_local", "_prepare_shard_part", "_download_file", "_decompress_shard_part"):
        assert parameters(getattr(CheckedStream, name)) == parameters(getattr(Stream, name)), name
    calls(Stream.prepare_shard, "_prepare_shard_part")  # Streaming's way to a shard part goes through the override
    stream = CheckedStream(local=str(tmp_path), shard_hash="xxh3_64", download_retry=1, download_timeout=1.0,
                           validate_hash="xxh3_64", keep_zip=False)
    for name in ("local", "split", "remote", "download_retry", "download_timeout", "validate_hash", "safe_keep_zip"):
        assert hasattr(stream, name), name
    assert callable(stream._downloader.download) and callable(stream._downloader.clean_up)
    assert parameters(stream._downloader.download) == ["remote", "local", "timeout"]


def test_the_helpers_checked_stream_calls_keep_their_signatures():
    from streaming.base.hashing import get_hash
    from streaming.base.util import retry, wait_for_file_to_exist

    assert parameters(wait_for_file_to_exist) == ["filename", "poll_interval", "timeout", "err_msg"]
    assert {"clean_up_fn", "num_attempts"} <= set(parameters(retry))
    assert parameters(get_hash) == ["algo", "data"]


def test_the_mds_reader_methods_the_checked_reader_overrides_keep_their_signatures_and_callers():
    for name in ("get_sample_data", "get_item"):
        assert parameters(getattr(_CheckedMDSReader, name)) == parameters(getattr(MDSReader, name)), name
    calls(Reader.__getitem__, "get_item")  # a sample is read through the override
    assert parameters(MDSReader.from_json) == ["dirname", "split", "obj"]
    assert parameters(MDSReader.validate) == ["self", "allow_unsafe_types"]
    assert parameters(MDSReader.decode_sample) == ["self", "data"]
    assert {"dirname", "split", "raw_data"} <= set(parameters(MDSReader.__init__))
