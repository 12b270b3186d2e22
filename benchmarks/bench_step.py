"""Seconds per training step through Composer's Trainer, plain and guided by VocAgnoLM, on the tiny setup.

    python benchmarks/bench_step.py [--preset tiny] [--steps 12] [--scopes batch,microbatch,sequence]

Builds everything from ``yamls/tiny.yaml`` as ``train.py`` does (real llama2 / qwen2.5 tokenizers, the shipped GSM8K
sample converted to shards under a temporary folder, tiny random-init models, global batch 8 in microbatches of 4)
and prints one JSON line per run: ``plain_step_s`` (no teacher), ``teacher_forward_s`` (the teacher's share of a
guided step), ``guided_step_s``, ``overhead`` = guided / (plain + teacher forward), ``student_tokens_per_s`` and
``selection_scope``. Medians over the steps after two warm-up steps. ``batch`` scope adds a no-grad student forward
per step (its scoring pass): the figure to compare with ``microbatch``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from composer import Trainer  # noqa: E402
from composer.loggers import LoggerDestination  # noqa: E402
from composer.models import HuggingFaceModel  # noqa: E402

import train  # noqa: E402
from vocagno.tokenization import load_tokenizer  # noqa: E402

WARMUP = 2


class StepTimes(LoggerDestination):
    """Wall time of each step, from BEFORE_DATALOADER (so the collation and ``batch`` scope's scoring pass, which run
    before BATCH_START, count) to BATCH_END, and the teacher forward seconds the algorithm logs."""

    def __init__(self):
        self.steps, self.teacher = [], []
        self._begin = 0.0

    def before_dataloader(self, state, logger):
        self._begin = time.perf_counter()

    def batch_end(self, state, logger):
        self.steps.append(time.perf_counter() - self._begin)

    def log_metrics(self, metrics, step=None):
        if "vocagno/teacher_forward_seconds" in metrics:
            self.teacher.append(float(metrics["vocagno/teacher_forward_seconds"]))


def run(cfg, guided: bool, scope: str | None, steps: int) -> StepTimes:
    student_tok, teacher_tok = load_tokenizer(cfg.tokenizer.name), load_tokenizer(cfg.teacher.tokenizer)
    world_batch = cfg.global_train_batch_size
    loader = train.build_loader(cfg.train_loader, student_tok, teacher_tok, world_batch)
    student = train.build_causal_lm(cfg.model, len(student_tok))
    algorithms = []
    if guided:
        cfg.algorithms.vocagno.selection_scope = scope
        algorithms = train.build_algorithms(cfg, teacher_tok)
    timer = StepTimes()
    Trainer(
        model=HuggingFaceModel(student, tokenizer=student_tok, use_logits=True), train_dataloader=loader,
        algorithms=algorithms, max_duration=f"{steps + WARMUP}ba", optimizers=train.build_optimizer(cfg, student),
        device_train_microbatch_size=cfg.device_train_microbatch_size, precision=cfg.get("precision"),
        loggers=[timer], progress_bar=False, seed=cfg.seed,  # a logger destination gets every event too
    ).fit()
    return timer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=["tiny"], default="tiny")
    parser.add_argument("--steps", type=int, default=12, help="timed steps (after two warm-up steps)")
    parser.add_argument("--scopes", default="batch,microbatch,sequence")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [f"variables.data={tmp}/train", "eval_loader=null", "train_loader.dataset.shuffle=false"]
        cfg = train.load_config(str(REPO / "yamls" / "tiny.yaml"), overrides)
        plain = statistics.median(run(cfg, False, None, args.steps).steps[WARMUP:])
        for scope in args.scopes.split(","):
            timer = run(cfg, True, scope, args.steps)
            guided = statistics.median(timer.steps[WARMUP:])
            teacher = statistics.median(timer.teacher[WARMUP:])
            tokens = cfg.global_train_batch_size * cfg.variables.seq_len
            print(json.dumps({
                "preset": args.preset, "selection_scope": scope, "plain_step_s": round(plain, 4),
                "teacher_forward_s": round(teacher, 4), "guided_step_s": round(guided, 4),
                "overhead": round(guided / (plain + teacher), 3), "student_tokens_per_s": round(tokens / guided),
            }), flush=True)


if __name__ == "__main__":
    main()
