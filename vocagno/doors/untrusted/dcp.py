"""A sharded checkpoint's ``.metadata`` (a pickle) from elsewhere, read by ``read_dcp_metadata``: only the exact
``(module, name)`` pairs ``torch.distributed.checkpoint`` writes there (``DCP_METADATA_GLOBALS``) are resolved, never a
dotted name.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from vocagno.doors.untrusted.files import UntrustedFile, inside, open_regular

__all__ = ["DCP_METADATA_GLOBALS", "read_dcp_metadata"]


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
