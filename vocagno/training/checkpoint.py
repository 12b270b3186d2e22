"""Composer checkpoints of ``train.py``, wherever a run left them: found, checked, read into a model, and repaired
for autoresume.

A checkpoint is a whole file (``ep0-ba100-rank0.pt``), a sharded folder (``ep0-ba100/``: ``__R_0.distcp`` files and
``.metadata``, as ``fsdp_config.state_dict_type: sharded`` writes it with ``torch.distributed.checkpoint``), or a run's
``save_folder`` (its ``latest-rank0.pt``), on a local disk or in an object store Composer reads (``s3://``,
``gs://``, ``oci://``, ...: there a save folder's latest is the ``latest-rank0.pt.symlink`` object Composer uploads).
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Callable

import torch
from omegaconf import OmegaConf as om

from vocagno.errors import Refused
from vocagno.doors.untrusted import (
    UntrustedFile, build_on_meta, check_config, check_folder, check_loops, from_pretrained, inside, load_torch,
    open_regular, plain_name, read_bytes, read_dcp_metadata,
)
from vocagno.doors.writing import remove

__all__ = ["BadCheckpoint", "IncompleteCheckpoint", "check_load_path", "check_objects", "fetch", "is_checkpoint",
           "load_checkpoint", "model_from_checkpoint", "read_state", "recipe_config", "repair", "tokenizer_from_state"]

LATEST = "latest-rank0.pt"  # Composer's latest_filename for rank 0, the rank that saves a sharded run's symlink
METADATA = ".metadata"  # torch.distributed.checkpoint's index of a sharded checkpoint, written after every shard
WHOLE = re.compile(r"ep(\d+)-ba(\d+)-rank(\d+)\.pt")  # Composer's default save_filename
SHARDED = re.compile(r"ep(\d+)-ba(\d+)")  # its folder for a sharded checkpoint (sharded_ckpt_prefix_dir)
# What a model needs of a checkpoint's state: not the optimizer's moments, which are twice the weights.
MODEL_PARTS = ("model", "integrations", "callbacks", "timestamp")


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Composer's precisions and the dtype a run computed in: a model is loaded (and published) in it.
RUN_DTYPES = {"amp_bf16": "bfloat16", "amp_fp16": "float16", "fp32": "float32"}


class BadCheckpoint(Refused):
    """A location that holds no usable checkpoint; the message names it and says what is wrong, in one line."""


class IncompleteCheckpoint(BadCheckpoint):
    """A checkpoint whose save was positively cut short (the file or index written last is missing): the one kind
    autoresume's ``repair`` removes."""


def _first_line(error: Exception) -> str:
    """An error's first line (empty for an error without a message): what a one-line refusal quotes of it."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ""


def _untrusted(call: Callable, *args):
    """``call(*args)``, a reader of ``vocagno.doors.untrusted``, with what it refuses as a ``BadCheckpoint``."""
    try:
        return call(*args)
    except UntrustedFile as error:
        raise BadCheckpoint(str(error)) from error


def load_checkpoint(path: str) -> dict:
    """A whole Composer checkpoint, unpickled with ``weights_only=True`` and ``CHECKPOINT_GLOBALS`` allowed."""
    return _untrusted(load_torch, path, path)


def is_checkpoint(location: str) -> bool:
    """Whether ``location`` names a checkpoint or a save folder rather than a Hugging Face name or folder."""
    path = Path(location)
    return ("://" in location or location.endswith(".pt") or (path / METADATA).exists() or (path / LATEST).exists()
            or (path.is_dir() and any(path.glob("*.distcp"))))


# ---- finding a checkpoint, locally or in an object store ----

def fetch(location: str, into: str) -> Path:
    """The checkpoint at ``location`` as a local path: a local one where it is (a save folder's latest followed),
    a remote one downloaded into the folder ``into``. Nothing but a complete checkpoint is returned; a save cut short
    raises ``IncompleteCheckpoint``, anything else wrong ``BadCheckpoint``."""
    if "://" in location:
        return _fetch_remote(location, Path(into))
    path = Path(location)
    if path.is_symlink() and re.fullmatch(r"latest-rank\d+\.pt", path.name):  # Composer's link beside its target
        return fetch(str(_latest_target(path)), into)
    if not path.exists():
        raise BadCheckpoint(f"{location}: no such file or folder")
    if path.is_dir() and not (path / METADATA).exists():
        if (path / LATEST).exists():
            return fetch(str(_latest_target(path / LATEST)), into)
        if not any(path.glob("*.distcp")):
            raise BadCheckpoint(f"{location}: not a checkpoint: a folder without {METADATA} (a sharded checkpoint) or "
                                f"{LATEST} (a save folder)")
    if path.is_dir():
        _untrusted(check_folder, path)  # torch's reader opens its files itself: regular files only, no link
        _check_saved(path)
        return path
    try:
        cut_short = _untrusted(_zip_cut_short, path)
    except OSError as error:
        raise BadCheckpoint(f"{location}: can't be read: {error.strerror or error}") from error
    if cut_short:
        raise IncompleteCheckpoint(f"{location}: an incomplete checkpoint: torch.save's zip without the directory "
                                   "it writes last (its save was interrupted)")
    if not zipfile.is_zipfile(path):
        raise BadCheckpoint(f"{location}: not a checkpoint: torch.save writes a zip file, and this is not one")
    if _untrusted(_pickle_missing, path):
        raise IncompleteCheckpoint(f"{location}: an incomplete checkpoint: torch.save's zip closed before its "
                                   "data.pkl was written (its save was interrupted)")
    return path


def _pickle_missing(path: Path) -> bool:
    """Whether a zip is a ``torch.save`` interrupted while pickling: torch's writer closes its zip on the way out of
    the interruption, holding the records it writes first (``version``, ``byteorder``) and no ``data.pkl``. A zip
    holding neither is no checkpoint (``BadCheckpoint``)."""
    try:
        with open_regular(path) as f, zipfile.ZipFile(f) as archive:
            names = [name.split("/", 1)[-1] for name in archive.namelist()]
    except (zipfile.BadZipFile, NotImplementedError, ValueError) as error:
        raise BadCheckpoint(f"{path}: not a checkpoint: a zip Python's zipfile can't read ({error})") from None
    if "data.pkl" in names:
        return False
    if not {"version", "byteorder", ".format_version"} & set(names):
        raise BadCheckpoint(f"{path}: not a checkpoint: a zip without the data.pkl torch.save writes")
    return True


def _latest_target(latest: Path) -> Path:
    """What a save folder's ``latest-rank{r}.pt`` names: itself where it is a file, else its link's target, which
    must be a checkpoint's plain name in the same folder (Composer links it so)."""
    if not latest.is_symlink():
        return latest
    name = os.readlink(latest)
    target = latest.parent / _untrusted(plain_name, name, str(latest), "link target")
    if target.is_symlink():  # one hop: a latest names a checkpoint, never another link (a loop of them included)
        raise BadCheckpoint(f"{latest}: refused: its link target {name!r} is itself a link: Composer's latest names "
                            "a checkpoint beside it")
    return target


# What a sharded save writes into its folder: each rank's shards, then .metadata (through a .tmp file it renames).
_SHARD_FILE = re.compile(r"__\d+_\d+\.distcp|\.metadata\.tmp")


def _only_shards(names) -> bool:
    return all(_SHARD_FILE.fullmatch(name) for name in names)


def _zip_cut_short(path: Path) -> bool:
    """Whether a file is positively a ``torch.save`` cut short: empty, or a zip begun (its first local header) whose
    end-of-central-directory record, written last, is missing. An ``OSError`` proves nothing and is raised; a link, a
    device or a FIFO is refused (``UntrustedFile``)."""
    with open_regular(path) as f:
        head = f.read(4)
        if not head:
            return True
        if head != b"PK\x03\x04":
            return False
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - (22 + 0xFFFF)))  # the record is 22 bytes and a comment of at most 64 KiB
        return b"PK\x05\x06" not in f.read()


def _shard_names(metadata_file: Path) -> set[str]:
    """The shard files a sharded checkpoint's ``.metadata`` names (every tensor and object points into one), each
    checked to be a plain name inside its folder."""
    return {info.relative_path for info in _untrusted(read_dcp_metadata, metadata_file).storage_data.values()}


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
                            f"{_first_line(error)}") from error


def _fetch_remote(uri: str, into: Path, follow_latest: bool = True) -> Path:
    store, key = _store(uri)
    names = set(_listing(store, uri, key))
    scheme, _, rest = uri.partition("://")
    if key in names:  # a whole checkpoint
        local = into / _untrusted(plain_name, Path(key).name, uri, "object name")
        into.mkdir(parents=True, exist_ok=True)
        store.download_object(key, str(local))
        return fetch(str(local), str(into))
    link = next((name for name in (f"{key}.symlink", f"{key}/{LATEST}.symlink") if name in names), None)
    if link and follow_latest:  # Composer's latest, a text file naming the checkpoint's key
        store.download_object(link, str(into / "latest.symlink"))
        target = read_bytes(into / "latest.symlink", cap_name="json_bytes").decode(errors="replace").strip()
        # One hop: a latest names a checkpoint, never another latest (nor itself).
        return _fetch_remote(f"{scheme}://{rest.split('/', 1)[0]}/{target}", into, follow_latest=False)
    if f"{key}/{METADATA}" in names:  # a sharded checkpoint: its index, then every shard it names
        folder = into / _untrusted(plain_name, Path(key).name, uri, "object name")
        folder.mkdir(parents=True, exist_ok=True)
        store.download_object(f"{key}/{METADATA}", str(folder / METADATA))
        missing = _missing_shards(folder / METADATA, lambda name: f"{key}/{name}" in names)
        if missing:
            raise BadCheckpoint(f"{uri}: a sharded checkpoint with shards missing: {', '.join(missing)}")
        for name in sorted(_shard_names(folder / METADATA)):  # parsed again: small next to the shards' download
            store.download_object(f"{key}/{name}", str(_untrusted(inside, folder, name, uri, "shard name")))
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


def check_objects(path: Path) -> None:
    """Read every pickled object of a local checkpoint as vocagno reads them (``load_torch``), leaving its tensors
    unread: Composer's own loader, which autoresume calls next, unpickles them unchecked (a whole file with
    ``weights_only=False``; each object in a sharded checkpoint's shards, and its ``.metadata``, with PyTorch's)."""
    if path.is_dir():
        _read_sharded(path, _pickled_objects(_untrusted(read_dcp_metadata, path / METADATA)))
    else:
        _untrusted(load_torch, str(path), str(path), True)


def check_load_path(location: str) -> None:
    """Check the checkpoint a run is told to load (``callbacks.load_checkpoint.load_path``) as autoresume's latest is
    checked, before Composer loads it with its own unchecked unpickling: a local whole file or sharded folder by
    ``check_objects``, one in an object store by downloading what Composer would load of it (a whole file; of a
    sharded one ``.metadata`` and the shards holding pickled objects) and checking that. ``location`` is formatted
    as Composer formats it (``{run_name}``, rank 0's ``{rank}``) by the caller. Anything else is refused:
    ``BadCheckpoint``."""
    if "://" in location:
        store, key = _store(location)
        scheme, _, rest = location.partition("://")
        with tempfile.TemporaryDirectory(prefix="vocagno-load-path-") as tmp:
            _check_remote_objects(store, f"{scheme}://{rest.split('/', 1)[0]}", key, Path(tmp))
        return
    path = Path(location)
    if path.is_dir() and not (path / METADATA).exists():
        raise BadCheckpoint(f"{location}: not a checkpoint Composer's load_path loads: a whole .pt file or a sharded "
                            f"checkpoint's folder (with {METADATA})")
    try:
        check_objects(fetch(location, os.devnull))
    except OSError as error:
        raise BadCheckpoint(_reason(error, path)) from error


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
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.metadata import StorageMeta
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    class SafeEmptyPlanner(_EmptyStateDictLoadPlanner):
        """Builds the state dict from the metadata alone; objects other than tensors (the tokenizer's files, the
        timestamp) are unpickled as whole checkpoints are: ``weights_only`` with ``CHECKPOINT_GLOBALS``."""

        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            from torch.distributed.checkpoint._nested_dict import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn],
                        _untrusted(load_torch, value, str(folder)))

    class SafeReader(FileSystemReader):
        def read_metadata(self):
            metadata = _untrusted(read_dcp_metadata, folder / METADATA)
            if not isinstance(parts, set):  # tensors are read, not only the pickled objects (of shards fetched alone)
                _check_tensor_bytes(metadata, folder)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    state: dict[str, Any] = {}
    keys = parts if isinstance(parts, set) else {f"state.{part}" for part in parts}  # a set: flattened names
    try:
        _load_state_dict(state, storage_reader=SafeReader(str(folder)), planner=SafeEmptyPlanner(keys=keys),
                         no_dist=True)
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


# How Composer's HuggingFaceModel saves each tokenizer file into a checkpoint, by extension: what each holds. A .py
# (a tokenizer's own code) is refused: vocagno never runs code from a checkpoint (trust_remote_code is off).
_TOKENIZER_FILES = {".json": (dict, list), ".txt": list, ".jinja": str, ".model": bytes}
# The files a tokenizer_config.json may name, which transformers then opens wherever they are.
_TOKENIZER_FILE_KEYS = ("tokenizer_file", "vocab_file", "merges_file")


def tokenizer_from_state(files: Any, name: str):
    """The tokenizer a checkpoint's ``integrations.huggingface.tokenizer`` holds: each file written, under a name
    checked to stay inside a temporary folder (Composer's own loader writes ``folder / key`` unchecked), and
    loaded from there with no code of its own."""
    from transformers import AutoTokenizer

    if not files:
        raise BadCheckpoint(f"{name}: the checkpoint holds no tokenizer (train.py saves one with the model)")
    if not isinstance(files, dict):
        raise BadCheckpoint(f"{name}: refused: its tokenizer is not a mapping of file names to files")
    config = (files.get("tokenizer_config.json", files.get("tokenizer_config")) or {})
    config = config.get("content") if isinstance(config, dict) else None
    config = config if isinstance(config, dict) else {}
    with tempfile.TemporaryDirectory(prefix="vocagno-tokenizer-") as unpacked:
        for key, saved in files.items():
            extension = saved.get("file_extension") if isinstance(saved, dict) else None
            content = saved.get("content") if isinstance(saved, dict) else None
            if extension not in _TOKENIZER_FILES or not isinstance(content, _TOKENIZER_FILES[extension]):
                raise BadCheckpoint(f"{name}: refused: its tokenizer file {key!r} is a {extension!r} holding a "
                                    f"{type(content).__name__} (vocagno reads {', '.join(_TOKENIZER_FILES)} files "
                                    "of data, never code)")
            filename = key if str(key).endswith(extension) else f"{key}{extension}"
            path = Path(unpacked) / _untrusted(plain_name, filename, name, "tokenizer file name")
            if extension == ".json":
                path.write_text(json.dumps(content), encoding="utf-8")
            elif extension == ".txt":
                path.write_text("".join(f"{line}\n" for line in content), encoding="utf-8")
            elif extension == ".jinja":
                path.write_text(content, encoding="utf-8")
            else:
                path.write_bytes(content)
        # transformers opens a file its tokenizer_config.json names (tokenizer_file, vocab_file, merges_file) before
        # the folder's own, an absolute path or one relative to the working folder alike: only a file of the
        # checkpoint's own is allowed, and given to transformers by its path in the unpacked folder.
        named = {}
        for key in _TOKENIZER_FILE_KEYS:
            value = config.get(key)
            if value is not None:
                path = Path(unpacked) / _untrusted(plain_name, value, f"{name}: its tokenizer_config", key)
                if not path.is_file():
                    raise BadCheckpoint(f"{name}: refused: its tokenizer_config names {key} {value!r}, a file the "
                                        "checkpoint does not hold")
                named[key] = str(path)
        try:
            tokenizer = from_pretrained(AutoTokenizer, unpacked, trust_remote_code=False, **named)
        except UntrustedFile as error:
            raise BadCheckpoint(str(error).replace(unpacked, f"{name}: its tokenizer")) from error
        except Exception as error:  # a crafted tokenizer_config fails anywhere in transformers' parsing of it
            raise BadCheckpoint(f"{name}: its tokenizer can't be loaded: {type(error).__name__}: "
                                f"{_first_line(error)}") from error
    tokenizer.name_or_path = str(config.get("name_or_path") or "")  # not the temporary folder
    return tokenizer


# Fields of a saved config that are only where it came from: dropped (Composer's reader falls back to
# from_pretrained(_name_or_path, **fields), trust_remote_code too). A field that names code is refused
# (vocagno.doors.untrusted.check_config): a checkpoint's config is data, built here by its model_type alone.
_SOURCE_FIELDS = ("_name_or_path", "name_or_path")


def _check_loops(fields, tensors: int, name: str) -> None:
    """``untrusted.check_loops`` against the checkpoint's ``tensors``, as a ``BadCheckpoint``."""
    _untrusted(check_loops, fields, tensors, name)


def _config(saved: dict, name: str, tensors: int):
    """The model config a checkpoint's ``integrations.huggingface.model.config`` holds, of an architecture
    transformers ships, refused where it names code (``check_config``) or loops over more than the checkpoint's
    ``tensors`` (``_check_loops``), without the fields that only say where it came from."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    content = ((saved.get("model") or {}).get("config") or {}).get("content")
    if not isinstance(content, dict) or content.get("model_type") not in CONFIG_MAPPING:
        model_type = content.get("model_type") if isinstance(content, dict) else None
        raise BadCheckpoint(f"{name}: refused: its model config is not one of an architecture transformers ships "
                            f"(model_type {model_type!r})")
    fields = {key: value for key, value in content.items() if key not in _SOURCE_FIELDS}
    _untrusted(check_config, fields, f"{name}: its model config")
    _check_loops(fields, tensors, name)
    if "id2label" in fields and isinstance(fields["id2label"], dict):  # JSON made its keys strings
        fields["id2label"] = {int(key): label for key, label in fields["id2label"].items()}
    try:
        return AutoConfig.for_model(**fields)
    except Exception as error:  # a crafted config fails anywhere in transformers' parsing of its fields
        raise BadCheckpoint(f"{name}: its model config can't be read: {type(error).__name__}: "
                            f"{_first_line(error)}") from error


def _weights(state: dict[str, Any], name: str) -> dict[str, torch.Tensor]:
    """The model's saved tensors by name (FSDP's wrapper prefix taken off), refused where any is not a tensor."""
    model = state["model"]
    if not isinstance(model, dict):
        raise BadCheckpoint(f"{name}: refused: its state.model is not a mapping of names to tensors")
    weights = {}
    for key, value in model.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise BadCheckpoint(f"{name}: refused: its state.model holds {key!r}, which is not a named tensor")
        weights[key.removeprefix("model.")] = value
    return weights


def _check_fits(config, weights: dict[str, torch.Tensor], name: str) -> None:
    """Refuse a config that does not describe the saved ``weights``, before any memory is spent on it: each loop-like
    number bounded by the number of saved tensors, then the model built on the meta device (no storage) and every
    parameter's and persistent buffer's name and shape compared with the weights'."""
    from transformers import AutoModelForCausalLM

    _check_loops(config, len(weights), name)  # again: a config may compute one from others
    model = _untrusted(build_on_meta, AutoModelForCausalLM, config, name)
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    saved = {key: tuple(value.shape) for key, value in weights.items()}
    if expected != saved:
        missing = sorted(set(expected) - set(saved))
        unexpected = sorted(set(saved) - set(expected))
        shapes = sorted(key for key in set(expected) & set(saved) if expected[key] != saved[key])
        what = [f"{len(missing)} missing (first {missing[0]!r})" if missing else "",
                f"{len(unexpected)} unexpected (first {unexpected[0]!r})" if unexpected else "",
                f"{len(shapes)} of another shape (first {shapes[0]!r}: {list(saved[shapes[0]])} saved, "
                f"{list(expected[shapes[0]])} in the config's model)" if shapes else ""]
        raise BadCheckpoint(f"{name}: refused: its weights don't fit the model its config describes: tensors "
                            f"{', '.join(w for w in what if w)}")


def model_from_state(state: dict[str, Any], name: str, dtype: str | None = None):
    """The Hugging Face model and tokenizer a checkpoint's state holds, in ``dtype`` (else the weights' own, float32
    where they mix), built as ``from_pretrained(..., torch_dtype=dtype)`` builds it: constructed in the dtype, then
    given the weights, so buffers the architecture computes itself (RoPE's ``inv_freq``, float32 on purpose) are
    not cast with them. The config is checked against the weights (``_check_fits``) before the model is built."""
    from transformers import AutoModelForCausalLM

    saved = (state.get("integrations") or {}).get("huggingface")
    if not saved or "model" not in state:
        raise BadCheckpoint(f"{name}: not a checkpoint of a Hugging Face model (train.py's): it has no "
                            "state.integrations.huggingface")
    weights = _weights(state, name)
    config = _config(saved, name, len(weights))
    tokenizer = tokenizer_from_state(saved.get("tokenizer"), name)
    _check_fits(config, weights, name)
    if dtype is None:
        dtypes = {tensor.dtype for tensor in weights.values() if tensor.is_floating_point()}
        torch_dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
    else:
        torch_dtype = DTYPES[dtype]
    # Built from the saved config as a causal LM: the saved class is FullyShardedDataParallel in an FSDP run (Composer
    # records the wrapper's class).
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch_dtype, trust_remote_code=False)
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


def model_from_checkpoint(location: str, device: str = "cpu", dtype: str | None = None):
    """The model and tokenizer of the checkpoint at ``location`` (any kind ``fetch`` finds), in ``dtype`` or the
    dtype the run computed in (``RUN_DTYPES``, from its recipe; else the checkpoint's), and its state's other
    parts (timestamp, the run's recipe). Every reader of a ``train.py`` checkpoint loads its model here."""
    if dtype is not None and dtype not in DTYPES:
        raise BadCheckpoint(f"dtype {dtype}: one of {', '.join(DTYPES)}")
    with tempfile.TemporaryDirectory(prefix="vocagno-checkpoint-") as downloads:
        state = read_state(fetch(location, downloads))
    cfg = recipe_config(state, location)
    dtype = dtype or (RUN_DTYPES.get(str(cfg.get("precision"))) if cfg is not None else None)
    model, tokenizer = model_from_state(state, location, dtype)
    return model.to(device), tokenizer, state


# ---- repairing a save folder for autoresume ----

def repair(folder: str) -> None:
    """Make a save folder resumable after a kill or a full disk during a save: a checkpoint whose save was positively
    cut short (``IncompleteCheckpoint``: a whole file that is an empty or unfinished zip, whose directory comes last;
    a sharded folder holding nothing, or only shards without their ``.metadata``, which comes last) is removed, and
    the latest points to the newest complete checkpoint (one saved whole just before the kill included: Composer
    would otherwise refuse to resume before it). Any other checkpoint that can't be read or is refused stops the
    repair with a ``BadCheckpoint`` naming it, and stays where it is. Local folders: each rank's
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
            _check_saved(path)
        except IncompleteCheckpoint as incomplete:
            print(f"removing {path}: an incomplete checkpoint (its save was interrupted): {incomplete}", flush=True)
            remove(path)
            continue
        except (BadCheckpoint, OSError) as error:
            raise BadCheckpoint(f"{_reason(error, path)}: autoresume can't tell that this checkpoint's save was cut "
                                f"short, so it stops and leaves it in place (move it out of {folder} to resume "
                                "without it)") from error
        epoch, batch, rank = map(int, (whole or sharded).groups() + ((0,) if sharded else ()))
        if (batch, epoch) > newest.get(rank, ((-1, -1), None))[0]:
            newest[rank] = ((batch, epoch), path)
    # What Composer loads next, each rank its latest (repointed here, or whatever else left one): checked first.
    latests = {Path(folder) / f"latest-rank{rank}.pt": path for rank, (_, path) in newest.items()}
    for latest in sorted(Path(folder).glob("latest-rank*.pt")):
        latests.setdefault(latest, None)
    for latest, path in latests.items():
        try:
            check_objects(path or _latest_target(latest))
        except (BadCheckpoint, OSError) as error:
            raise BadCheckpoint(f"{_reason(error, path or latest)}: autoresume stops before Composer loads it, and "
                                "leaves it in place") from error
    for latest, path in latests.items():
        if path is not None and not (latest.is_symlink() and os.readlink(latest) == path.name):
            latest.unlink(missing_ok=True)
            latest.symlink_to(path.name)


def _check_saved(path: Path) -> None:
    """Raise ``IncompleteCheckpoint`` where the save at ``path`` (a save folder's whole file or sharded folder) was
    positively cut short, ``BadCheckpoint`` where it is wrong otherwise; judged by what the save itself writes, no
    link inside it followed."""
    if path.is_file():
        fetch(str(path), os.devnull)
        return
    names = [p.name for p in path.iterdir()]
    if METADATA not in names:
        if _only_shards(names):  # nothing, or shards alone: .metadata is written last
            raise IncompleteCheckpoint(f"{path}: an incomplete sharded checkpoint: "
                                       f"{'empty' if not names else 'shards without ' + METADATA}, which is written last")
        raise BadCheckpoint(f"{path}: a checkpoint folder without {METADATA}, holding files a sharded save does not "
                            "write")
    missing = _missing_shards(path / METADATA, lambda name: (path / name).is_file())
    if missing:  # not a save cut short: .metadata is written after every shard
        raise BadCheckpoint(f"{path}: a sharded checkpoint with shards missing: {', '.join(missing)}")


def _reason(error: Exception, path: Path) -> str:
    """An error's one line, naming ``path`` (a ``BadCheckpoint`` names its file already)."""
    if isinstance(error, BadCheckpoint):
        return str(error)
    return f"{path}: can't be read: {getattr(error, 'strerror', None) or error}"


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
            if not _only_shards(name[len(key) + 1:] for name in shards - {f"{key}/{METADATA}"}):
                raise BadCheckpoint(f"{uri}/{checkpoint}: holds objects a sharded save does not write: autoresume "
                                    "can't tell that its upload was cut short, so it stops and leaves it in place")
            # Each rank uploads its own files, in no set order: .metadata without a shard it names is an upload cut
            # short here, where on a local disk (.metadata written after every shard) it is not.
            done = f"{key}/{METADATA}" in shards
            if done:
                with tempfile.TemporaryDirectory() as tmp:
                    store.download_object(f"{key}/{METADATA}", f"{tmp}/{METADATA}")
                    try:
                        done = not _missing_shards(Path(tmp) / METADATA, lambda name: f"{key}/{name}" in shards)
                    except BadCheckpoint as error:
                        raise BadCheckpoint(f"{uri}/{checkpoint}: {str(error).split(': ', 1)[-1]}: autoresume "
                                            "stops and leaves it in place") from error
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
    # Composer's autoresume downloads a plain latest-rank{r}.pt object before it looks for its .symlink: not Composer's
    # to upload, and it would be loaded unchecked.
    planted = sorted(name for name in names if re.fullmatch(rf"{re.escape(prefix)}/latest-rank\d+\.pt", name))
    if planted:
        raise BadCheckpoint(f"{uri}: {', '.join(planted)}: a latest object Composer's autoresume would load before "
                            "its .symlink; Composer uploads none: autoresume stops (delete it to resume)")
    link = f"{prefix}/{LATEST}.symlink"
    scheme, _, rest = uri.partition("://")
    bucket = f"{scheme}://{rest.split('/', 1)[0]}"
    with tempfile.TemporaryDirectory(prefix="vocagno-repair-") as tmp:
        old = None
        if link in names:
            store.download_object(link, f"{tmp}/old")
            old = read_bytes(f"{tmp}/old", cap_name="json_bytes").decode(errors="replace").strip()
        newest = f"{prefix}/{max(complete)[1]}" if complete else old
        if newest is None:
            return
        try:  # what Composer downloads and loads next: its objects downloaded and checked first
            _check_remote_objects(store, bucket, newest, Path(tmp) / "check")
        except (BadCheckpoint, OSError) as error:
            raise BadCheckpoint(f"{_reason(error, Path(newest))}: autoresume stops before Composer loads it, and "
                                "leaves it in place") from error
        if newest != old:
            Path(f"{tmp}/new").write_text(newest)
            store.upload_object(link, f"{tmp}/new")


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
