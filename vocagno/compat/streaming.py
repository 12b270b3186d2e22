"""Streaming's stream and shard reader handed only what vocagno checked: every override of a private ``Stream`` or
``MDSReader`` method, behind the exact pin on mosaicml-streaming (``STREAMING``).

- ``CheckedStream``: ``index.json`` checked through ``vocagno.doors.untrusted`` before Streaming sees it, each shard
  file against its size, header and hash before it is decoded, every write and removal in ``local`` through no link.
  It overrides ``Stream``'s private ``_prepare_shard_part``, ``_download_file`` and ``_decompress_shard_part`` and
  its ``get_shards`` and ``set_up_local``, and uses its private ``_downloader`` (no upstream issue: Streaming trusts
  its index and shards, and follows links in ``local``; vocagno reads shards from elsewhere as untrusted files).
- ``_CheckedMDSReader``: a sample that doesn't decode as its shard's columns say is refused naming the shard file and
  the sample (no upstream issue: Streaming's decoder raises whatever crafted bytes make it meet).

Checked against Streaming ``STREAMING``, the version pyproject.toml pins (the one llm-foundry 0.22 accepts too);
``tests/unit/test_compat_streaming.py`` fails when the installed Streaming is another version or no longer has what
a work-around here or in ``streaming_shm`` relies on. No public API of that version serves either work-around.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from typing import Any

import numpy as np
from streaming import Stream
from streaming.base.format.mds.reader import MDSReader

from vocagno.doors.untrusted import (
    UntrustedFile, check_index, check_mds, decompress, mds_header_bytes, open_regular, read_bytes, read_json, reason,
)
from vocagno.doors.writing import PrivateFolder, move_inside, own_temporary, write_atomically, write_inside

__all__ = ["INDEX_FILE", "STREAMING", "CheckedStream", "local_path"]

STREAMING = "0.12.0"  # the mosaicml-streaming version every work-around here and in streaming_shm was checked against

INDEX_FILE = "index.json"  # Streaming's name for a shard folder's index


def local_path(remote: str | None) -> str | None:
    """The folder a remote names on this machine (a plain path, ``file://``), else None (an object store)."""
    if remote is None:
        return None
    if remote.startswith("file://"):
        return remote[len("file://"):]
    return None if "://" in remote else remote


class CheckedStream(Stream):
    """Streaming's ``Stream`` handed only what vocagno checked. ``shard_hash``: the hash every file of the index must
    give (``untrusted.check_index``); the other keywords are ``Stream``'s.

    - ``index.json`` is read through ``untrusted.read_json`` and checked by ``check_index``, and the shard readers are
      built from that checked object: a remote's index is fetched to a name of this process's own, checked, then put
      in place, so Streaming never sees an index vocagno refused, and a shard name can't lead a download or a
      decompression out of ``local``.
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

    def __init__(self, *, shard_hash: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.shard_hash = shard_hash
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
        index = check_index(read_json(INDEX_FILE, folder), filename, self.shard_hash)
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
        ``check_index`` passed it."""
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
            check_index(index, source, self.shard_hash)
            write_atomically(filename, data)
            return
        own = own_temporary(filename)
        try:
            retry(clean_up_fn=self._downloader.clean_up, num_attempts=self.download_retry)(
                lambda: self._downloader.download(source, str(own), self.download_timeout))()
            check_index(read_json(own.name, folder), source, self.shard_hash)
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
