"""What a run is made of, built from its yaml: the sections' keys checked against what reads them, the algorithms and
their teachers, the loggers and callbacks, the optimizer and scheduler, Composer's model around the student."""

from __future__ import annotations

import re
from typing import Any

import torch
from composer.models import HuggingFaceModel
from composer.optim import CosineAnnealingWithWarmupScheduler, DecoupledAdamW
from omegaconf import DictConfig
from omegaconf import OmegaConf as om
from streaming import Stream

from vocagno.compat.composer import causal_lm_model
from vocagno.core.kernels import check_compile_config, check_kernels
from vocagno.teacher.config import BUILT_DTYPE, ModelConfig, TeacherConfig, check_names
from vocagno.teacher.teacher import Teacher
from vocagno.training.config import keyword_names, plain, yaml_teacher
from vocagno.training.loaders import DATASET_KEYS, RUN_DECIDES
from vocagno.training.loggers import ConsoleLine
from vocagno.training.metrics import BitsPerByte
from vocagno.training.registry import TEACHER_ALGORITHMS, algorithm, build, known
from vocagno.training.optimizers import MultiTensorDecoupledAdamW
from vocagno.training.sections import OptimizerConfig, RunConfig, SchedulerConfig

__all__ = ["batches", "build_algorithms", "build_loggers", "build_optimizer", "build_scheduler", "check_sections",
           "check_speed_options", "plain_section", "set_of_teachers", "student_flops_per_batch", "student_model"]


def check_sections(cfg: DictConfig) -> None:
    """The keys of the sections ``load_config`` leaves free-form, each against what reads it: an algorithm's, a logger's
    or a callback's options against its class, a loader's dataset against Streaming's, ``convert_if_missing``
    against the converter's flags. Before anything is loaded: a misspelled key is one line naming the closest one."""
    for section in ("algorithms", "loggers", "callbacks"):
        for name, kwargs in plain_section(cfg, section).items():
            if kwargs is None or (section, name, kwargs) == ("loggers", "console", True):  # console=true: on
                continue
            if not isinstance(kwargs, dict):
                raise ValueError(f"{section}.{name}: give its options as a mapping ({{}} for none), got {kwargs!r}")
            made = algorithm(name) if section == "algorithms" else \
                ConsoleLine if (section, name) == ("loggers", "console") else known(section, name)
            check_names(f"{section}.{name}.", kwargs, [] if made is ConsoleLine else keyword_names(made) or kwargs)
    if plain_section(cfg, "loggers").get("console") is not None:
        batches(RunConfig.of(cfg).console_log_interval, "console_log_interval")
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
            from vocagno.conversion.convert import parse_args

            check_names(f"{section}.convert_if_missing.", convert,
                        [flag for flag in vars(parse_args(["--out-root", "-"])) if flag not in RUN_DECIDES])
            if convert.get("input") is None:
                raise ValueError(f"{section}.convert_if_missing: give its input, the corpus to convert")


def build_algorithms(cfg: DictConfig, teacher_tok) -> list:
    """``algorithms:`` by their registered names, each made with its options and, where it uses one, the yaml's
    teacher (``teacher:``, its tokenizer ``teacher_tok`` loaded already) or teachers (``teachers:``); a null entry is
    off."""
    algorithms = []
    chosen = {name: kwargs for name, kwargs in plain_section(cfg, "algorithms").items() if kwargs is not None}
    for name, kwargs in chosen.items():
        made = algorithm(name)
        kwargs = dict(kwargs)
        if name in TEACHER_ALGORITHMS and cfg.get("teachers") is not None:
            if name != "vocagno":
                raise ValueError(f"teachers: only algorithms.vocagno takes several teachers, not algorithms.{name}")
            kwargs["teachers"] = set_of_teachers(cfg)
        elif name in TEACHER_ALGORITHMS:
            if cfg.get("teacher") is None:
                raise ValueError(f"algorithms.{name} needs a teacher: section")
            # A named teacher is loaded by the algorithm; a config-built one (random weights) is built here.
            kwargs["teacher"] = Teacher.from_config(cfg.teacher, seed=cfg.seed, tokenizer=teacher_tok)
        algorithms.append(made(**kwargs))
    if (cfg.get("teacher") or cfg.get("teachers")) is not None and not set(chosen) & set(TEACHER_ALGORITHMS):
        raise ValueError(f"a teacher without one of algorithms.{{{', '.join(TEACHER_ALGORITHMS)}}} would be loaded "
                         "and never used")
    return algorithms


def set_of_teachers(cfg: DictConfig) -> dict[str, Any]:
    """The yaml's ``teachers:`` (each entry with ``teacher:``'s keys, its tokenizer required: ``yaml_teacher``) as
    ``vocagno.teacher.teacher.Teacher`` s by name."""
    made = {}
    for name, section in cfg.teachers.items():
        if not isinstance(section, DictConfig):
            raise ValueError(f"teachers.{name}: needs teacher:'s keys, got {section!r}")
        made[name] = yaml_teacher(cfg, name)
    return made


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


def plain_section(cfg: DictConfig, key: str) -> dict[str, Any]:
    """The yaml's section ``key`` as plain Python ({} where it is absent or null)."""
    value = cfg.get(key)
    return om.to_container(value) if value is not None else {}


def build_loggers(cfg: DictConfig, load_path: str | None = None, resuming: bool = False) -> tuple[list, list]:
    """``loggers:`` and ``callbacks:`` by llm-foundry's names (``LOGGERS``, ``CALLBACKS``) with their kwargs; a null
    entry is off (``loggers.console=null`` on the command line). ``loggers.console`` prints one line every
    ``console_log_interval`` (``ConsoleLine``). ``load_checkpoint`` loads ``load_path`` (the private copy of the one
    its yaml names) where given, and is left out where the run ``resuming`` loads its latest instead."""
    chosen = {section: {k: v for k, v in plain_section(cfg, section).items() if v is not None}
              for section in ("loggers", "callbacks")}
    if "load_checkpoint" in chosen["callbacks"]:
        if resuming:
            del chosen["callbacks"]["load_checkpoint"]
        elif load_path is not None:
            chosen["callbacks"]["load_checkpoint"] = {**chosen["callbacks"]["load_checkpoint"], "load_path": load_path}
    loggers = [build("loggers", name, kwargs) for name, kwargs in chosen["loggers"].items() if name != "console"]
    if "console" in chosen["loggers"]:
        loggers.append(ConsoleLine(batches(RunConfig.of(cfg).console_log_interval, "console_log_interval")))
    callbacks = [build("callbacks", name, kwargs) for name, kwargs in chosen["callbacks"].items()]
    return loggers, callbacks


def batches(value: Any, key: str) -> int:
    """A number of batches given as ``10ba`` (a bare number would mean epochs to Composer: refused)."""
    found = re.fullmatch(r"\s*(\d+)\s*ba\s*", str(value)) if isinstance(value, str) else None
    if found is None or int(found.group(1)) < 1:
        raise ValueError(f"{key} must be a number of batches (10ba), got {value!r}")
    return int(found.group(1))


def optimizer_config(cfg: DictConfig) -> OptimizerConfig:
    """The yaml's ``optimizer:``, typed, what it can't run refused in one line (by ``check_speed_options`` before
    anything is converted or loaded)."""
    opt = OptimizerConfig.of(cfg.optimizer, "optimizer.")
    if opt.name != OptimizerConfig.name:
        raise ValueError(f"optimizer.name: only {OptimizerConfig.name} is supported, got {opt.name!r}")
    if opt.master_weights and (ModelConfig.of(cfg.get("model"), "model.").dtype or BUILT_DTYPE) == "float32":
        raise ValueError("optimizer.master_weights keeps float32 copies of bfloat16 or float16 weights, but the "
                         "student's are float32: set model.dtype: bfloat16, or leave master_weights out")
    return opt


def build_optimizer(cfg: DictConfig, model: torch.nn.Module) -> DecoupledAdamW:
    """``optimizer:``: Composer's DecoupledAdamW (its decay is not scaled by the learning rate), or the same update in
    multi-tensor or fused kernels (``OptimizerConfig``)."""
    opt = optimizer_config(cfg)
    options = dict(lr=opt.lr, betas=tuple(opt.betas), eps=opt.eps, weight_decay=opt.weight_decay)
    if opt.kernels == "composer":
        return DecoupledAdamW(model.parameters(), **options)
    return MultiTensorDecoupledAdamW(model.parameters(), **options, fused=opt.kernels == "fused",
                                     master_weights=opt.master_weights)


def build_scheduler(cfg: DictConfig) -> CosineAnnealingWithWarmupScheduler:
    """``scheduler:``: a cosine decay after a linear warmup, to ``alpha_f`` of the learning rate."""
    sched = SchedulerConfig.of(cfg.scheduler, "scheduler.")
    if sched.name != SchedulerConfig.name:
        raise ValueError(f"scheduler.name: only {SchedulerConfig.name} is supported, got {sched.name!r}")
    return CosineAnnealingWithWarmupScheduler(t_warmup=sched.t_warmup, alpha_f=sched.alpha_f)


def student_model(student: torch.nn.Module, tokenizer) -> HuggingFaceModel:
    """Composer's model around the student: logits out, labels shifted (a causal LM), bits per byte in evaluation."""
    return causal_lm_model(student, tokenizer, use_logits=True, eval_metrics=[BitsPerByte()])


def check_speed_options(cfg: DictConfig) -> None:
    """The student's, the teachers' and the optimizer's kernels and compile options, refused in one line before
    anything is converted or loaded (``vocagno.core.kernels``, ``optimizer_config``)."""
    optimizer_config(cfg)
    check_kernels(ModelConfig.of(cfg.model, "model.").kernels, "model.kernels")
    check_compile_config(plain(cfg.get("compile_config")), "compile_config")
    sections = {"teacher": cfg.teacher} if cfg.get("teacher") is not None else {}
    sections.update({f"teachers.{name}": section for name, section in (cfg.get("teachers") or {}).items()
                     if isinstance(section, DictConfig)})
    for where, section in sections.items():
        TeacherConfig.of(section, f"{where}.").check_speed(where)
