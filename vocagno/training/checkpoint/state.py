"""A checkpoint's state, read through the one way in (``vocagno.doors.untrusted``): the parts a model needs, the
objects a sharded save pickled, checked before anything is loaded, and the run's recipe (its yaml)."""

from __future__ import annotations

import io
import math
import os
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf as om

from vocagno.compat.torch import load_from_metadata
from vocagno.doors.untrusted import inside, load_torch, plain_name, read_dcp_metadata
from vocagno.training.checkpoint.files import (
    METADATA, BadCheckpoint, _first_line, _untrusted, load_checkpoint, _listing, _fetch_remote,
)


# What a model needs of a checkpoint's state: not the optimizer's moments, which are twice the weights.
MODEL_PARTS = ("model", "integrations", "callbacks", "timestamp")


def read_state(path: Path, parts: tuple[str, ...] = MODEL_PARTS) -> dict[str, Any]:
    """The ``parts`` of a local checkpoint's ``state``, whole or sharded (the shards gathered into whole tensors)."""
    if path.is_dir():
        return _read_sharded(path, parts)
    loaded = load_checkpoint(str(path))
    state = loaded.get("state") if isinstance(loaded, dict) else None
    if not isinstance(state, dict):
        raise BadCheckpoint(f"{path}: not a Composer checkpoint: it holds no 'state'")
    return {part: state[part] for part in parts if part in state}


def check_objects(path: Path) -> None:
    """Read every pickled object of a local checkpoint as vocagno reads them (``load_torch``), leaving its tensors
    unread: Composer's own loader, which autoresume calls next, unpickles them unchecked (a whole file with
    ``weights_only=False``; each object in a sharded checkpoint's shards, and its ``.metadata``, with PyTorch's)."""
    if path.is_dir():
        _read_sharded(path, _pickled_objects(_untrusted(read_dcp_metadata, path / METADATA)))
    else:
        _untrusted(load_torch, str(path), str(path), True)


def _pickled_objects(metadata) -> set[str]:
    """The flattened names of what a sharded checkpoint holds as pickled objects rather than tensors."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    return {fqn for fqn, item in metadata.state_dict_metadata.items() if isinstance(item, BytesStorageMetadata)}


def _check_tensor_bytes(metadata, folder: Path) -> None:
    """Refuse a sharded checkpoint whose ``.metadata`` claims more tensor bytes than its shards hold: the loader makes
    an empty tensor of every size it claims before it reads a byte."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    held = sum(os.lstat(shard).st_size for shard in folder.glob("*.distcp"))
    claimed = 0
    for fqn, item in metadata.state_dict_metadata.items():
        if isinstance(item, TensorStorageMetadata):
            size = tuple(item.size)
            if not all(isinstance(n, int) and n >= 0 for n in size):
                raise BadCheckpoint(f"{folder / METADATA}: refused: tensor {fqn!r} has the size {size}")
            claimed += math.prod(size) * torch.empty(0, dtype=item.properties.dtype).element_size()
            if claimed > held:
                raise BadCheckpoint(f"{folder / METADATA}: refused: its tensors claim more bytes than its shards "
                                    f"hold ({held:,}; at {fqn!r}, {claimed:,})")


def _read_sharded(folder: Path, parts: tuple[str, ...] | set[str]) -> dict[str, Any]:
    """The ``parts`` (or, a set, the flattened names) of a sharded checkpoint's ``state``, its tensors made from its
    ``.metadata`` alone (``compat.torch.load_from_metadata``); objects other than tensors (the tokenizer's files, the
    timestamp) are unpickled as whole checkpoints are: ``weights_only`` with ``CHECKPOINT_GLOBALS``."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.metadata import StorageMeta

    def load_object(value: io.BytesIO) -> Any:
        return _untrusted(load_torch, value, str(folder))

    class SafeReader(FileSystemReader):
        def read_metadata(self):
            metadata = _untrusted(read_dcp_metadata, folder / METADATA)
            if not isinstance(parts, set):  # tensors are read, not only the pickled objects (of shards fetched alone)
                _check_tensor_bytes(metadata, folder)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    keys = parts if isinstance(parts, set) else {f"state.{part}" for part in parts}  # a set: flattened names
    try:
        state = load_from_metadata(SafeReader(str(folder)), keys, load_object)
    except BadCheckpoint:
        raise
    except (Exception, CheckpointException) as error:  # DCP wraps each rank's error in its own (a BaseException)
        causes = [failure[0] if isinstance(failure, tuple) else failure
                  for failure in (getattr(error, "failures", None) or {}).values()]
        refused = next((cause for cause in causes if isinstance(cause, BadCheckpoint)), None)
        if refused is not None:
            raise refused from error
        raise BadCheckpoint(f"{folder}: its shards can't be read: {type(error).__name__}: "
                            f"{_first_line(error)}") from error
    return state.get("state", {})


def recipe(state: dict[str, Any]) -> str | None:
    """The resolved yaml ``train.py`` ran with (its ``RunRecipe`` callback's state), or None for other runs."""
    callbacks = state.get("callbacks") or {}
    return (callbacks.get("RunRecipe") or {}).get("yaml")


def recipe_config(state: dict[str, Any], name: str):
    """The recipe as a config, or None. ``train.py`` saves it resolved: an interpolation left in it (``${oc.env:...}``
    reads the environment, into a model card people publish) is refused."""
    from omegaconf import DictConfig, ListConfig

    yaml = recipe(state)
    if yaml is None:
        return None
    try:
        cfg = om.create(yaml)
    except Exception as error:  # omegaconf and yaml raise their own kinds: all mean "not a yaml mapping"
        raise BadCheckpoint(f"{name}: its recipe is not a yaml mapping ({type(error).__name__})") from error

    def interpolations(node, where=""):
        keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
        for key in keys:
            if om.is_interpolation(node, key):
                yield f"{where}{key}"
            else:
                child = node._get_node(key)
                if isinstance(child, (DictConfig, ListConfig)):
                    yield from interpolations(child, f"{where}{key}.")

    if not isinstance(cfg, DictConfig):
        raise BadCheckpoint(f"{name}: its recipe is not a yaml mapping")
    found = list(interpolations(cfg))
    if found:
        raise BadCheckpoint(f"{name}: refused: its recipe holds interpolations ({', '.join(found[:3])}), which "
                            "train.py resolves before saving it")
    return cfg


def _check_remote_objects(store, bucket: str, key: str, into: Path) -> None:
    """``check_objects`` on a checkpoint in a store: a whole file downloaded; of a sharded one, ``.metadata`` and
    only the shards that hold its pickled objects (rank 0's, in practice), not every rank's tensors."""
    names = set(_listing(store, f"{bucket}/{key}", key))
    if key in names:
        check_objects(_fetch_remote(f"{bucket}/{key}", into, follow_latest=False))
        return
    if f"{key}/{METADATA}" not in names:
        raise BadCheckpoint(f"{bucket}/{key}: no checkpoint there (the latest link names it)")
    folder = into / _untrusted(plain_name, Path(key).name, f"{bucket}/{key}", "object name")
    folder.mkdir(parents=True, exist_ok=True)
    store.download_object(f"{key}/{METADATA}", str(folder / METADATA))
    metadata = _untrusted(read_dcp_metadata, folder / METADATA)
    objects = _pickled_objects(metadata)
    shards = {info.relative_path for index, info in metadata.storage_data.items() if index.fqn in objects}
    for name in sorted(shards):
        store.download_object(f"{key}/{name}", str(_untrusted(inside, folder, name, f"{bucket}/{key}", "shard name")))
    _read_sharded(folder, objects)
