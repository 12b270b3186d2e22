"""Train a student with Composer, guided by a teacher of another vocabulary (VocAgnoLM), in llm-foundry's conventions.

    composer train.py yamls/qwen_teacher.yaml [key=value ...]      # every GPU of the node
    python train.py yamls/tiny.yaml max_duration=6ba save_folder=runs/x save_interval=3ba autoresume=true

The yaml (omegaconf, ``${variables.x}`` interpolation, command-line overrides as dotted keys) has llm-foundry's keys;
unknown or misspelled keys are an error. ``teacher:`` plus ``algorithms: {vocagno: {...}}`` train with the teacher;
``teachers: {NAME: {...}, ...}`` (each with ``teacher:``'s keys) with several (``vocagno.teacher.several``);
without a teacher it is plain continual pretraining (``yamls/cpt_baseline.yaml``). Models are Hugging Face names or folders
(``name_or_path``), or built with random weights from a ``config`` (``model_type`` and its fields).
"""

from __future__ import annotations

import atexit
import difflib
import functools
import importlib
import os
import re
import signal
import sys
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, NamedTuple
from unittest import mock

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from composer import Evaluator, Trainer  # noqa: E402
from composer.callbacks import CheckpointSaver  # noqa: E402
from composer.models import HuggingFaceModel  # noqa: E402
from composer.optim import CosineAnnealingWithWarmupScheduler, DecoupledAdamW  # noqa: E402
from composer.utils import (  # noqa: E402
    collect_env, dist, format_name_with_dist, get_device, partial_format, reproducibility,
)
from omegaconf import DictConfig  # noqa: E402
from omegaconf import OmegaConf as om  # noqa: E402
from streaming import Stream, StreamingDataset  # noqa: E402

from vocagno.memory import keep_freed_memory  # noqa: E402
from vocagno.training.config import (  # noqa: E402
    build_causal_lm, check_names, keyword_names, load_config, plain, published_yaml, scoring_teachers, section_teacher,
    speed_options)
from vocagno.entry import INTERRUPTED_EXIT, run  # noqa: E402
from vocagno.data.dataset import teacher_guided_loader  # noqa: E402
from vocagno.data.streaming import clean_leaked_shared_memory  # noqa: E402
from vocagno.core.fsdp import wrap_per_decoder_layer  # noqa: E402
from vocagno.core.kernels import check_compile_config, check_kernels, check_speed, use_kernels  # noqa: E402
from vocagno.training.checkpoint import (  # noqa: E402
    BadCheckpoint, has_latest, private_folder, repair, resolve, resolve_remote, take)
from vocagno.shown import terminal  # noqa: E402
from vocagno.training.plan import plan_line  # noqa: E402
from vocagno.doors.untrusted import reason  # noqa: E402
from vocagno.doors.writing import remove  # noqa: E402
from vocagno.training.loggers import (  # noqa: E402
    ConsoleLine, JSONLinesLogger, Narration, RunPicture, RunRecipe, SampleLog)
from vocagno.training.metrics import BitsPerByte  # noqa: E402
from vocagno.core.tokenization import load_tokenizer  # noqa: E402
from vocagno.core.loss import COMBINE  # noqa: E402
from vocagno.errors import Refused  # noqa: E402

ALGORITHM_GROUP = "llmfoundry_algorithms"  # the entry points llm-foundry's registry reads; vocagno registers there
# vocagno's own entry points (pyproject.toml's), found also where the package runs from a checkout pip never installed
# (on PYTHONPATH, as on the GPU image of ../shared/gpu/README.md): no entry point is registered there.
OWN_ALGORITHMS = {"vocagno": "vocagno.algorithms.vocagno_lm:VocAgnoLM", "uld": "vocagno.algorithms.baselines:ULD",
                  "kld": "vocagno.algorithms.baselines:KLD"}
# The algorithms that use the teacher: section, and which of its keyword arguments each takes.
TEACHER_ALGORITHMS = {
    "vocagno": ("teacher", "teacher_tokenizer", "teacher_dtype", "teacher_placement", "chunk_size",
                "trust_remote_code", "teacher_kernels", "teacher_compile_config"),
    "uld": ("teacher", "teacher_dtype", "chunk_size", "trust_remote_code"),
    "kld": ("teacher", "teacher_tokenizer", "teacher_dtype", "chunk_size", "trust_remote_code"),
}
# llm-foundry's names for Composer's loggers and callbacks (its registries), and vocagno's own.
LOGGERS: dict[str, Any] = {
    "wandb": "WandBLogger", "mlflow": "MLFlowLogger", "tensorboard": "TensorboardLogger", "inmemory": "InMemoryLogger",
    "jsonl": JSONLinesLogger, "picture": RunPicture,
}
CALLBACKS: dict[str, Any] = {
    "speed_monitor": "SpeedMonitor", "lr_monitor": "LRMonitor", "memory_monitor": "MemoryMonitor",
    "memory_snapshot": "MemorySnapshot", "runtime_estimator": "RuntimeEstimator",
    "optimizer_monitor": "OptimizerMonitor", "nan_monitor": "NaNMonitor", "system_metrics_monitor": "SystemMetricsMonitor",
    "early_stopper": "EarlyStopper", "oom_observer": "OOMObserver", "generate_callback": "Generate",
    "load_checkpoint": "LoadCheckpoint",
    "sample_log": SampleLog,
}

def _signal_files_per_node() -> None:
    """Composer's file-based waits within a node (autoresume, checkpoint downloads) name their signal file after node
    0 on every node: the name is broadcast from rank 0. In a save folder every node shares, the nodes then write and
    remove one file, and the second removal fails (FileNotFoundError; mosaicml/llm-foundry#1736, unfixed in Composer
    0.32.1). Each node's wait gets a name of its own: its node rank where node 0's stood."""
    broadcast_name = dist.get_node_signal_file_name

    def per_node(rng=None):
        return re.sub(r"_node\d+_", f"_node{dist.get_node_rank()}_", broadcast_name(rng), count=1)

    dist.get_node_signal_file_name = per_node


_PY_CPUINFO_MODEL = collect_env.get_cpu_model


@functools.lru_cache(maxsize=1)
def _cpu_model_from_proc() -> str:
    """Composer records the CPU's model in every checkpoint, asking py-cpuinfo, which runs a Python subprocess for it
    (about 1.2 s of CPU at the start of every rank); Linux names the model in /proc/cpuinfo. Elsewhere, or where it
    names none, py-cpuinfo is asked as before. ``main`` puts it in Composer's place."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return _PY_CPUINFO_MODEL()


# The converter's flags a run's convert_if_missing does not take: the run gives the folder and converts it whole.
RUN_DECIDES = ("out_root", "num_jobs", "job_index", "merge_only", "allow_partial")
# The keys of a loader's dataset: Streaming's, but the batch size, which the loader gives.
DATASET_KEYS = [key for key in keyword_names(StreamingDataset) if key != "batch_size"]


def dataset_locals(cfg: DictConfig) -> list[str]:
    """The local folders the run's datasets register with Streaming (train and eval, one dataset's or each stream's),
    as Streaming registers them: ``local`` joined with ``split``."""
    folders = []
    for section in ("train_loader", "eval_loader"):
        dataset = om.select(cfg, f"{section}.dataset")
        if dataset is None:
            continue
        for one in [dataset, *(dataset.get("streams") or {}).values()]:
            if one.get("local"):
                folders.append(os.path.join(str(one.local), str(one.get("split") or "")))
    return folders


def build_loader(section: DictConfig, student_tok, teacher_tok, batch_size: int, name: str = "train_loader",
                 flags: str = "--student-tokenizer ... --teacher-tokenizer ..."):
    """The loader of the yaml's section ``name`` (train_loader or eval_loader), its shards converted first where
    ``convert_if_missing`` says so; ``flags``: the converter's flags a missing folder's message suggests."""
    dataset_cfg = om.to_container(section.dataset)
    convert = section.get("convert_if_missing")
    folders = [(f"{name}.dataset", dataset_cfg, convert)]
    folders += [(f"{name}.dataset.streams.{key}", stream, None)
                for key, stream in (dataset_cfg.get("streams") or {}).items()]
    for where, one, converting in folders:
        if one.get("local") is not None and one.get("remote") is None:
            local = os.path.join(str(one["local"]), str(one["split"])) if one.get("split") else str(one["local"])
            _convert_if_missing(local, om.to_container(converting) if converting is not None else None, where, flags)
    return teacher_guided_loader(
        dataset_cfg, student_tok, teacher_tok, batch_size, teacher_seq_len=section.get("teacher_seq_len"),
        num_workers=section.get("num_workers", 0), drop_last=section.get("drop_last", True),
    )


def _convert_if_missing(local: str, convert: dict[str, Any] | None, where: str, flags: str) -> None:
    """Shards where a loader reads (``local``, named at ``where``), converted first when they are missing and the yaml
    that names the folder says what to convert into it (``convert_if_missing``): by the node's first rank, the others
    wait. Missing otherwise: a ValueError naming the folder and how to make it."""
    missing = not (Path(local) / "index.json").is_file()
    section = where.split(".")[0]
    converts = convert is not None and "not_for" not in convert
    if missing and not converts:
        why = f" ({convert['not_for']})" if convert else ""
        also = f", or say what to convert into it with {section}.convert_if_missing.input=FILE" \
            if where.endswith(".dataset") else ""
        raise ValueError(
            f"{where}.local: {local} holds no converted shards{why}; convert your corpus into it first "
            f"(python conversion/convert_dataset.py --input FILE --out-root {local} {flags}: docs/conversion.md)"
            f"{also}")
    if not converts:
        return
    if missing and dist.get_local_rank() == 0:
        from conversion.convert_dataset import main as convert_main

        print(f"{section}: converting {terminal(convert.get('input'))} into {terminal(local)} (convert_if_missing)",
              flush=True)
        args = ["--out-root", local]
        for key, value in convert.items():
            args += [f"--{key.replace('_', '-')}", *(map(str, value) if isinstance(value, list) else [str(value)])]
        convert_main(args)
    dist.barrier()


def check_sections(cfg: DictConfig) -> None:
    """The keys of the sections ``load_config`` leaves free-form, each against what reads it: an algorithm's, a logger's
    or a callback's options against its class, a loader's dataset against Streaming's, ``convert_if_missing``
    against the converter's flags. Before anything is loaded: a misspelled key is one line naming the closest one."""
    for section in ("algorithms", "loggers", "callbacks"):
        for name, kwargs in _plain(cfg, section).items():
            if kwargs is None or (section, name, kwargs) == ("loggers", "console", True):  # console=true: on
                continue
            if not isinstance(kwargs, dict):
                raise ValueError(f"{section}.{name}: give its options as a mapping ({{}} for none), got {kwargs!r}")
            made = _algorithm(name) if section == "algorithms" else \
                ConsoleLine if (section, name) == ("loggers", "console") else _known(section, name)
            check_names(f"{section}.{name}.", kwargs, [] if made is ConsoleLine else keyword_names(made) or kwargs)
    if _plain(cfg, "loggers").get("console") is not None:
        _batches(cfg.get("console_log_interval") or "1ba", "console_log_interval")
    for section in ("train_loader", "eval_loader"):
        dataset = om.select(cfg, f"{section}.dataset")
        dataset = om.to_container(dataset) if dataset is not None else {}
        check_names(f"{section}.dataset.", dataset, DATASET_KEYS)
        for key, stream in (dataset.get("streams") or {}).items():
            check_names(f"{section}.dataset.streams.{key}.", stream or {}, keyword_names(Stream))
        convert = om.select(cfg, f"{section}.convert_if_missing")
        if convert is not None and not isinstance(convert, DictConfig):
            raise ValueError(f"{section}.convert_if_missing: give the converter's flags as a mapping ({{input: FILE, "
                             f"...}}), got {convert!r}")
        if convert is not None and "not_for" not in convert:
            from conversion.convert_dataset import parse_args

            check_names(f"{section}.convert_if_missing.", convert,
                        [flag for flag in vars(parse_args(["--out-root", "-"])) if flag not in RUN_DECIDES])
            if convert.get("input") is None:
                raise ValueError(f"{section}.convert_if_missing: give its input, the corpus to convert")


def _algorithm(name: str):
    """The class registered as algorithm ``name``: vocagno's own (over what an install's metadata may still name), or
    an entry point of llm-foundry's group."""
    available = {ep.name: ep for ep in entry_points(group=ALGORITHM_GROUP)}
    available.update({name: EntryPoint(name, value, ALGORITHM_GROUP) for name, value in OWN_ALGORITHMS.items()})
    if name not in available:
        close = difflib.get_close_matches(name, list(available), n=1)
        hint = f" (did you mean algorithms.{close[0]}?)" if close else ""
        raise ValueError(f"unknown algorithm algorithms.{name}{hint}; registered ({ALGORITHM_GROUP}): "
                         f"{', '.join(available)}")
    return available[name].load()


def conversion_flags(cfg: DictConfig) -> str:
    """The converter's flags that make shards this run reads: its student's and teacher's tokenizers, its
    ``variables.seq_len`` (or the student's positions)."""
    teacher = om.select(cfg, "teacher.tokenizer") or "..."
    seq_len = om.select(cfg, "variables.seq_len") or om.select(cfg, "model.config.max_position_embeddings")
    return f"--student-tokenizer {cfg.tokenizer.name} --teacher-tokenizer {teacher}" + (
        f" --seq-len {seq_len}" if seq_len else "")


def build_algorithms(cfg: DictConfig, teacher_tok) -> list:
    algorithms = []
    chosen = {name: kwargs for name, kwargs in _plain(cfg, "algorithms").items() if kwargs is not None}  # null: off
    for name, kwargs in chosen.items():
        made = _algorithm(name)
        kwargs = dict(kwargs)
        if name in TEACHER_ALGORITHMS and cfg.get("teachers") is not None:
            if name != "vocagno":
                raise ValueError(f"teachers: only algorithms.vocagno takes several teachers, not algorithms.{name}")
            kwargs["teachers"] = set_of_teachers(cfg)
        elif name in TEACHER_ALGORITHMS:
            if cfg.get("teacher") is None:
                raise ValueError(f"algorithms.{name} needs a teacher: section")
            kwargs.update(teacher_kwargs(cfg.teacher, teacher_tok, TEACHER_ALGORITHMS[name], cfg.seed))
        algorithms.append(made(**kwargs))
    if (cfg.get("teacher") or cfg.get("teachers")) is not None and not set(chosen) & set(TEACHER_ALGORITHMS):
        raise ValueError(f"a teacher without one of algorithms.{{{', '.join(TEACHER_ALGORITHMS)}}} would be loaded "
                         "and never used")
    return algorithms


def set_of_teachers(cfg: DictConfig) -> dict[str, Any]:
    """The yaml's ``teachers:`` (each entry with ``teacher:``'s keys, its tokenizer required) as
    ``vocagno.teacher.teacher.Teacher`` s by name."""
    made = {}
    for name, section in cfg.teachers.items():
        if not isinstance(section, DictConfig):
            raise ValueError(f"teachers.{name}: needs teacher:'s keys, got {section!r}")
        if section.get("tokenizer") is None:
            raise ValueError(f"teachers.{name}: needs its tokenizer")
        made[name] = section_teacher(section, load_tokenizer(section.tokenizer), cfg.seed, name)
    return made


def teacher_kwargs(section: DictConfig, teacher_tok, takes: tuple[str, ...], seed: int) -> dict[str, Any]:
    """The ``teacher:`` section (``section_teacher``) as the keyword arguments of an algorithm that ``takes`` them."""
    # A named teacher is loaded by the algorithm; a config-built one (random weights) is built here.
    teacher = section_teacher(section, teacher_tok, seed)
    kwargs = {"teacher": teacher.model, "teacher_tokenizer": teacher_tok, "teacher_dtype": teacher.dtype,
              "teacher_placement": teacher.placement, "chunk_size": teacher.chunk_size,
              "trust_remote_code": teacher.trust_remote_code, "teacher_kernels": teacher.kernels,
              "teacher_compile_config": teacher.compile_config}
    if section.get("placement") is not None and "teacher_placement" not in takes:
        raise ValueError("teacher.placement: only algorithms.vocagno shards its teacher; the others replicate it")
    for key in ("kernels", "compile_config"):
        if section.get(key) is not None and f"teacher_{key}" not in takes:
            raise ValueError(f"teacher.{key}: only algorithms.vocagno's teacher takes it; the others read its logits "
                             "through PyTorch's own kernels")
    return {key: value for key, value in kwargs.items() if key in takes}


def student_flops_per_batch(student: torch.nn.Module):
    """A batch's training FLOPs for the student, counted as llm-foundry counts them for MFU: 6 per parameter and
    token (forward and backward) plus attention's 12 x layers x width x sequence length per token. The teacher's
    forward and the batch scope's scoring pass are not counted: the MFU is the student's, comparable with a plain
    run's."""
    params = sum(p.numel() for p in student.parameters())
    layers, width = student.config.num_hidden_layers, student.config.hidden_size

    def flops(batch: dict[str, torch.Tensor]) -> int:
        rows, seq_len = batch["input_ids"].shape[:2]
        return rows * seq_len * (6 * params + 12 * layers * width * seq_len)

    return flops


def _plain(cfg: DictConfig, key: str) -> dict[str, Any]:
    value = cfg.get(key)
    return om.to_container(value) if value is not None else {}


def build_loggers(cfg: DictConfig, load_path: str | None = None, resuming: bool = False) -> tuple[list, list]:
    """``loggers:`` and ``callbacks:`` by llm-foundry's names (``LOGGERS``, ``CALLBACKS``) with their kwargs; a null
    entry is off (``loggers.console=null`` on the command line). ``loggers.console`` prints one line every
    ``console_log_interval`` (``ConsoleLine``). ``load_checkpoint`` loads ``load_path`` (the private copy of the one
    its yaml names) where given, and is left out where the run ``resuming`` loads its latest instead."""
    chosen = {section: {k: v for k, v in _plain(cfg, section).items() if v is not None}
              for section in ("loggers", "callbacks")}
    if "load_checkpoint" in chosen["callbacks"]:
        if resuming:
            del chosen["callbacks"]["load_checkpoint"]
        elif load_path is not None:
            chosen["callbacks"]["load_checkpoint"] = {**chosen["callbacks"]["load_checkpoint"], "load_path": load_path}
    loggers = [_build("loggers", name, kwargs) for name, kwargs in chosen["loggers"].items() if name != "console"]
    if "console" in chosen["loggers"]:
        loggers.append(ConsoleLine(_batches(cfg.get("console_log_interval") or "1ba", "console_log_interval")))
    callbacks = [_build("callbacks", name, kwargs) for name, kwargs in chosen["callbacks"].items()]
    return loggers, callbacks


def _batches(value: Any, key: str) -> int:
    """A number of batches given as ``10ba`` (a bare number would mean epochs to Composer: refused)."""
    found = re.fullmatch(r"\s*(\d+)\s*ba\s*", str(value)) if isinstance(value, str) else None
    if found is None or int(found.group(1)) < 1:
        raise ValueError(f"{key} must be a number of batches (10ba), got {value!r}")
    return int(found.group(1))


def _build(section: str, name: str, kwargs: dict[str, Any] | None):
    made = _known(section, name)
    try:
        return made(**kwargs)
    except TypeError as error:
        raise ValueError(f"{section}.{name}: {error}") from error


def _known(section: str, name: str):
    """The class of logger or callback ``name`` (``section``: loggers or callbacks) by llm-foundry's name."""
    known = LOGGERS if section == "loggers" else CALLBACKS
    if name not in known:
        close = difflib.get_close_matches(name, list(known) + ["console"] * (section == "loggers"), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        names = ", ".join(sorted(list(known) + ["console"] * (section == "loggers")))
        raise ValueError(f"unknown {section[:-1]} {section}.{name}{hint}; known: {names}")
    made = known[name]
    if isinstance(made, str):  # Composer's class of that name, imported when asked for (wandb, mlflow: optional)
        made = getattr(importlib.import_module(f"composer.{section}"), made)
    return made


def build_optimizer(cfg: DictConfig, model: torch.nn.Module) -> DecoupledAdamW:
    opt = cfg.optimizer
    if opt.get("name", "decoupled_adamw") != "decoupled_adamw":
        raise ValueError(f"optimizer.name: only decoupled_adamw is supported, got {opt.name!r}")
    return DecoupledAdamW(
        model.parameters(), lr=opt.lr, betas=tuple(opt.get("betas", (0.9, 0.95))), eps=opt.get("eps", 1e-8),
        weight_decay=opt.get("weight_decay", 0.0),
    )


def student_model(student: torch.nn.Module, tokenizer) -> HuggingFaceModel:
    """Composer's model around the student: logits out, labels shifted (a causal LM), bits per byte in evaluation.

    HuggingFaceModel asks whether the model is a registered causal LM by importing every causal-LM class transformers
    has (1.0-1.4 s of CPU at the start of every rank); the answer only decides ``shift_labels`` when it is not given,
    and it is given here, so the question is not asked."""
    from composer.models import huggingface

    with mock.patch.object(huggingface, "_is_registered_causal_lm", lambda model: True):
        return HuggingFaceModel(student, tokenizer=tokenizer, use_logits=True, shift_labels=True,
                                eval_metrics=[BitsPerByte()])


# How often the saver looks whether a checkpoint has reached the object store before it points the latest link at
# it. Composer looks every 30 s, and a run waits for that before it ends: up to 30 s more of every run that saves to a
# store, on every node. A lookup of the checkpoint's object a second (on S3 a GET) costs little.
LATEST_LINK_POLL_SECONDS = 1.0


def promptly_linked(trainer: Trainer) -> None:
    """The trainer's checkpoint saver looks every second, not every 30 s, whether a checkpoint has reached the store
    before it links it."""
    for callback in trainer.state.callbacks:
        if isinstance(callback, CheckpointSaver):
            callback._symlink_upload_wait_before_next_try_in_seconds = LATEST_LINK_POLL_SECONDS  # no public setting


# The events of Composer's LoadCheckpoint that come while the Trainer is made, before the private copy goes.
LOAD_EVENTS = ("init", "before_load", "after_load")


class Loading(NamedTuple):
    """The checkpoint a run loads: the key that chose it (``autoresume``, ``callbacks.load_checkpoint.load_path``),
    where it is, and the private copy Composer is handed (its node's, on every rank)."""
    key: str
    origin: str
    copy: str


def take_checkpoint(cfg: DictConfig) -> tuple[Loading | None, Path | None]:
    """The checkpoint this run loads, chosen by vocagno alone as Composer would choose it (autoresume's latest in the
    save folder, repaired first, else ``callbacks.load_checkpoint.load_path``): the first rank resolves it to one
    checkpoint (a save folder's latest followed once) for every node, and each node's first rank copies or downloads
    exactly that into a private folder and checks it there (``take``): Composer loads that copy and nothing else, so
    no file renamed, swapped or planted in a folder or bucket others write is loaded unchecked. Returns the loading
    (None where nothing is loaded) and, on each node's first rank, the private folder to remove once Composer has
    loaded it (removed at exit in any case). A refusal, or any failure to take it, on any rank ends every rank with
    its one line."""
    save_folder = cfg.get("save_folder")
    folder = format_name_with_dist(str(save_folder), cfg.run_name) if save_folder else None
    resumes = bool(cfg.get("autoresume", False) and folder)
    chosen: tuple | None = None
    if dist.get_global_rank() == 0:
        try:
            chosen = _chosen_checkpoint(cfg, folder, resumes)
        except Exception as error:  # noqa: BLE001 (every rank must reach the gather, told why)
            chosen = ("refused", _refusal_line(error, "autoresume" if resumes else "load_path"))
    chosen = dist.all_gather_object(chosen)[0]
    mine, private = None, None
    if chosen is not None and chosen[0] != "refused" and dist.get_local_rank() == 0:
        key, origin = chosen
        try:
            private = private_folder()
            atexit.register(remove, private)
            mine = ("taken", str(take(origin, private)))
        except Exception as error:  # noqa: BLE001
            mine = ("refused", _refusal_line(error, key))
    gathered = dist.all_gather_object(mine)
    refused = chosen[1] if chosen is not None and chosen[0] == "refused" else next(
        (line for state, line in filter(None, gathered) if state == "refused"), None)
    if refused is not None:
        if private is not None:
            remove(private)
        raise Refused(refused)
    if chosen is None:
        return None, None
    leader = gathered[dist.get_global_rank() - dist.get_local_rank()]
    return Loading(chosen[0], chosen[1], leader[1]), private


def _chosen_checkpoint(cfg: DictConfig, folder: str | None, resumes: bool) -> tuple[str, str] | None:
    """(the key that chose it, the one checkpoint it names) of what this run loads, or None. Autoresume's save folder
    is repaired first (once, here: two nodes repairing one folder would race)."""
    if resumes:
        try:
            repair(folder)
        except BadCheckpoint as error:  # it names the checkpoint and why; nothing was deleted
            raise Refused(f"autoresume: {error}") from None
        if has_latest(folder):
            return "autoresume", resolve_remote(folder) if "://" in folder else str(resolve(folder))
    load_checkpoint = _plain(cfg, "callbacks").get("load_checkpoint") or {}
    load_path = load_checkpoint.get("load_path")
    if load_path is None:
        return None
    event = str(load_checkpoint.get("event", "before_load")).lower()
    if event not in LOAD_EVENTS:
        raise Refused(f"callbacks.load_checkpoint.event: {event}: the checked copy of load_path is loaded while the "
                      f"trainer is made, and removed then: give one of {', '.join(LOAD_EVENTS)}")
    key = "callbacks.load_checkpoint.load_path"
    location = partial_format(str(load_path), run_name=cfg.run_name, rank=0, local_rank=0, node_rank=0)
    try:
        return key, resolve_remote(location) if "://" in location else str(resolve(location))
    except BadCheckpoint as error:
        raise Refused(f"{key}: {error}") from None


def _refusal_line(error: Exception, key: str) -> str:
    """What ends every rank: a refusal's own line, a checkpoint's named by the key that chose it, anything else with
    its type."""
    if isinstance(error, BadCheckpoint):
        return f"{key}: {error}"
    if isinstance(error, Refused):
        return str(error)
    return f"{key}: {reason(error)}"


def check_speed_options(cfg: DictConfig) -> None:
    """The student's and the teachers' kernels and compile options, refused in one line before anything is converted
    or loaded (``vocagno.core.kernels``)."""
    check_kernels(speed_options(cfg.model)[0], "model.kernels")
    check_compile_config(plain(cfg.get("compile_config")), "compile_config")
    sections = {"teacher": cfg.teacher} if cfg.get("teacher") is not None else {}
    sections.update({f"teachers.{name}": section for name, section in (cfg.get("teachers") or {}).items()
                     if isinstance(section, DictConfig)})
    for where, section in sections.items():
        check_speed(*speed_options(section), section.get("chunk_size"), where)


def main(cfg: DictConfig) -> Trainer:
    check_sections(cfg)
    check_speed_options(cfg)
    if not torch.cuda.is_available():  # the steps' logits and gradients reused, not faulted in again each step
        keep_freed_memory()
    dist.initialize_dist(get_device(None), timeout=cfg.get("dist_timeout", 600))
    _signal_files_per_node()
    loading, private = take_checkpoint(cfg)  # removed as soon as Composer has loaded it
    collect_env.get_cpu_model = _cpu_model_from_proc  # the same function however often main runs
    clean_leaked_shared_memory(dataset_locals(cfg))  # what a killed run left on them would refuse Streaming
    reproducibility.seed_all(cfg.seed)
    world = dist.get_world_size()
    if cfg.global_train_batch_size % world:
        raise ValueError(f"global_train_batch_size {cfg.global_train_batch_size} is not divisible by {world} ranks")
    device_batch = cfg.global_train_batch_size // world

    student_tok = load_tokenizer(cfg.tokenizer.name)
    if cfg.get("teacher") is not None and cfg.get("teachers") is not None:
        raise Refused("give teacher: (one) or teachers: (several, by name), not both: where a base: yaml gives "
                      "teacher:, set teacher: null beside your teachers:")
    # Several teachers: the shards' teacher tokens are taken as they are; the algorithm finds the teacher they fit.
    teacher_tok = load_tokenizer(cfg.teacher.tokenizer) if cfg.get("teacher") is not None else None
    flags = conversion_flags(cfg)  # what a missing folder's message suggests converting with
    train_loader = build_loader(cfg.train_loader, student_tok, teacher_tok, device_batch, "train_loader", flags)
    samples = train_loader.dataset.size
    if train_loader.drop_last and samples < cfg.global_train_batch_size:
        # Every epoch would end before its first batch, and training would spin through empty epochs forever.
        raise ValueError(
            f"the training shards ({om.select(cfg, 'train_loader.dataset.local') or 'its streams'}) hold {samples} "
            f"samples, fewer than one global "
            f"batch of {cfg.global_train_batch_size}: convert more text, or lower global_train_batch_size"
        )
    if dist.get_global_rank() == 0:
        try:
            plan = plan_line(cfg, samples, train_loader.dataset.metadata.seq_len)
        except ValueError as error:  # a duration it can't count in batches: Composer's to judge
            plan = f"training for {cfg.max_duration} ({error})"
        print(terminal(plan), flush=True)
    evaluators = []
    if cfg.get("eval_loader") is not None:
        eval_batch = cfg.get("device_eval_batch_size") or cfg.device_train_microbatch_size
        evaluators.append(Evaluator(
            label="eval",
            dataloader=build_loader(cfg.eval_loader, student_tok, teacher_tok, eval_batch, "eval_loader", flags),
            metric_names=["BitsPerByte"],
        ))

    student = build_causal_lm(cfg.model, len(student_tok), cfg.seed)  # the same init for a seed, whatever the method
    student.config.use_cache = False  # no KV cache in training forwards; vocagno.export publishes it turned on
    positions = getattr(student.config, "max_position_embeddings", None)
    seq_len = train_loader.dataset.metadata.seq_len
    if positions is not None and positions < seq_len:
        raise ValueError(f"the shards' samples hold {seq_len} student tokens, but the student (model) has "
                         f"max_position_embeddings={positions}: convert with --seq-len {positions} or less")
    use_kernels(student, speed_options(cfg.model)[0], "model.kernels")
    compile_config = plain(cfg.get("compile_config"))  # Composer compiles the student's forward
    model = student_model(wrap_per_decoder_layer(student), student_tok)
    model.flops_per_batch = student_flops_per_batch(student)  # SpeedMonitor's MFU
    algorithms = build_algorithms(cfg, teacher_tok)

    optimizer = build_optimizer(cfg, model)
    sched = cfg.scheduler
    if sched.get("name", "cosine_with_warmup") != "cosine_with_warmup":
        raise ValueError(f"scheduler.name: only cosine_with_warmup is supported, got {sched.name!r}")
    scheduler = CosineAnnealingWithWarmupScheduler(t_warmup=sched.t_warmup, alpha_f=sched.get("alpha_f", 0.0))

    save_folder = cfg.get("save_folder")
    # Composer loads the private copy: as load_path where the run resumes (autoresume's latest replaces whatever
    # load_path would have loaded, as in Composer), else in the load_checkpoint callback's place.
    resuming = loading is not None and loading.key == "autoresume"
    loggers, callbacks = build_loggers(cfg, load_path=None if loading is None or resuming else loading.copy,
                                       resuming=resuming)
    console = _plain(cfg, "loggers").get("console") is not None
    fsdp = om.to_container(cfg.fsdp_config) if cfg.get("fsdp_config") is not None else None
    trainer = Trainer(
        model=model,
        train_dataloader=train_loader,
        eval_dataloader=evaluators or None,
        eval_interval=cfg.get("eval_interval", 1) if evaluators else 1,  # none: Composer warns of an interval
        eval_subset_num_batches=cfg.get("eval_subset_num_batches", -1),
        optimizers=optimizer,
        schedulers=scheduler,
        algorithms=algorithms,
        max_duration=cfg.max_duration,
        device_train_microbatch_size=cfg.device_train_microbatch_size,
        precision=cfg.get("precision"),
        compile_config=compile_config,
        parallelism_config={"fsdp": fsdp} if fsdp else None,
        save_folder=cfg.get("save_folder"),
        save_interval=cfg.get("save_interval", "1ep"),
        save_num_checkpoints_to_keep=cfg.get("save_num_checkpoints_to_keep", -1),
        save_overwrite=cfg.get("save_overwrite", False),
        autoresume=False,  # vocagno chose what the run resumes from: load_path, its private copy
        load_path=loading.copy if resuming else None,
        run_name=cfg.run_name,
        loggers=loggers,
        callbacks=[*callbacks, RunRecipe(published_yaml(cfg))],
        log_to_console=False,  # loggers.console: ConsoleLine
        progress_bar=cfg.get("progress_bar", not console),  # not both: they print the same metrics
        seed=cfg.seed,
        device=None,
    )
    promptly_linked(trainer)
    dist.barrier()  # every rank of the node has loaded the copy
    if private is not None:
        remove(private)
    folder = format_name_with_dist(save_folder, cfg.run_name) if save_folder else None
    narration = Narration(folder)
    trainer.state.callbacks.append(narration)  # after Composer's saver: it says what the saver just saved
    batch = int(trainer.state.timestamp.batch)
    if batch > 0 and dist.get_global_rank() == 0:
        origin = terminal(loading.origin) if loading else "a checkpoint"
        print(f"resuming at batch {batch + 1} from {origin}", flush=True)
    try:
        trainer.fit()
    except FileExistsError as error:  # Composer's saver, in its own words (overwrite=True), before the first batch
        if "may conflict with a future checkpoint" not in str(error):
            raise
        raise Refused(f"save_folder {folder} holds checkpoints past where this run starts "
                      f"({Path(str(error).split(' may conflict')[0]).name}, ...): set autoresume: true to continue "
                      "that run, save_overwrite: true to write over them, or give another save_folder") from None
    except KeyboardInterrupt:
        if dist.get_global_rank() == 0:
            saved = narration.saved()
            where = (f"the last checkpoint saved: {saved[-1]}" if saved else "no checkpoint saved yet" if folder
                     else "no save_folder: no checkpoints")
            print(f"\ninterrupted in batch {int(trainer.state.timestamp.batch) + 1}; {terminal(where)}",
                  file=sys.stderr, flush=True)
        raise SystemExit(INTERRUPTED_EXIT) from None
    if cfg.get("selection_report") is not None and dist.get_global_rank() == 0:
        report_selection(cfg, trainer, fsdp is not None)
    return trainer


def report_selection(cfg: DictConfig, trainer: Trainer, sharded: bool) -> None:
    """The yaml's ``selection_report``: what the run's teacher (or teachers, on their ``combine``) keeps of held-out
    shards (``shards``, default the eval loader's) with canaries, the student just trained ranking with it
    (``vocagno.selection``), printed."""
    from vocagno.diagnostics.selection import Settings, run

    section = cfg.selection_report
    shards = section.get("shards") or om.select(cfg, "eval_loader.dataset.local")
    skipped = ("the student is sharded (FSDP): run python -m vocagno.selection --student CHECKPOINT" if sharded else
               "it needs a teacher: or teachers: section" if cfg.get("teacher") is None and cfg.get("teachers") is None
               else "no shards: give selection_report.shards or an eval_loader" if shards is None else None)
    if skipped:
        print(f"selection_report skipped: {terminal(skipped)}", flush=True)
        return
    student = trainer.state.model.model
    combine = ((cfg.get("algorithms") or {}).get("vocagno") or {}).get("combine", COMBINE)
    try:
        report = run(shards, scoring_teachers(cfg, "the run's yaml"), Settings.from_config(cfg), student=student,
                     combine=combine,
                     student_name=f"{cfg.run_name} after {int(trainer.state.timestamp.batch)} batches",
                     samples=section.get("samples") or 64, canaries=section.get("canaries") or 0.5, seed=cfg.seed,
                     device=str(next(student.parameters()).device))
    except (Refused, OSError) as error:  # the run is done and saved: say why there is no report, end as it would
        print(f"selection_report skipped: {terminal(error)}", flush=True)
        return
    print("\n" + report.table(), flush=True)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM (a launcher's, a scheduler's) ends the run as Ctrl-C does, saying where


USAGE = """usage: composer train.py YAML [KEY=VALUE ...]    (a rank on every GPU of the node)
       python train.py YAML [KEY=VALUE ...]      (one process)

Trains as the yaml says, each KEY=VALUE replacing the yaml's value (a dotted key, as the yaml nests it:
max_duration=100ba, model.name_or_path=TinyLlama/TinyLlama_v1.1, loggers.console=null). The keys, what each does
and its default: {keys}
Example: composer train.py yamls/tiny.yaml max_duration=6ba save_folder=runs/x save_interval=3ba autoresume=true"""


def cli() -> int:
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        print(USAGE.format(keys=Path(__file__).resolve().parent / "docs" / "training.md"))
        return 0
    if len(sys.argv) < 2:
        raise Refused("usage: composer train.py YAML [KEY=VALUE ...] (python train.py --help says more)")
    signal.signal(signal.SIGTERM, _interrupt)
    main(load_config(sys.argv[1], sys.argv[2:]))
    return 0


if __name__ == "__main__":
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    run(cli, mistakes=(OmegaConfBaseException, YAMLError))  # a mistake: one line; VOCAGNO_TRACEBACK=1: its traceback
