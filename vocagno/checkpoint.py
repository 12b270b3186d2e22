"""Composer checkpoints of ``train.py``, wherever a run left them: found, checked, read into a model, and repaired
for autoresume.

A checkpoint is a whole file (``ep0-ba100-rank0.pt``), a sharded folder (``ep0-ba100/``: ``__R_0.distcp`` files and
``.metadata``, as ``fsdp_config.state_dict_type: sharded`` writes it with ``torch.distributed.checkpoint``), or a run's
``save_folder`` (its ``latest-rank0.pt``), on a local disk or in an object store Composer reads (``s3://``,
``gs://``, ``oci://``, ...: there a save folder's latest is the ``latest-rank0.pt.symlink`` object Composer uploads).
"""

from __future__ import annotations

import datetime
import io
import os
import pickle
import re
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from omegaconf import OmegaConf as om
from torch.torch_version import TorchVersion

__all__ = ["BadCheckpoint", "fetch", "is_checkpoint", "load_checkpoint", "load_model", "read_state", "repair"]

LATEST = "latest-rank0.pt"  # Composer's latest_filename for rank 0, the rank that saves a sharded run's symlink
METADATA = ".metadata"  # torch.distributed.checkpoint's index of a sharded checkpoint, written after every shard
WHOLE = re.compile(r"ep(\d+)-ba(\d+)-rank(\d+)\.pt")  # Composer's default save_filename
SHARDED = re.compile(r"ep(\d+)-ba(\d+)")  # its folder for a sharded checkpoint (sharded_ckpt_prefix_dir)
# What a model needs of a checkpoint's state: not the optimizer's moments, which are twice the weights.
MODEL_PARTS = ("model", "integrations", "callbacks", "timestamp")


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Composer's precisions and the dtype a run computed in: a model is loaded (and published) in it.
RUN_DTYPES = {"amp_bf16": "bfloat16", "amp_fp16": "float16", "fp32": "float32"}


class BadCheckpoint(ValueError):
    """A location that holds no usable checkpoint; the message names it and says what is wrong, in one line."""


# What a Composer checkpoint holds besides tensors and plain containers (its timestamps, the numpy RNG state, the
# torch version): unpickling allows these and nothing else, so a crafted checkpoint can't run code when loaded.
CHECKPOINT_GLOBALS = [
    datetime.timedelta, TorchVersion, np.ndarray, np.dtype, np.ndarray.__reduce__(np.zeros(1))[0],
    *{type(np.dtype(t)) for t in ("uint32", "int64", "float64")},
]


def _safe_load(source: Any, name: str) -> Any:
    with torch.serialization.safe_globals(CHECKPOINT_GLOBALS):
        try:
            return torch.load(source, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as error:
            raise BadCheckpoint(
                f"{name}: refused to load: it holds objects that are not tensors, containers or the few types a "
                f"Composer checkpoint needs, and unpickling them could run code ({str(error).splitlines()[0]})"
            ) from error


def load_checkpoint(path: str) -> dict:
    """A whole Composer checkpoint, unpickled with ``weights_only=True`` and ``CHECKPOINT_GLOBALS`` allowed."""
    return _safe_load(path, path)


def is_checkpoint(location: str) -> bool:
    """Whether ``location`` names a checkpoint or a save folder rather than a Hugging Face name or folder."""
    path = Path(location)
    return ("://" in location or location.endswith(".pt") or (path / METADATA).exists() or (path / LATEST).exists()
            or (path.is_dir() and any(path.glob("*.distcp"))))


# ---- finding a checkpoint, locally or in an object store ----

def fetch(location: str, into: str) -> Path:
    """The checkpoint at ``location`` as a local path: a local one where it is (a save folder's latest followed),
    a remote one downloaded into the folder ``into``. Nothing but a complete checkpoint is returned."""
    if "://" in location:
        return _fetch_remote(location, Path(into))
    path = Path(location)
    if not path.exists():
        raise BadCheckpoint(f"{location}: no such file or folder")
    if path.is_dir() and not (path / METADATA).exists():
        if (path / LATEST).exists():
            return fetch(str((path / LATEST).resolve()), into)
        if any(path.glob("*.distcp")):
            raise BadCheckpoint(f"{location}: an incomplete sharded checkpoint: it has shards but no {METADATA}, "
                                "which is written last (its save was interrupted)")
        raise BadCheckpoint(f"{location}: not a checkpoint: a folder without {METADATA} (a sharded checkpoint) or "
                            f"{LATEST} (a save folder)")
    if path.is_dir():
        missing = _missing_shards(path / METADATA, lambda name: (path / name).is_file())
        if missing:
            raise BadCheckpoint(f"{location}: a sharded checkpoint with shards missing: {', '.join(missing)}")
    elif not zipfile.is_zipfile(path):
        raise BadCheckpoint(f"{location}: not a checkpoint: torch.save writes a zip file, and this is not one (or "
                            "its save was interrupted)")
    return path


class _MetadataUnpickler(pickle.Unpickler):
    """A sharded checkpoint's ``.metadata`` (a pickle, which ``FileSystemReader`` loads unchecked), allowing only
    what torch.distributed.checkpoint writes there: its metadata classes, torch's sizes, dtypes and layouts."""

    ALLOWED = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
               ("torch.distributed.checkpoint.filesystem", "_StorageInfo")}

    def find_class(self, module: str, name: str):
        found = super().find_class(module, name) if module.startswith(("torch", "pathlib")) else None
        if ((module, name) in self.ALLOWED or isinstance(found, torch.dtype)
                or module == "torch.distributed.checkpoint.metadata" and isinstance(found, type)):
            return found
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")


def _read_metadata(metadata_file: Path):
    with open(metadata_file, "rb") as f:
        try:
            return _MetadataUnpickler(f).load()
        except (pickle.UnpicklingError, EOFError, AttributeError, ModuleNotFoundError) as error:
            raise BadCheckpoint(f"{metadata_file}: refused to load: not torch.distributed.checkpoint's metadata "
                                f"({str(error).splitlines()[0] if str(error) else type(error).__name__})") from error


def _shard_names(metadata_file: Path) -> set[str]:
    """The shard files a sharded checkpoint's ``.metadata`` names (every tensor and object points into one)."""
    return {info.relative_path for info in _read_metadata(metadata_file).storage_data.values()}


def _missing_shards(metadata_file: Path, present: Callable[[str], bool]) -> list[str]:
    """The shards ``.metadata`` names that are not ``present`` (on disk, or in a store's listing), sorted."""
    return sorted(name for name in _shard_names(metadata_file) if not present(name))


def _store(uri: str):
    from composer.utils import maybe_create_object_store_from_uri, parse_uri

    try:
        store = maybe_create_object_store_from_uri(uri)
    except (NotImplementedError, ValueError, ImportError) as error:
        raise BadCheckpoint(f"{uri}: no object store for it: {str(error).splitlines()[0]}") from error
    return store, parse_uri(uri)[2].rstrip("/")


def _listing(store, uri: str, prefix: str) -> list[str]:
    try:
        return store.list_objects(prefix)
    except Exception as error:  # each store raises its own client's errors: all mean "can't read it"
        raise BadCheckpoint(f"{uri}: the object store can't be read: {type(error).__name__}: "
                            f"{str(error).splitlines()[0] if str(error) else ''}") from error


def _fetch_remote(uri: str, into: Path) -> Path:
    store, key = _store(uri)
    names = set(_listing(store, uri, key))
    scheme, _, rest = uri.partition("://")
    if key in names:  # a whole checkpoint
        into.mkdir(parents=True, exist_ok=True)
        store.download_object(key, str(into / Path(key).name))
        return fetch(str(into / Path(key).name), str(into))
    if f"{key}.symlink" in names or f"{key}/{LATEST}.symlink" in names:  # Composer's latest, a text file
        link = f"{key}.symlink" if f"{key}.symlink" in names else f"{key}/{LATEST}.symlink"
        store.download_object(link, str(into / "latest.symlink"))
        target = (into / "latest.symlink").read_text().strip()
        return _fetch_remote(f"{scheme}://{rest.split('/', 1)[0]}/{target}", into)
    if f"{key}/{METADATA}" in names:  # a sharded checkpoint: its index, then every shard it names
        folder = into / Path(key).name
        folder.mkdir(parents=True, exist_ok=True)
        store.download_object(f"{key}/{METADATA}", str(folder / METADATA))
        missing = _missing_shards(folder / METADATA, lambda name: f"{key}/{name}" in names)
        if missing:
            raise BadCheckpoint(f"{uri}: a sharded checkpoint with shards missing: {', '.join(missing)}")
        for name in sorted(_shard_names(folder / METADATA)):  # parsed again: small next to the shards' download
            store.download_object(f"{key}/{name}", str(folder / name))
        return folder
    raise BadCheckpoint(f"{uri}: no checkpoint there: no such object, nor {METADATA} (a sharded checkpoint) or "
                        f"{LATEST}.symlink (a save folder) under it")


# ---- reading one ----

def read_state(path: Path, parts: tuple[str, ...] = MODEL_PARTS) -> dict[str, Any]:
    """The ``parts`` of a local checkpoint's ``state``, whole or sharded (the shards gathered into whole tensors)."""
    if path.is_dir():
        return _read_sharded(path, parts)
    try:
        state = load_checkpoint(str(path)).get("state")
    except (RuntimeError, EOFError) as error:
        raise BadCheckpoint(f"{path}: not a checkpoint torch can read ({str(error).splitlines()[0]})") from error
    if not isinstance(state, dict):
        raise BadCheckpoint(f"{path}: not a Composer checkpoint: it holds no 'state'")
    return {part: state[part] for part in parts if part in state}


def _read_sharded(folder: Path, parts: tuple[str, ...]) -> dict[str, Any]:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.metadata import StorageMeta
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    class SafeEmptyPlanner(_EmptyStateDictLoadPlanner):
        """Builds the state dict from the metadata alone; objects other than tensors (the tokenizer's files, the
        timestamp) are unpickled as whole checkpoints are: ``weights_only`` with ``CHECKPOINT_GLOBALS``."""

        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            from torch.distributed.checkpoint._nested_dict import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn],
                        _safe_load(value, str(folder)))

    class SafeReader(FileSystemReader):
        def read_metadata(self):
            metadata = _read_metadata(folder / METADATA)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    state: dict[str, Any] = {}
    _load_state_dict(state, storage_reader=SafeReader(str(folder)),
                     planner=SafeEmptyPlanner(keys={f"state.{part}" for part in parts}), no_dist=True)
    return state.get("state", {})


def recipe(state: dict[str, Any]) -> str | None:
    """The resolved yaml ``train.py`` ran with (its ``RunRecipe`` callback's state), or None for other runs."""
    callbacks = state.get("callbacks") or {}
    return (callbacks.get("RunRecipe") or {}).get("yaml")


def model_from_state(state: dict[str, Any], name: str, dtype: str | None = None):
    """The Hugging Face model and tokenizer a checkpoint's state holds, in ``dtype`` (else the weights' own, float32
    where they mix), built as ``from_pretrained(..., torch_dtype=dtype)`` builds it: constructed in the dtype, then
    given the weights, so buffers the architecture computes itself (RoPE's ``inv_freq``, float32 on purpose) are
    not cast with them."""
    from composer.models import HuggingFaceModel
    from composer.models.huggingface import get_hf_config_from_composer_state_dict
    from transformers import AutoModelForCausalLM

    saved = (state.get("integrations") or {}).get("huggingface")
    if not saved or "model" not in state:
        raise BadCheckpoint(f"{name}: not a checkpoint of a Hugging Face model (train.py's): it has no "
                            "state.integrations.huggingface")
    # Composer otherwise unpacks the tokenizer into a folder under the working directory and leaves it there.
    with tempfile.TemporaryDirectory() as unpacked:
        tokenizer = HuggingFaceModel.load_huggingface_tokenizer_from_saved_state(saved, tokenizer_save_dir=unpacked)
    if tokenizer is None:
        raise BadCheckpoint(f"{name}: the checkpoint holds no tokenizer (train.py saves one with the model)")
    weights = {key.removeprefix("model."): value for key, value in state["model"].items()}  # FSDP's wrapper prefix
    if dtype is None:
        dtypes = {tensor.dtype for tensor in weights.values() if tensor.is_floating_point()}
        torch_dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
    else:
        torch_dtype = DTYPES[dtype]
    # Built from the saved config as a causal LM: the saved class is FullyShardedDataParallel in an FSDP run (Composer
    # records the wrapper's class).
    config = get_hf_config_from_composer_state_dict({"state": state})
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch_dtype)
    try:
        model.load_state_dict(weights)  # copied into the model's tensors: in their dtype
    except RuntimeError as error:
        raise BadCheckpoint(f"{name}: its weights don't fit the model its config describes "
                            f"({str(error).splitlines()[1].strip() if len(str(error).splitlines()) > 1 else error})"
                            ) from error
    model.config.use_cache = True  # train.py turns it off for training; generation needs it
    embeddings = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > embeddings:
        raise BadCheckpoint(f"{name}: its tokenizer has {len(tokenizer)} tokens and its model embeds {embeddings}: "
                            "the model was trained with another tokenizer than the one saved with it")
    return model.eval(), tokenizer


def load_model(location: str, device: str = "cpu", dtype: str | None = None):
    """The model and tokenizer of the checkpoint at ``location`` (any kind ``fetch`` finds), in ``dtype`` or the
    dtype the run computed in (``RUN_DTYPES``, from its recipe; else the checkpoint's), and its state's other
    parts (timestamp, the run's recipe). Every reader of a ``train.py`` checkpoint loads its model here."""
    if dtype is not None and dtype not in DTYPES:
        raise BadCheckpoint(f"dtype {dtype}: one of {', '.join(DTYPES)}")
    with tempfile.TemporaryDirectory(prefix="vocagno-checkpoint-") as downloads:
        state = read_state(fetch(location, downloads))
    yaml = recipe(state)
    dtype = dtype or (RUN_DTYPES.get(str(om.create(yaml).get("precision"))) if yaml else None)
    model, tokenizer = model_from_state(state, location, dtype)
    return model.to(device), tokenizer, state


# ---- repairing a save folder for autoresume ----

def repair(folder: str) -> None:
    """Make a save folder resumable after a kill or a full disk during a save: a checkpoint that is not complete (a
    whole file that is not a complete zip, whose directory comes last; a sharded folder without its ``.metadata`` or
    a shard it names) is removed, and the latest points to the newest complete checkpoint (one saved whole just
    before the kill included: Composer would otherwise refuse to resume before it). Local folders: each rank's
    ``latest-rank{r}.pt`` symlink; object stores: ``latest-rank0.pt.symlink``."""
    if "://" in folder:
        _repair_remote(folder)
        return
    newest: dict[int, tuple[tuple[int, int], Path]] = {}
    for path in sorted(Path(folder).glob("ep*-ba*")):
        whole, sharded = WHOLE.fullmatch(path.name), SHARDED.fullmatch(path.name)
        if path.is_symlink() or not (whole and path.is_file() or sharded and path.is_dir()):
            continue
        try:
            fetch(str(path), folder)
        except BadCheckpoint as incomplete:
            print(f"removing {path}: an incomplete checkpoint (its save was interrupted): {incomplete}", flush=True)
            shutil.rmtree(path) if path.is_dir() else path.unlink()
            continue
        epoch, batch, rank = map(int, (whole or sharded).groups() + ((0,) if sharded else ()))
        if (batch, epoch) > newest.get(rank, ((-1, -1), None))[0]:
            newest[rank] = ((batch, epoch), path)
    for rank, (_, path) in newest.items():
        latest = Path(folder) / f"latest-rank{rank}.pt"
        if os.path.realpath(latest) != os.path.realpath(path):
            latest.unlink(missing_ok=True)
            latest.symlink_to(path.name)


def _repair_remote(uri: str) -> None:
    store, prefix = _store(uri)
    names = set(_listing(store, uri, prefix + "/"))
    complete, incomplete = [], []
    for checkpoint in sorted({name[len(prefix) + 1:].split("/")[0] for name in names}):
        whole, sharded = WHOLE.fullmatch(checkpoint), SHARDED.fullmatch(checkpoint)
        if whole and int(whole.group(3)) == 0 and f"{prefix}/{checkpoint}" in names:
            complete.append(((int(whole.group(2)), int(whole.group(1))), checkpoint))
        elif sharded:
            key = f"{prefix}/{checkpoint}"
            shards = {name for name in names if name.startswith(key + "/")}
            done = f"{key}/{METADATA}" in shards
            if done:
                with tempfile.TemporaryDirectory() as tmp:
                    store.download_object(f"{key}/{METADATA}", f"{tmp}/{METADATA}")
                    done = not _missing_shards(Path(tmp) / METADATA, lambda name: f"{key}/{name}" in shards)
            (complete if done else incomplete).append(((int(sharded.group(2)), int(sharded.group(1))), checkpoint))
    if incomplete:
        # Composer would fail on the resumed run's first save to the same name (the objects exist, save_overwrite
        # is off): they must go, and deleting objects is not part of Composer's ObjectStore interface.
        names_left = ", ".join(f"{uri}/{name}" for _, name in incomplete)
        if not hasattr(getattr(store, "client", None), "delete_object"):
            raise BadCheckpoint(f"incomplete checkpoints (their upload was interrupted): {names_left}: delete them "
                                "to resume, or set save_overwrite: true")
        for _, name in incomplete:
            print(f"removing {uri}/{name}: an incomplete checkpoint (its upload was interrupted)", flush=True)
            for key in sorted(n for n in names if n.startswith(f"{prefix}/{name}/")):
                store.client.delete_object(Bucket=store.bucket, Key=store.get_key(key))
    if not complete:
        return
    newest = f"{prefix}/{max(complete)[1]}"
    link = f"{prefix}/{LATEST}.symlink"
    with tempfile.TemporaryDirectory() as tmp:
        if link in names:
            store.download_object(link, f"{tmp}/old")
            if Path(f"{tmp}/old").read_text().strip() == newest:
                return
        Path(f"{tmp}/new").write_text(newest)
        store.upload_object(link, f"{tmp}/new")
