"""The run's loaders from its yaml: each loader's shards, converted first where the yaml says what to convert into a
missing folder (``convert_if_missing``), read by ``vocagno.data.dataset``'s loader."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from composer.utils import dist
from omegaconf import DictConfig
from omegaconf import OmegaConf as om
from streaming import StreamingDataset

from vocagno.data.dataset import teacher_guided_loader
from vocagno.shown import terminal
from vocagno.training.config import keyword_names
from vocagno.training.sections import LoaderConfig

__all__ = ["DATASET_KEYS", "RUN_DECIDES", "build_loader", "conversion_flags", "convert_if_missing", "dataset_locals"]

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
    loader = LoaderConfig.of(section, f"{name}.")
    dataset_cfg, convert = loader.dataset, loader.convert_if_missing
    folders = [(f"{name}.dataset", dataset_cfg, convert)]
    folders += [(f"{name}.dataset.streams.{key}", stream, None)
                for key, stream in (dataset_cfg.get("streams") or {}).items()]
    for where, one, converting in folders:
        if one.get("local") is not None and one.get("remote") is None:
            local = os.path.join(str(one["local"]), str(one["split"])) if one.get("split") else str(one["local"])
            convert_if_missing(local, converting, where, flags)
    return teacher_guided_loader(dataset_cfg, student_tok, teacher_tok, batch_size,
                                 teacher_seq_len=loader.teacher_seq_len, num_workers=loader.num_workers,
                                 drop_last=loader.drop_last)


def convert_if_missing(local: str, convert: dict[str, Any] | None, where: str, flags: str) -> None:
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
        from vocagno.conversion.convert import main as convert_main

        print(f"{section}: converting {terminal(convert.get('input'))} into {terminal(local)} (convert_if_missing)",
              flush=True)
        args = ["--out-root", local]
        for key, value in convert.items():
            args += [f"--{key.replace('_', '-')}", *(map(str, value) if isinstance(value, list) else [str(value)])]
        convert_main(args)
    dist.barrier()


def conversion_flags(cfg: DictConfig) -> str:
    """The converter's flags that make shards this run reads: its student's and teacher's tokenizers, its
    ``variables.seq_len`` (or the student's positions)."""
    teacher = om.select(cfg, "teacher.tokenizer") or "..."
    seq_len = om.select(cfg, "variables.seq_len") or om.select(cfg, "model.config.max_position_embeddings")
    return f"--student-tokenizer {cfg.tokenizer.name} --teacher-tokenizer {teacher}" + (
        f" --seq-len {seq_len}" if seq_len else "")
