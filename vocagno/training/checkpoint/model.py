"""A Hugging Face model (and its tokenizer) built from a checkpoint's state: its config by ``model_type`` alone, its
weights checked against it, in the dtype the run computed in; nothing in the checkpoint is run."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from vocagno.doors.untrusted import UntrustedFile, build_on_meta, check_config, check_loops, from_pretrained, plain_name
from vocagno.training.checkpoint.files import BadCheckpoint, _first_line, _untrusted, fetch
from vocagno.training.checkpoint.state import read_state, recipe_config


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Composer's precisions and the dtype a run computed in: a model is loaded (and published) in it.
RUN_DTYPES = {"amp_bf16": "bfloat16", "amp_fp16": "float16", "fp32": "float32"}
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
