"""Streaming's MDS shards from elsewhere: every number that becomes an allocation or a loop bound checked against the
bytes that hold it and a cap. Streaming's ``index.json`` by ``check_index`` before Streaming sees it, a shard's header
by ``check_mds``, a compressed shard by ``decompress`` (its output capped at what the index says), a sample's teacher
distribution by ``check_distribution`` before training indexes with its ids.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma

import numpy as np

from vocagno.doors.untrusted.files import UntrustedFile, _whole, cap, inside

__all__ = ["COMPRESSIONS", "check_distribution", "check_index", "check_mds", "decompress", "mds_header_bytes"]


# The compressions whose output vocagno can cap as it decompresses (Streaming's names; ":LEVEL" may follow).
COMPRESSIONS = ("zstd", "gz", "bz2")
_COLUMN_ENCODINGS = ("str", "ndarray")  # what vocagno writes; any other is decoded when read, pkl unpickled


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


def check_distribution(ids: object, probs: object, rest: object, positions: int, top_k: int, logits: int,
                       dtype: str, source: str) -> None:
    """A sample's teacher distribution columns as decoded from a shard (``vocagno.data.shards.DISTRIBUTION_COLUMNS``),
    refused (``UntrustedFile``, one line naming the column and what is wrong) unless they are what ``vocagno.score
    --top-k`` writes for a teacher row of ``positions`` tokens: ids ``[positions, top_k]`` (uint16 or uint32, each
    below ``logits``), probabilities ``[positions, top_k]`` of ``dtype`` in [0, 1], decreasing along each row, and the
    remaining mass ``[positions]`` of ``dtype`` in [0, 1], each row's probabilities and rest adding up to 1 (within
    ``dtype``'s rounding) over ``top_k`` distinct ids. Training reads their ids as indices and their values as a
    target: a wrong one would index out of a vocabulary or train toward no distribution."""
    def refuse(column: str, why: str) -> UntrustedFile:
        return UntrustedFile(f"{source}: refused: its {column} {why}: not what python -m vocagno.score --top-k "
                             f"{top_k} writes (score the shards again)")

    shape = (positions, top_k)
    if not isinstance(ids, np.ndarray) or ids.dtype not in (np.uint16, np.uint32) or ids.shape != shape:
        raise refuse("teacher_topk_ids", f"is {_described(ids)}, not uint16 or uint32 {shape}")
    if ids.size and int(ids.max()) >= logits:
        raise refuse("teacher_topk_ids", f"holds id {int(ids.max())}, past the teacher's {logits:,} logits")
    for column, values, wanted in (("teacher_topk_probs", probs, shape), ("teacher_topk_rest", rest, shape[:1])):
        if not isinstance(values, np.ndarray) or values.dtype != np.dtype(dtype) or values.shape != wanted:
            raise refuse(column, f"is {_described(values)}, not {dtype} {wanted}")
        with np.errstate(invalid="ignore"):
            if not ((values >= 0) & (values <= 1)).all():  # NaN fails too
                raise refuse(column, "holds values outside [0, 1]")
    if top_k > 1 and (np.diff(probs.astype(np.float32), axis=1) > 0).any():
        raise refuse("teacher_topk_probs", "is not sorted, most probable first")
    # The teacher's float32 softmax sums to 1 within about top_k float32 roundings, and each value stored in dtype is
    # off by at most its own size x dtype's eps: the row's mass is 1 within these, kept 4x.
    mass = probs.astype(np.float64).sum(1) + rest.astype(np.float64)
    tolerance = 4 * (float(np.finfo(np.dtype(dtype)).eps) + top_k * float(np.finfo(np.float32).eps))
    if mass.size and (np.abs(mass - 1) > tolerance).any():
        worst = float(mass[np.abs(mass - 1).argmax()])
        raise refuse("teacher_topk_probs and teacher_topk_rest", f"add up to {worst:.6g}, not 1")
    if top_k > 1:
        ordered = np.sort(ids, axis=1)
        repeated = np.diff(ordered.astype(np.int64), axis=1) == 0
        if repeated.any():
            row, column = np.argwhere(repeated)[0]
            raise refuse("teacher_topk_ids", f"names token {int(ordered[row, column])} twice in a row")


def _described(value: object) -> str:
    if value is None:
        return "missing"
    return f"{value.dtype} {value.shape}" if isinstance(value, np.ndarray) else type(value).__name__
