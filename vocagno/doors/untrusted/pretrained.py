"""Hugging Face models and tokenizers from elsewhere, loaded by ``from_pretrained``: ``trust_remote_code`` explicit
(off unless the user's own yaml turns it on), a local folder's files regular and inside it, its config without
``CODE_FIELDS`` (``check_config``), its loops bounded (``check_loops``) and no larger than its weights
(``saved_shapes``, ``build_on_meta``, ``check_model_fits``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vocagno.doors.untrusted.files import (
    UntrustedFile, _over_cap, _whole, cap, check_folder, inside, open_regular, read_json, reason,
)
from vocagno.doors.untrusted.torch_files import check_torch_zip

__all__ = ["ATTENTION_IMPLEMENTATIONS", "CODE_FIELDS", "LOOP_FIELDS", "LOOP_LIKE", "WEIGHT_FILES", "build_on_meta",
           "check_config", "check_loops", "check_model_fits", "from_pretrained", "saved_shapes"]


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
