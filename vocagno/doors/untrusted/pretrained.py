"""Files someone else wrote (a checkpoint in a shared bucket, a corpus folder, shards on an out-root): the one place
that decides what of them is trusted.

- A name read from such a file (a tokenizer file's key, a shard's name in ``.metadata`` or ``index.json``, an object
  key, an archive member) becomes a path only through ``inside``: a relative path of plain names, never ``..``, an
  absolute path, a backslash or a NUL, so nothing is read or written outside the folder it belongs to.
- A sharded checkpoint's ``.metadata`` (a pickle) is read by ``read_dcp_metadata``: only the exact ``(module, name)``
  pairs ``torch.distributed.checkpoint`` writes there are resolved, never a dotted name.
- A whole checkpoint (and every object in a sharded one's shards) is read by ``load_torch``: ``torch.load`` with
  ``weights_only=True`` and the few types a Composer checkpoint holds (``CHECKPOINT_GLOBALS``).
- A file is opened by ``open_regular`` (``read_bytes``, ``read_json``): a regular file only (no device, FIFO or
  socket), never through a link, never more bytes than its size said when it was opened (a ``/proc`` file says 0),
  and within a size cap (``cap``) checked before anything is read.
- A number from such a file that becomes an allocation or a loop bound is checked against the bytes that hold it
  and a cap: Streaming's ``index.json`` by ``check_index`` before Streaming sees it, a compressed shard by
  ``decompress`` (its output capped at what the index says).
- A Hugging Face model or tokenizer is loaded by ``from_pretrained``: ``trust_remote_code`` explicit (off unless the
  user's own yaml turns it on), a local folder's files regular and inside it, its config without ``CODE_FIELDS``.

Caps (``CAPS``) are raised per job with the environment variable ``VOCAGNO_MAX_<NAME>`` (docs/files-from-elsewhere.md).
"""

from __future__ import annotations

import bz2
import datetime
import errno
import gzip
import io
import json
import lzma
import os
import pickle
import pickletools
import re
import stat
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import torch
from torch.torch_version import TorchVersion

from vocagno.errors import Refused

__all__ = ["CAPS", "CHECKPOINT_GLOBALS", "CODE_FIELDS", "UntrustedFile", "build_on_meta", "cap", "check_config",
           "check_folder", "check_index", "check_loops", "check_mds", "check_model_fits", "decompress",
           "from_pretrained", "inside", "load_torch", "mds_header_bytes", "open_regular", "plain_name", "read_bytes",
           "read_dcp_metadata", "read_json", "reason", "saved_shapes"]


class UntrustedFile(Refused):
    """A file from elsewhere that is refused; the message names it and says why, in one line."""


def plain_name(name: object, source: str, what: str = "name") -> str:
    """``name``, read from ``source``, if it is one plain file name: a non-empty string without ``/``, ``\\`` or NUL
    that is not ``.`` or ``..``."""
    if (not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\\0")
            or len(name.encode("utf-8", "surrogatepass")) > 255):
        raise UntrustedFile(f"{source}: refused: its {what} {name!r} is not a plain file name (a path outside its "
                            "folder, or no name at all)")
    return name


def inside(folder: str | Path, name: object, source: str, what: str = "name") -> Path:
    """``folder / name`` for a ``name`` read from ``source`` that must stay inside ``folder``: a relative path whose
    every part is a ``plain_name`` (``part-00001/shard.00000.mds`` passes; ``../x``, ``/tmp/x``, ``a//b`` don't)."""
    if not isinstance(name, str) or not name:
        plain_name(name, source, what)
    parts = name.split("/")
    for part in parts:
        try:
            plain_name(part, source, what)
        except UntrustedFile:
            raise UntrustedFile(f"{source}: refused: its {what} {name!r} is not a relative path inside its folder "
                                "(an absolute path, '..', an empty part, a backslash or a NUL)") from None
    return Path(folder).joinpath(*PurePosixPath(name).parts)


# ---- caps: the most of each thing a file from elsewhere may make vocagno read, hold or loop over ----

# name -> (default, what it bounds). Raised for one job by VOCAGNO_MAX_<NAME> (an integer).
CAPS = {
    "json_bytes": (256 << 20, "a JSON file: index.json, vocagno.json, a part's or job's state, a model's config; and "
                              "a model or tokenizer folder's .json, .txt and .model files (tokenizer.json, ...)"),
    "shard_bytes": (1 << 30, "one shard, compressed or not (the converter writes at most 64 MiB)"),
    "shards": (1_000_000, "shards in one index.json"),
    "samples": (200_000_000, "samples in one index.json (Streaming keeps a few int64 numbers per sample)"),
    "document_bytes": (64 << 20, "one document of a corpus (a .jsonl line, a .txt file, a record's text)"),
    "file_bytes": (64 << 30, "any other single file: a corpus file, a checkpoint, a model's weights"),
    "layers": (1024, "layers, experts or blocks one model config makes transformers build (num_hidden_layers, ...)"),
}


class BadCap(UntrustedFile):
    """A cap set in the environment that is no positive whole number: refused where the file it bounds is read."""


def cap(name: str) -> int:
    """The cap ``name`` of ``CAPS``: its default, or ``VOCAGNO_MAX_<NAME>`` where the environment sets it."""
    default, _ = CAPS[name]
    variable = f"VOCAGNO_MAX_{name.upper()}"
    value = os.environ.get(variable)
    if value is None:
        return default
    try:
        number = int(value.replace("_", ""))
    except ValueError:
        number = -1
    if number < 1:
        raise BadCap(f"{variable}={value!r}: a positive whole number of "
                         f"{'bytes' if name.endswith('bytes') else name} (unset, {default:,})")
    return number


def reason(error: BaseException) -> str:
    """What a one-line refusal quotes of an error that a crafted file made a library raise: its type and the first
    line of its message (at most 120 characters), or its type alone."""
    text = str(error).splitlines()[0][:120] if str(error).strip() else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _over_cap(source: object, size: int, name: str) -> UntrustedFile:
    return UntrustedFile(f"{source}: refused: {size:,} bytes, more than the {cap(name):,} allowed for "
                         f"{CAPS[name][1].split(':')[0]} (raise VOCAGNO_MAX_{name.upper()} if it is right)")


# ---- files: regular ones, inside their folder, never more than they said ----

_KINDS = {stat.S_IFDIR: "a folder", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symbolic link"}


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


class _Sized(io.RawIOBase):
    """A file read up to the size ``fstat`` gave when it was opened, and refused if more is there: a file under
    ``/proc`` says it has 0 bytes and reads as many as it likes, and a file that grows while read is not the one
    checked."""

    def __init__(self, fd: int, size: int, name: str):
        self._file = os.fdopen(fd, "rb", buffering=0)
        self.size, self.name, self._left = size, name, size

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:  # for a reader that maps the file (pyarrow): ``size`` is what it may map
        return self._file.fileno()

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_END:  # the end is where fstat said, not where the file may have grown to
            offset, whence = self.size + offset, io.SEEK_SET
        position = self._file.seek(offset, whence)
        self._left = max(self.size - position, 0)
        return position

    def tell(self) -> int:
        return self._file.tell()

    def readinto(self, buffer) -> int:
        if self._left == 0:
            if self._file.read(1):
                raise UntrustedFile(f"{self.name}: refused: it holds more than the {self.size:,} bytes its size "
                                    "says (a file of /proc or /sys, or one that grew while read)")
            return 0
        view = memoryview(buffer)[: self._left]
        n = self._file.readinto(view)
        self._left -= n or 0
        return n

    def close(self) -> None:
        self._file.close()
        super().close()


def open_regular(path: str | Path, max_bytes: int | None = None, folder: str | Path | None = None,
                 cap_name: str = "file_bytes"):
    """A binary file object of the regular file at ``path``, refused (``UntrustedFile``) where it is a link, a
    device, a FIFO or a socket, or larger than ``max_bytes`` (the size stated for it, else the cap ``cap_name``).
    ``folder``: ``path`` is a relative path inside it, opened one part after the other without following a link (a
    linked subfolder leads out). It reads the bytes ``fstat`` counted when it was opened, and no more."""
    limit = cap(cap_name) if max_bytes is None else max_bytes
    name = str(Path(folder) / path) if folder is not None else str(path)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    opened: list[int] = []
    try:
        if folder is None:
            fd = os.open(path, flags)
        else:
            parts = inside("", str(path), name, "path").parts
            opened.append(os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            for part in parts[:-1]:
                opened.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                      dir_fd=opened[-1]))
            fd = os.open(parts[-1], flags, dir_fd=opened[-1])
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            if os.path.islink(name):
                kind = "a symbolic link"
            elif folder is not None and not any(os.path.islink(Path(folder).joinpath(*parts[:i]))
                                                for i in range(1, len(parts))):
                raise FileNotFoundError(errno.ENOENT, "a file stands where its path needs a folder", name) from None
            else:
                kind = "a path through a link"
            raise UntrustedFile(f"{name}: refused: {kind}: vocagno reads regular files only, and follows no link "
                                "(copy the file itself there)") from None
        raise
    finally:
        for descriptor in opened:
            os.close(descriptor)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
        os.close(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedFile(f"{name}: refused: {_kind(info.st_mode)}: vocagno reads regular files only")
        if max_bytes is not None and max_bytes < cap(cap_name):  # the size that was stated for it, not the cap
            raise UntrustedFile(f"{name}: refused: {info.st_size:,} bytes, more than the {max_bytes:,} expected")
        raise _over_cap(name, info.st_size, cap_name)
    os.set_blocking(fd, True)
    return io.BufferedReader(_Sized(fd, info.st_size, name))


def read_bytes(path: str | Path, max_bytes: int | None = None, folder: str | Path | None = None,
               cap_name: str = "file_bytes") -> bytes:
    """The whole content of a regular file, as ``open_regular`` allows it."""
    with open_regular(path, max_bytes, folder, cap_name) as f:
        return f.read()


def read_json(path: str | Path, folder: str | Path | None = None) -> Any:
    """A JSON file from elsewhere, within the ``json_bytes`` cap; refused in one line when it is not JSON."""
    data = read_bytes(path, folder=folder, cap_name="json_bytes")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as error:
        where = Path(folder) / path if folder is not None else path
        raise UntrustedFile(f"{where}: refused: not JSON ({str(error).splitlines()[0][:120]})") from None


def check_folder(folder: str | Path, max_bytes: int | None = None, cap_name: str = "file_bytes") -> list[Path]:
    """Every file under ``folder`` (sorted, relative), each a regular file within the cap, no link, device or FIFO
    anywhere inside: for a folder handed whole to a library that opens it itself (a model or tokenizer folder)."""
    folder = Path(folder)
    limit = cap(cap_name) if max_bytes is None else max_bytes
    files = []
    for where, folders, names in os.walk(folder, followlinks=False):
        for entry in sorted(folders + names):
            path = Path(where) / entry
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                raise UntrustedFile(f"{path}: refused: it went away while {folder} was checked") from None
            if stat.S_ISDIR(info.st_mode):
                continue
            if not stat.S_ISREG(info.st_mode):
                raise UntrustedFile(f"{path}: refused: {_kind(info.st_mode)} in {folder}: vocagno reads regular files "
                                    "only, and follows no link (copy the file itself there)")
            if info.st_size > limit:
                raise _over_cap(path, info.st_size, cap_name)
            files.append(path.relative_to(folder))
    return sorted(files)


# ---- Streaming's index.json ----

# The compressions whose output vocagno can cap as it decompresses (Streaming's names; ":LEVEL" may follow).
COMPRESSIONS = ("zstd", "gz", "bz2")
_COLUMN_ENCODINGS = ("str", "ndarray")  # what vocagno writes; any other is decoded when read, pkl unpickled


def _whole(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def check_index(index: object, source: str, hash_name: str = "xxh3_64") -> dict:
    """Streaming's ``index.json`` of vocagno shards (MDS, ``str`` and ``ndarray`` columns), as read from ``source``,
    refused (``UntrustedFile``) unless every number in it is one the bytes it describes can hold and every name stays
    in its folder: at most the ``shards`` cap of shards; each with a plain relative basename, at most ``shard_bytes``
    bytes, a ``hash_name`` hash, a compression ``decompress`` caps, and no more samples than its bytes can hold
    (an MDS shard spends 4 bytes a sample on offsets); at most the ``samples`` cap in all."""
    def refuse(why: str) -> UntrustedFile:
        return UntrustedFile(f"{source}: refused: {why}")

    if not isinstance(index, dict) or index.get("version") != 2 or not isinstance(index.get("shards"), list):
        raise refuse("not a Streaming index (version 2, a list of shards)")
    shards = index["shards"]
    if not shards:
        raise refuse("it lists no shards: an empty dataset")
    if len(shards) > cap("shards"):
        raise refuse(f"{len(shards):,} shards, more than the {cap('shards'):,} allowed (raise VOCAGNO_MAX_SHARDS if "
                     "it is right)")
    total, seen = 0, set()
    for number, shard in enumerate(shards):
        where = f"shard {number}"
        if not isinstance(shard, dict) or shard.get("format") != "mds":
            raise refuse(f"{where} is not an MDS shard (vocagno writes MDS)")
        names, encodings = shard.get("column_names"), shard.get("column_encodings")
        if not (isinstance(names, list) and isinstance(encodings, list) and len(names) == len(encodings)
                and all(isinstance(name, str) for name in names)
                and isinstance(shard.get("column_sizes"), list) and len(shard["column_sizes"]) == len(names)):
            raise refuse(f"{where} has no matching column names, encodings and sizes")
        for name, encoding in zip(names, encodings):
            if encoding not in _COLUMN_ENCODINGS:
                raise refuse(f"{where}'s column {name!r} is stored as {encoding!r}: vocagno shards hold str and "
                             "ndarray columns only (any other would be decoded, a pkl one unpickled, when read)")
        compression = shard.get("compression")
        if compression is not None and (not isinstance(compression, str)
                                        or compression.split(":")[0] not in COMPRESSIONS):
            raise refuse(f"{where}'s compression {compression!r} is not one vocagno reads ({', '.join(COMPRESSIONS)},"
                         " or none)")
        if shard.get("raw_meta") is not None or shard.get("zip_meta") is not None:
            raise refuse(f"{where} has metadata files: an MDS shard has none")
        files = [("raw_data", shard.get("raw_data"))]
        if shard.get("zip_data") is not None or compression is not None:
            if compression is None or shard.get("zip_data") is None:
                raise refuse(f"{where} names a compressed file without its compression, or the other way round")
            files.append(("zip_data", shard["zip_data"]))
        for key, info in files:
            if not isinstance(info, dict):
                raise refuse(f"{where}'s {key} is not a file's description")
            basename = inside("", info.get("basename"), source, "shard name").as_posix()
            if basename in seen or basename == "index.json":
                raise refuse(f"{where}'s {key} {basename!r} names a file the index names already")
            seen.add(basename)
            if not _whole(info.get("bytes"), 1, cap("shard_bytes")):
                raise refuse(f"{where}'s {key} has {info.get('bytes')!r} bytes: a shard has 1 to "
                             f"{cap('shard_bytes'):,} (raise VOCAGNO_MAX_SHARD_BYTES if it is right)")
            hashes = info.get("hashes")
            if not isinstance(hashes, dict) or not isinstance(hashes.get(hash_name), str):
                raise refuse(f"{where}'s {key} has no {hash_name} hash: vocagno checks every shard it reads against "
                             "its hash, and vocagno's converter records one")
        samples = shard.get("samples")
        most = (shard["raw_data"]["bytes"] - 8) // 4  # count (4 bytes) and samples + 1 offsets (4 bytes each)
        if not _whole(samples, 1, max(most, 0)):
            raise refuse(f"{where} says it holds {samples!r} samples: its {shard['raw_data']['bytes']:,} bytes hold "
                         f"1 to {max(most, 0):,}")
        total += samples
    if total > cap("samples"):
        raise refuse(f"{total:,} samples, more than the {cap('samples'):,} allowed (raise VOCAGNO_MAX_SAMPLES if it "
                     "is right)")
    return index


def mds_header_bytes(samples: int) -> int:
    """The bytes an MDS shard of ``samples`` samples starts with: the count (uint32), then ``samples + 1`` offsets."""
    return 4 * (samples + 2)


def check_mds(head: bytes, samples: int, size: int, source: str) -> np.ndarray:
    """The sample offsets of an MDS shard of ``size`` bytes that starts with ``head`` (at least
    ``mds_header_bytes(samples)`` bytes), refused (``UntrustedFile``) unless it holds the ``samples`` samples its index
    says, each between the header and the end: a reader that believed a larger count would take sample bytes for
    offsets, and read (and allocate) up to 4 GiB for one sample."""
    need = mds_header_bytes(samples)
    if len(head) >= need:
        count = int(np.frombuffer(head, np.uint32, 1)[0])
        offsets = np.frombuffer(head, np.uint32, samples + 1, 4).astype(np.int64)
        # the first sample starts past the header and the writer's config (MDSWriter's), the last ends the file
        if count == samples and offsets[0] >= need and (np.diff(offsets) >= 0).all() and offsets[-1] == size:
            return offsets
    raise UntrustedFile(f"{source}: refused: not an MDS shard of the {samples:,} samples its index says")


def _read_up_to(reader, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = reader.read(min(left, 1 << 24))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def decompress(compression: str, data: bytes, size: int, source: str, exact: bool = True) -> bytes:
    """``data`` decompressed, which must give exactly ``size`` bytes (what the index says), or at most ``size`` where
    not ``exact``: decompression stops one byte past it, so a small file that would expand to gigabytes is refused
    after ``size + 1`` bytes. ``compression``: Streaming's names (``zstd``, ``gz``, ``bz2``, ``:LEVEL`` after), or
    ``xz``."""
    algorithm = compression.split(":")[0]
    try:
        if algorithm == "zstd":
            import zstandard

            with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) as reader:
                out = _read_up_to(reader, size + 1)
        elif algorithm == "gz":
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as reader:
                out = _read_up_to(reader, size + 1)
        elif algorithm == "bz2":
            out = bz2.BZ2Decompressor().decompress(data, max_length=size + 1)
        elif algorithm == "xz":
            out = lzma.LZMADecompressor().decompress(data, max_length=size + 1)
        else:
            raise UntrustedFile(f"{source}: refused: compression {compression!r} is not one vocagno reads "
                                f"({', '.join(COMPRESSIONS)})")
    except UntrustedFile:
        raise
    except Exception as error:  # gzip's OSError, bz2's and zlib's, zstandard.ZstdError: all mean "not such data"
        raise UntrustedFile(f"{source}: refused: not {algorithm} data ({type(error).__name__}: {error})") from None
    if len(out) > size:
        raise UntrustedFile(f"{source}: refused: it decompresses to more bytes than "
                            + (f"its index says ({size:,})" if exact else f"the {size:,} allowed"))
    if exact and len(out) != size:
        raise UntrustedFile(f"{source}: refused: it decompresses to {len(out):,} bytes, its index says {size:,}")
    return out


# ---- Hugging Face models and tokenizers ----

# Config fields that load code or name another place to load from: a config that holds one is refused (a saved
# name_or_path is only where it came from, and is dropped).
CODE_FIELDS = ("auto_map", "trust_remote_code", "custom_pipelines", "quantization_config")
# transformers' attention implementations that are its own code; any other name is a kernel fetched from the hub.
ATTENTION_IMPLEMENTATIONS = (None, "eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")


def check_config(content: object, source: str) -> dict:
    """A model or tokenizer config from elsewhere, refused where it names code: ``CODE_FIELDS``, an attention
    implementation of the hub's, or a ``tokenizer_class`` / ``model_type`` written as a path or module."""
    if not isinstance(content, dict):
        raise UntrustedFile(f"{source}: refused: its config is not a mapping")
    named = [key for key in CODE_FIELDS if content.get(key) not in (None, False, {}, [])]
    for key in ("attn_implementation", "_attn_implementation"):
        if content.get(key) not in ATTENTION_IMPLEMENTATIONS:
            named.append(f"{key}={content.get(key)!r}")
    for key in ("tokenizer_class", "model_type", "architectures"):
        value = content.get(key)
        if any(isinstance(v, str) and any(c in v for c in "./\\:") for v in (value if isinstance(value, list)
                                                                              else [value])):
            named.append(f"{key}={value!r}")
    if named:
        raise UntrustedFile(f"{source}: refused: its config names code to load ({', '.join(named)}): vocagno loads "
                            "only what transformers ships, never code from a model's folder or the hub")
    return content


# Config numbers a model's constructor loops over, each making modules with weights of their own: the weights hold at
# least one tensor for each, so none may exceed the number of saved tensors (checked before anything is built: a config
# of a billion layers loops for ever, even on the meta device). Any other whole-number field whose name ends in
# layer(s), expert(s) or block(s) (max_window_layers, a model type's own counts) is bounded by the ``layers`` cap.
LOOP_FIELDS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "num_decoder_layers", "num_encoder_layers",
               "decoder_layers", "encoder_layers", "num_local_experts", "num_experts", "n_routed_experts",
               "n_shared_experts")
LOOP_LIKE = re.compile(r"(layer|expert|block)s?$")


def check_loops(fields: Any, tensors: int | None, source: str, depth: int = 0) -> None:
    """Refuse a loop count (``LOOP_FIELDS``) of ``fields`` (a config, its saved content, and every config nested in
    it: ``text_config``, ``decoder``, ...) that is no whole number from 0 to the ``tensors`` (each holding at least
    one number) its weights hold (where they are known), and any loop-like number (``LOOP_LIKE``) past the ``layers``
    cap: a config's own constructor may loop over it already."""
    if not isinstance(fields, dict):
        fields = fields.to_dict() if hasattr(fields, "to_dict") else vars(fields)
    if depth > 8:
        raise UntrustedFile(f"{source}: refused: its model config nests configs more than 8 deep")
    for field, value in fields.items():
        if isinstance(value, dict):
            check_loops(value, tensors, source, depth + 1)
            continue
        if not (isinstance(field, str) and LOOP_LIKE.search(field)) or not isinstance(value, int) or \
                isinstance(value, bool):
            continue  # not a count transformers loops over (a flag, a name, a list of layer indices)
        if field in LOOP_FIELDS and (value < 0 or (tensors is not None and value > tensors)):
            raise UntrustedFile(f"{source}: refused: its model config says {field}={value!r}, and its weights hold "
                                f"{tensors if tensors is not None else 'no'} tensors: its config does not describe "
                                "its weights")
        if value > cap("layers"):
            raise UntrustedFile(f"{source}: refused: its model config says {field}={value}, more than the "
                                f"{cap('layers'):,} allowed (raise VOCAGNO_MAX_LAYERS if it is right)")


# safetensors' dtypes -> bytes per number
_SAFETENSORS_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
                      "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}


def _safetensors_shapes(folder: Path, file: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of a safetensors file's header, refused unless every tensor's bytes lie in the file and
    are as many as its dtype and shape say: a count or a shape is believed only where bytes on disk hold it."""
    source = folder / file
    with open_regular(file, folder=folder) as f:
        size = f.raw.size
        length = int.from_bytes(f.read(8), "little")
        if length > min(cap("json_bytes"), max(size - 8, 0)):
            raise UntrustedFile(f"{source}: refused: not safetensors (its header says {length:,} bytes, in a file of "
                                f"{size:,})")
        try:
            header = json.loads(f.read(length))
        except (ValueError, RecursionError):
            raise UntrustedFile(f"{source}: refused: not safetensors (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise UntrustedFile(f"{source}: refused: not safetensors (its header is not a mapping)")
    data = size - 8 - length
    shapes = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        shape = info.get("shape") if isinstance(info, dict) else None
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        width = _SAFETENSORS_BYTES.get(info.get("dtype")) if isinstance(info, dict) else None
        if (width is None or not isinstance(shape, list) or not all(_whole(n, 0, 1 << 62) for n in shape)
                or not isinstance(offsets, list) or len(offsets) != 2 or not all(_whole(n, 0, data) for n in offsets)
                or offsets[1] - offsets[0] != int(np.prod(shape, dtype=object)) * width):
            raise UntrustedFile(f"{source}: refused: its tensor {name[:80]!r} is not one its bytes hold (dtype, shape "
                                "and offsets inside the file)")
        shapes[name] = tuple(shape)
    return shapes


def _bin_shapes(folder: Path, file: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of a pickled ``.bin`` weights file: ``torch.load`` with ``weights_only`` onto the meta
    device, from a memory map (no tensor's bytes read) where it is a zip (``check_torch_zip``)."""
    path = folder / file
    is_zip = check_torch_zip(path, str(path))
    try:  # torch's legacy (pre-zip) format can't be mapped: read whole, within the file cap
        state = torch.load(str(path), map_location="meta", mmap=is_zip, weights_only=True)
    except Exception as error:  # a crafted pickle or zip raises anything: all mean "not weights we can read"
        raise UntrustedFile(f"{folder / file}: refused: not PyTorch weights ({reason(error)})") from None
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise UntrustedFile(f"{folder / file}: refused: not a mapping of names to tensors")
    return {str(name): tuple(tensor.shape) for name, tensor in state.items()}


def _index_files(folder: Path, index: Path, present: set[Path]) -> list[Path]:
    """The weight files a weight index names, each checked to be one of the folder's own files."""
    content = read_json(index, folder)
    weight_map = content.get("weight_map") if isinstance(content, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise UntrustedFile(f"{folder / index}: refused: no weight_map of tensor names to files")
    named = []
    for file in sorted(set(weight_map.values())):
        path = inside("", file, str(folder / index), "weight file")
        if path not in present:
            raise UntrustedFile(f"{folder / index}: refused: it names {file!r}, which is not a file of {folder}")
        named.append(path)
    return named


# What transformers loads from a model folder, in its order (modeling_utils._get_resolved_checkpoint_files, 4.5x).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def saved_shapes(folder: Path, files: list[Path], explicit: Any = None) -> dict[str, tuple[int, ...]] | None:
    """Tensor name -> shape of the weights transformers would load from a model folder (``files``, as
    ``check_folder`` gave them): the first of ``WEIGHT_FILES`` present, in transformers' order (an index: the files it
    names, each one of the folder's own), or ``explicit``, the file a config's ``transformers_weights`` names, which
    transformers loads first (a safetensors file or index of the folder's own); None where it holds none of them."""
    present = set(files)
    if explicit is not None:
        if not isinstance(explicit, str) or not explicit.endswith((".safetensors", ".safetensors.index.json")):
            raise UntrustedFile(f"{folder / 'config.json'}: refused: its transformers_weights {explicit!r} is no "
                                "safetensors file or index")
        chosen = inside("", explicit, str(folder / "config.json"), "transformers_weights")
        if chosen not in present:
            raise UntrustedFile(f"{folder / 'config.json'}: refused: its transformers_weights {explicit!r} is not a "
                                f"file of {folder}")
    else:
        chosen = next((Path(name) for name in WEIGHT_FILES if Path(name) in present), None)
        if chosen is None:
            return None
    named = _index_files(folder, chosen, present) if chosen.name.endswith(".index.json") else [chosen]
    shapes: dict[str, tuple[int, ...]] = {}
    for file in named:
        shapes.update((_safetensors_shapes if file.suffix == ".safetensors" else _bin_shapes)(folder, file))
    return shapes


def _numbers(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=object))


def _holding(shapes: dict[str, tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The shapes of the tensors that hold at least one number."""
    return [shape for shape in shapes.values() if _numbers(shape) > 0]


def build_on_meta(loader: Any, config: Any, source: str) -> Any:
    """``loader.from_config(config)`` on PyTorch's meta device (no storage: shapes only), after its loop-like numbers
    were bounded (``check_loops``); a config that fails any of the architecture's own checks is refused in one line."""
    try:
        with torch.device("meta"):
            return loader.from_config(config, trust_remote_code=False)
    except Exception as error:  # a crafted config fails anywhere in the architecture's constructor
        raise UntrustedFile(f"{source}: refused: its model config can't be built ({reason(error)})") from None


def check_model_fits(loader: Any, folder: Path, shapes: dict[str, tuple[int, ...]]) -> None:
    """Refuse a model folder whose ``config.json`` (its loops bounded as saved: ``from_pretrained``) describes more
    than its weights (``shapes``) hold, before transformers builds it (and fills in every weight it lacks): each
    loop-like number of the config transformers parses bounded (``check_loops``) by the weights' tensors that hold a
    number, then the model built on the meta device (no storage) and its parameters, then its buffers, counted: each
    allowed past the saved numbers by at most the largest saved tensor (a head it initializes itself)."""
    from transformers import AutoConfig

    source = str(folder / "config.json")
    holding = _holding(shapes)
    try:
        config = AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
    except Exception as error:  # a crafted config fails anywhere in transformers' parsing of its fields
        raise UntrustedFile(f"{source}: refused: its model config can't be read ({reason(error)})") from None
    check_loops(config, len(holding), source)
    model = build_on_meta(loader, config, source)
    saved = sum(map(_numbers, holding))
    allowed = saved + max(map(_numbers, holding), default=0)
    # Parameters are loaded from the weights; buffers (a causal mask, RoPE's frequencies) are computed from the config:
    # each may hold no more numbers than the weights, past the largest saved tensor.
    for what, tensors in (("parameters", model.parameters()), ("buffer numbers", model.buffers())):
        described = sum(tensor.numel() for tensor in tensors)
        if described > allowed:
            raise UntrustedFile(f"{source}: refused: its model config describes {described:,} {what}, and its "
                                f"weights hold {saved:,} numbers: its config does not describe its weights")


def from_pretrained(loader: Any, name_or_path: str, trust_remote_code: bool = False, **kwargs: Any) -> Any:
    """``loader.from_pretrained(name_or_path, ...)`` with ``trust_remote_code`` passed explicitly (off unless the
    user's own yaml turned it on). A local folder is loaded from its private copy (``vocagno.doors.private``:
    hard-linked where its files are this user's alone, else copied), checked there first, unless trusted: its files
    regular and inside it (``check_folder``), its ``config.json`` and ``tokenizer_config.json`` without code
    (``check_config``), the files its weight index names its own, and, for a model, its config no larger than its
    weights (``check_model_fits``). What transformers then reads is what was checked. The object keeps the folder's
    own name (``name_or_path``); the copy is removed once it is loaded (a tokenizer saves itself from what it
    holds, as one unpacked from a checkpoint always has)."""
    folder = Path(name_or_path)
    if str(name_or_path).startswith(("/", "./", "../", "~")) and not folder.is_dir():
        raise FileNotFoundError(f"{name_or_path}: no such folder (a model or tokenizer is a folder or a Hugging Face "
                                "name)")
    if trust_remote_code is not True and folder.is_dir():
        from vocagno.doors.private import copy_folder, private_folder
        from vocagno.doors.writing import remove

        private = private_folder("vocagno-model-")
        try:
            copy = copy_folder(folder, private / folder.resolve().name)
            try:
                _check_pretrained(loader, copy)
            except UntrustedFile as error:  # named as the user knows it, not by its copy
                raise UntrustedFile(str(error).replace(str(copy), str(folder))) from error
            try:
                loaded = loader.from_pretrained(str(copy), trust_remote_code=False, **kwargs)
            except (OSError, ValueError) as error:  # transformers' own words, naming the folder as the user knows it
                try:
                    renamed = type(error)(str(error).replace(str(copy), str(folder)))
                except Exception:  # an error type made otherwise: as it is
                    raise error from None
                raise renamed from error
        finally:  # nothing of it is read again: a process that ends without its exit handlers leaves nothing
            remove(private)
        _named(loaded, str(name_or_path))
        return loaded
    return loader.from_pretrained(name_or_path, trust_remote_code=trust_remote_code is True, **kwargs)


def _named(loaded: Any, name_or_path: str) -> None:
    """A model, config or tokenizer loaded from a private copy, named after the folder it was copied from."""
    config = getattr(loaded, "config", loaded if hasattr(loaded, "_name_or_path") else None)
    if config is not None and hasattr(config, "_name_or_path"):
        config._name_or_path = name_or_path
    if hasattr(loaded, "name_or_path"):
        try:
            loaded.name_or_path = name_or_path
        except AttributeError:  # a model's name_or_path is its config's
            pass
    init_kwargs = getattr(loaded, "init_kwargs", None)
    if isinstance(init_kwargs, dict) and "name_or_path" in init_kwargs:
        init_kwargs["name_or_path"] = name_or_path


def _check_pretrained(loader: Any, folder: Path) -> None:
    """``from_pretrained``'s checks of a local folder (its private copy)."""
    files = check_folder(folder)
    for file in files:  # what transformers parses whole (tokenizer.json, generation_config.json, merges.txt)
        size = (folder / file).stat().st_size
        if file.suffix in (".json", ".txt", ".model", ".jinja") and size > cap("json_bytes"):
            raise _over_cap(folder / file, size, "json_bytes")
    configs = {name: check_config(read_json(name, folder), str(folder / name))
               for name in ("config.json", "tokenizer_config.json") if (folder / name).exists()}
    for name, config in configs.items():
        for key in ("tokenizer_file", "vocab_file", "merges_file"):  # transformers loads these first
            if config.get(key) is not None:
                inside(folder, config[key], str(folder / name), key)
    model = configs.get("config.json")
    shapes = saved_shapes(folder, files, None if model is None else model.get("transformers_weights"))
    if model is not None:  # its loops bounded before transformers parses it (for a tokenizer too)
        check_loops(model, None if shapes is None else len(_holding(shapes)), str(folder / "config.json"))
        if hasattr(loader, "from_config") and shapes is not None:  # a model, not a tokenizer or a config
            check_model_fits(loader, folder, shapes)


# What torch.distributed.checkpoint pickles into a sharded checkpoint's .metadata (torch 2.6-2.7, as Composer's
# sharded save writes it): its metadata dataclasses and memory-format enum, the filesystem writer's storage info,
# torch.Size, dtypes and layouts (``_get_layout`` looks a layout up by its name, nothing else). Exact pairs: pickle
# resolves a dotted name (``torch.ctypes.util.subprocess.Popen``) by walking attributes from the module, so a module
# prefix, or "any class of that module", would let a crafted file reach anything torch imports.
_DCP_METADATA = "torch.distributed.checkpoint.metadata"
DCP_METADATA_GLOBALS = frozenset({
    *((_DCP_METADATA, name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata", "BytesStorageMetadata",
        "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id: the folder it was saved to
    *(("torch", name) for name in (
        "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
        "complex64", "complex128", "float8_e4m3fn", "float8_e5m2")),
})


class _DCPMetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in DCP_METADATA_GLOBALS:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of torch.distributed.checkpoint's metadata")
        return super().find_class(module, name)


def read_dcp_metadata(path: Path, max_bytes: int = 1 << 30):
    """A sharded checkpoint's ``.metadata``, refused (``UntrustedFile``) unless it holds only what
    torch.distributed.checkpoint writes there; every shard name it gives is checked by ``inside``."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        f = open_regular(path, max_bytes)
    except UntrustedFile as error:
        if "more than the" not in str(error):
            raise
        raise UntrustedFile(f"{path}: refused: {os.stat(path).st_size:,} bytes, more than a checkpoint's metadata "
                            "ever needs") from None
    with f:
        try:
            metadata = _DCPMetadataUnpickler(f).load()
        except Exception as error:  # a truncated or crafted pickle raises anything; all mean "not DCP's metadata"
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise UntrustedFile(f"{path}: refused to load: not torch.distributed.checkpoint's metadata ({reason})"
                                ) from error
    if not isinstance(metadata, Metadata) or not isinstance(getattr(metadata, "storage_data", None), dict):
        raise UntrustedFile(f"{path}: refused to load: not torch.distributed.checkpoint's metadata (it holds a "
                            f"{type(metadata).__name__})")
    # Each item names its shard file: a few names, each checked once (a tokenizer in the state is an item a token).
    checked = set()
    for info in metadata.storage_data.values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or name not in checked:  # a name that is no string is refused here
            inside(path.parent, name, str(path), "shard name")
            checked.add(name)
    return metadata


# What a Composer checkpoint holds besides tensors and plain containers (its timestamps, the numpy RNG state, the
# torch version): unpickling allows these and nothing else, so a crafted checkpoint can't run code when loaded.
CHECKPOINT_GLOBALS = [
    datetime.timedelta, TorchVersion, np.ndarray, np.dtype, np.ndarray.__reduce__(np.zeros(1))[0],
    *{type(np.dtype(t)) for t in ("uint32", "int64", "float64")},
]


def check_torch_zip(source: Any, name: str) -> bool:
    """Whether ``source`` (a path or a file object) is a zip, as torch tells (its first bytes); refused where it is one
    Python's zipfile can't read, or holds a compressed record, or a record larger than the file: torch.save stores its
    records as they are, and torch unpacks a record (its pickle) whole before it reads it, so a few MB deflated could
    take gigabytes. A file that is no zip (torch's legacy format) is left to torch.load."""
    import zipfile

    opened = open_regular(source) if isinstance(source, (str, Path)) else None
    f = opened or source
    start = f.tell()
    try:
        size = f.seek(0, os.SEEK_END)
        f.seek(start)
        if f.read(4) != b"PK\x03\x04":  # torch's own test of a zip: anything else is its legacy format
            return False
        f.seek(start)
        try:
            members = zipfile.ZipFile(f).infolist()
        except Exception as error:  # zipfile raises BadZipFile, ValueError, NotImplementedError, ... on a crafted one
            raise UntrustedFile(f"{name}: refused: a zip Python's zipfile can't read, where torch's reader might "
                                f"({reason(error)})") from None
        for info in members:
            if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size or \
                    info.file_size > size:
                raise UntrustedFile(f"{name}: refused: its record {info.filename[:80]!r} is compressed or larger than "
                                    "the file (torch.save stores its records as they are)")
        return True
    finally:
        if opened is not None:
            opened.close()
        else:
            f.seek(start)


def load_torch(source: Any, name: str, mmap: bool = False) -> Any:
    """What ``torch.save`` wrote to ``source`` (a path or a file object, named ``name``), refused
    (``UntrustedFile``) where it holds anything but tensors, containers and ``CHECKPOINT_GLOBALS``. ``mmap``: the
    tensors are mapped from the file, not read (a check of a large checkpoint's pickle costs next to nothing)."""
    if isinstance(source, io.BytesIO):  # an object of a sharded checkpoint: most are one string or number each
        plain = _plain_data(source)
        if plain is not _NOT_PLAIN:
            return plain
    if isinstance(source, (str, Path)):  # opened once: the bytes checked are the bytes torch reads
        with open_regular(source) as opened:
            # mmap maps a file by its name: this one's, through its descriptor, not whatever the name holds by then
            return _load_torch(f"/proc/self/fd/{opened.fileno()}" if mmap else opened, opened, name, mmap)
    return _load_torch(source, source, name, mmap)


def _load_torch(source: Any, checked: Any, name: str, mmap: bool) -> Any:
    check_torch_zip(checked, name)
    with torch.serialization.safe_globals(CHECKPOINT_GLOBALS):
        try:
            return torch.load(source, map_location="cpu", weights_only=True, mmap=mmap)
        except UntrustedFile:  # the file grew while torch read it (open_regular)
            raise
        except (RuntimeError, EOFError, ValueError) as error:  # torch's reader: a zip or legacy file it can't read
            raise UntrustedFile(f"{name}: refused: not a checkpoint torch can read ({reason(error)})") from error
        except pickle.UnpicklingError as error:
            # torch's message starts with advice to load with weights_only=False; what was refused comes after.
            lines = [line.strip() for line in str(error).splitlines() if line.strip()]
            refused = next((line for line in lines if "Unsupported" in line or "WeightsUnpickler" in line), lines[0])
            raise UntrustedFile(
                f"{name}: refused to load: it holds objects that are not tensors, containers or the few types a "
                f"Composer checkpoint needs, and unpickling them could run code ({refused})"
            ) from error


# What torch.save writes besides its pickle for an object that holds no tensor (torch 2.x): any other record (a
# tensor's storage under data/, TorchScript's constants.pkl) and the archive goes to torch.load.
_PLAIN_RECORDS = frozenset({".format_version", ".storage_alignment", "byteorder", "version", ".data/version",
                            ".data/serialization_id"})
# The opcodes of plain data (strings, numbers, booleans, None, lists, tuples, dicts), each one that torch's
# weights_only unpickler takes too: no global, call, build or persistent id, so nothing but those types is made.
_PLAIN_OPCODES = frozenset({
    "PROTO", "STOP", "MARK", "EMPTY_LIST", "APPEND", "APPENDS", "EMPTY_DICT", "SETITEM", "SETITEMS", "EMPTY_TUPLE",
    "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE", "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1",
    "BINFLOAT", "BINUNICODE", "SHORT_BINSTRING", "BINGET", "LONG_BINGET", "BINPUT", "LONG_BINPUT",
})
_NOT_PLAIN = object()


def _plain_data(source: io.BytesIO) -> Any:
    """What ``torch.save`` wrote to ``source``, where it is a zip archive of plain data only, read as torch.load's zip
    path reads it; else ``_NOT_PLAIN``, for ``torch.load`` to read or refuse. The result of torch's weights_only
    unpickler, built by Python's own: a sharded checkpoint holds a Composer run's tokenizer as an object a token, and
    torch's, which runs in Python, took most of the seconds a check or an export of one spends."""
    if source.tell() != 0:
        return _NOT_PLAIN
    try:
        if source.read(4) != b"PK\x03\x04":  # torch.load's test for its zip path (not a copy of the whole buffer)
            return _NOT_PLAIN
        source.seek(0)
        archive = torch._C.PyTorchFileReader(source)
        records = set(archive.get_all_records())
        if "data.pkl" not in records or not records - {"data.pkl"} <= _PLAIN_RECORDS:
            return _NOT_PLAIN
        if "byteorder" in records and archive.get_record("byteorder") not in (b"little", b"big"):
            return _NOT_PLAIN
        if ".storage_alignment" in records:
            int(archive.get_record(".storage_alignment"))  # as torch.load reads it, whatever the archive holds
        data = archive.get_record("data.pkl")
        memo, previous = 0, None  # pickle numbers what it keeps 0, 1, ...: a larger one makes Python's unpickler grow
        for position, (opcode, argument, _) in enumerate(pickletools.genops(data)):
            if opcode.name not in _PLAIN_OPCODES or (opcode.name == "PROTO" and position > 0):
                return _NOT_PLAIN
            if opcode.name == "APPENDS" and previous == "MARK":  # nothing to add: Python's adds it to anything
                return _NOT_PLAIN
            if opcode.name in ("BINPUT", "LONG_BINPUT"):
                if argument != memo:
                    return _NOT_PLAIN
                memo += 1
            previous = opcode.name
        return pickle.loads(data, encoding="utf-8")  # torch.load's encoding (for SHORT_BINSTRING)
    except Exception:  # not torch's zip, or a pickle it would refuse: torch.load says what is wrong
        return _NOT_PLAIN
    finally:
        source.seek(0)
