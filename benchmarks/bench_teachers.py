"""Seconds per training step with two teachers against one (``teachers:``, ``vocagno.teacher.several``), cached and online.

    python benchmarks/bench_teachers.py [--steps 12] [--rounds 3]

Built from ``yamls/tiny_qwen.yaml`` as ``benchmarks/bench_step.py`` builds it (tiny random-init models, the shipped
GSM8K sample converted for the Qwen2.5 teacher, fp32 on the CPU), with a second tiny teacher of another vocabulary
(Mistral's; its tokens made from the text). Prints one JSON line per measurement:

- ``cached``: the shards scored by the Qwen2.5 teacher, and again by the Mistral one (``--name mistral``); training
  from them with one teacher (on the shards scored once) and with both, runs alternated ``--rounds`` times:
  ``two_over_one`` = the median step with two teachers over the median with one (goal: at most 1.02: a second cached
  teacher is two more columns read and one more range aggregation, no forward).
- ``online``: per selection scope, the median step with both teachers online and each teacher's forward seconds, as
  a share of the step (``vocagno/teacher_forward_seconds/NAME``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRAIN_TEXT = REPO / "vocagno" / "assets" / "text" / "gsm8k_train_500.jsonl"  # tiny_qwen.yaml's corpus
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_step import WARMUP, StepTimes  # noqa: E402
from composer import Trainer  # noqa: E402
from composer.models import HuggingFaceModel  # noqa: E402
from omegaconf import OmegaConf as om  # noqa: E402

from vocagno.training.builders import build_algorithms, build_optimizer, student_flops_per_batch  # noqa: E402
from vocagno.teacher.config import build_causal_lm  # noqa: E402
from vocagno.training.config import load_config  # noqa: E402
from vocagno.training.loaders import build_loader  # noqa: E402
from vocagno.teacher.scoring import score  # noqa: E402
from vocagno.training.config import scoring_teacher  # noqa: E402
from vocagno.data.outroots import Output  # noqa: E402
from vocagno.core.tokenization import load_tokenizer  # noqa: E402

SECOND = {"tokenizer": "mistral", "config": {
    "model_type": "mistral", "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512, "tie_word_embeddings": True}}


class TeacherTimes(StepTimes):
    """``StepTimes`` and each teacher's forward seconds per step."""

    def __init__(self):
        super().__init__()
        self.per_teacher: dict[str, list[float]] = {}

    def log_metrics(self, metrics, step=None):
        super().log_metrics(metrics, step)
        for key, value in metrics.items():
            if key.startswith("vocagno/teacher_forward_seconds/"):
                self.per_teacher.setdefault(key.rsplit("/", 1)[1], []).append(float(value))


def run(cfg, steps: int) -> TeacherTimes:
    student_tok = load_tokenizer(cfg.tokenizer.name)
    teacher_tok = load_tokenizer(cfg.teacher.tokenizer) if cfg.get("teacher") else None
    loader = build_loader(cfg.train_loader, student_tok, teacher_tok, cfg.global_train_batch_size)
    student = build_causal_lm(cfg.model, len(student_tok))
    timer = TeacherTimes()
    model = HuggingFaceModel(student, tokenizer=student_tok, use_logits=True)
    model.flops_per_batch = student_flops_per_batch(student)
    Trainer(model=model, train_dataloader=loader, algorithms=build_algorithms(cfg, teacher_tok),
            max_duration=f"{steps + WARMUP}ba", optimizers=build_optimizer(cfg, student),
            device_train_microbatch_size=cfg.device_train_microbatch_size, precision=cfg.get("precision"),
            loggers=[timer], progress_bar=False, seed=cfg.seed).fit()
    return timer


def with_two_teachers(cfg):
    two = om.merge(cfg, {"teachers": {"qwen": cfg.teacher, "mistral": SECOND}})
    two.teacher = None
    return two


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12, help="timed steps per run (after two warm-up steps)")
    parser.add_argument("--rounds", type=int, default=3, help="cached runs of each kind, alternated")
    parser.add_argument("--scopes", default="batch,microbatch")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [f"variables.data={tmp}/train", f"train_loader.convert_if_missing.input={TRAIN_TEXT}",
                     "eval_loader=null", "train_loader.dataset.shuffle=false",
                     "selection_report=null"]
        one = load_config(str(REPO / "yamls" / "tiny_qwen.yaml"), overrides)
        two = with_two_teachers(one)
        for scope in args.scopes.split(","):
            two.algorithms.vocagno.selection_scope = scope
            timer = run(two, args.steps)
            step = statistics.median(timer.steps[WARMUP:])
            print(json.dumps({"teacher_losses": "online", "selection_scope": scope, "step_s": round(step, 4), **{
                f"forward_share/{name}": round(statistics.median(seconds[WARMUP:]) / step, 3)
                for name, seconds in timer.per_teacher.items()}}), flush=True)
        two.algorithms.vocagno.selection_scope = one.algorithms.vocagno.selection_scope
        score(f"{tmp}/train", Output(f"{tmp}/scored1", None), scoring_teacher(one, "bench"), "cpu")
        score(f"{tmp}/scored1", Output(f"{tmp}/scored2", None), scoring_teacher(two, "bench", "mistral"), "cpu")
        for cfg, folder in ((one, "scored1"), (two, "scored2")):
            cfg.train_loader.dataset.local = f"{tmp}/{folder}"
            cfg.algorithms.vocagno.teacher_losses = "cached"
        steps: dict[str, list[float]] = {"one": [], "two": []}
        for _ in range(args.rounds):
            for name, cfg in (("one", one), ("two", two)):
                steps[name] += run(cfg, args.steps).steps[WARMUP:]
        medians = {name: statistics.median(values) for name, values in steps.items()}
        print(json.dumps({"teacher_losses": "cached", "selection_scope": one.algorithms.vocagno.selection_scope,
                          "one_teacher_step_s": round(medians["one"], 4), "two_teachers_step_s": round(medians["two"], 4),
                          "two_over_one": round(medians["two"] / medians["one"], 3),
                          "steps_per_kind": len(steps["one"])}), flush=True)


if __name__ == "__main__":
    from vocagno import entry

    entry.run(main)  # a refusal: one line, exit 2
