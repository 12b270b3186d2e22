"""What cached distributions cost: the bytes a teacher token takes on disk, the scoring pass with distributions
against losses only, and a training step from them against a plain one.

    python benchmarks/bench_cached_distill.py [--docs 500] [--top-k 8,32,128] [--steps 12] [--train-k 32] [--rounds 1]

Builds on ``yamls/tiny.yaml`` as ``train.py`` does: the shipped GSM8K sample (its first ``--docs`` documents) converted
to llama2 / mistral shards of 128 student tokens under a temporary folder, the shipped tiny-math-teacher (float32, as
the yaml says) and the yaml's tiny student, global batch 8 in microbatches of 4. Prints one JSON line per scoring pass:
``top_k`` (null: losses only), ``scoring_s`` and ``over_losses_only`` (its seconds over the losses-only pass's;
``scoring_cpu_s`` and ``cpu_over_losses_only`` the same in CPU seconds, every thread's),
``bytes_per_teacher_token`` (the shard files' bytes over the teacher tokens: ``stored``, as the converter's compression
left them, and ``raw``, uncompressed; ``distribution_*``: the same less the losses-only shards', the columns' own
cost) and ``layout_bytes_per_teacher_token`` (``Distribution.bytes_per_token``: k ids and k probabilities, one rest);
then one line per training run: ``step_s`` (the median of ``--steps`` steps after two warm-up steps, from
``bench_step.StepTimes``) and ``over_plain``, ``step_cpu_s`` and ``cpu_over_plain`` the same in CPU seconds, for
plain training, live ULD, cached ULD, live cross_kd (its
distributions truncated to ``--train-k``, as the cache) and cached cross_kd from the ``--train-k`` shards. With
``--rounds R`` every pass and run is repeated R times, each round going through all of them in turn, and the fastest
counts: a machine others share slows a spell, not one configuration.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_step import WARMUP, StepTimes, free_earlier_runs  # noqa: E402
from composer import Trainer  # noqa: E402
from composer.models import HuggingFaceModel  # noqa: E402

from vocagno.algorithms.baselines import ULD, CrossVocabKD  # noqa: E402
from vocagno.conversion.convert import main as convert_main  # noqa: E402
from vocagno.core.tokenization import load_tokenizer  # noqa: E402
from vocagno.data.dataset import teacher_guided_loader  # noqa: E402
from vocagno.data.outroots import Output  # noqa: E402
from vocagno.data.shards import ShardMetadata, distribution_of  # noqa: E402
from vocagno.teacher import config as sections  # noqa: E402
from vocagno.teacher import scoring  # noqa: E402
from vocagno.teacher.teacher import Teacher  # noqa: E402
from vocagno.training.builders import build_optimizer, student_flops_per_batch  # noqa: E402
from vocagno.training.config import load_config  # noqa: E402

TEXT = REPO / "vocagno" / "assets" / "text" / "gsm8k_train_500.jsonl"


def shard_bytes(root: Path) -> tuple[int, int]:
    """The shard files' bytes as stored and uncompressed (the index's)."""
    shards = json.loads((root / "index.json").read_text())["shards"]
    return (sum((shard.get("zip_data") or shard["raw_data"])["bytes"] for shard in shards),
            sum(shard["raw_data"]["bytes"] for shard in shards))


class CpuStepTimes(StepTimes):
    """``StepTimes`` with each step's CPU time too (every thread of the process): on a machine others share, the wall
    time of a step is the busy spell's as much as its own."""

    def __init__(self):
        super().__init__()
        self.cpu, self._cpu_begin = [], 0.0

    def before_dataloader(self, state, logger):
        super().before_dataloader(state, logger)
        self._cpu_begin = time.process_time()

    def batch_end(self, state, logger):
        super().batch_end(state, logger)
        self.cpu.append(time.process_time() - self._cpu_begin)


def score(shards: Path, out: Path, top_k: int | None) -> tuple[float, float]:
    """The pass's wall and CPU seconds."""
    free_earlier_runs()
    teacher = Teacher("tiny-math-teacher", dtype="float32")
    teacher.scored_by()  # loading and fingerprinting it are not the pass's speed
    begin, cpu = time.perf_counter(), time.process_time()
    scoring.score(str(shards), Output(str(out), None), teacher, "cpu", scoring.BATCH_TOKENS, top_k=top_k)
    return time.perf_counter() - begin, time.process_time() - cpu


def steps(cfg, shards: Path, algorithm, count: int) -> tuple[float, float]:
    free_earlier_runs()
    student_tok, teacher_tok = load_tokenizer(cfg.tokenizer.name), load_tokenizer(cfg.teacher.tokenizer)
    loader = teacher_guided_loader({"local": str(shards), "shuffle": False}, student_tok, teacher_tok,
                                   cfg.global_train_batch_size, drop_last=True)
    student = sections.build_causal_lm(cfg.model, len(student_tok), cfg.seed)
    model = HuggingFaceModel(student, tokenizer=student_tok, use_logits=True)
    model.flops_per_batch = student_flops_per_batch(student)  # StepTimes reads it
    timer = CpuStepTimes()
    Trainer(model=model, train_dataloader=loader,
            algorithms=[algorithm] if algorithm else [], max_duration=f"{count + WARMUP}ba",
            optimizers=build_optimizer(cfg, student), device_train_microbatch_size=cfg.device_train_microbatch_size,
            precision=cfg.get("precision"), loggers=[timer], progress_bar=False, seed=cfg.seed).fit()
    timed = slice(WARMUP, WARMUP + count)
    return statistics.median(timer.steps[timed]), statistics.median(timer.cpu[timed])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=500, help="documents of the shipped GSM8K sample")
    parser.add_argument("--top-k", default="8,32,128", help="the k of each scoring pass with distributions")
    parser.add_argument("--steps", type=int, default=12, help="timed steps a run (after two warm-up steps)")
    parser.add_argument("--train-k", type=int, default=32, help="the k the training runs read (one of --top-k)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="times each pass and run is repeated, in turn with the others: the fastest counts")
    args = parser.parse_args()
    ks = [int(k) for k in args.top_k.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        lines = TEXT.read_text(encoding="utf-8").splitlines()[: args.docs]
        (tmp / "docs.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        convert_main(["--input", str(tmp / "docs.jsonl"), "--student-tokenizer", "llama2", "--teacher-tokenizer",
                      "mistral", "--seq-len", "128", "--out-root", str(tmp / "shards")])
        seconds: dict = {}
        cpu_seconds: dict = {}
        for round_ in range(args.rounds):  # in turn, so that a busy spell of the machine slows one of each
            for k in [None, *ks]:
                out = tmp / f"top{k}-{round_}"
                wall, cpu = score(tmp / "shards", out, k)
                seconds[k] = min(seconds.get(k, float("inf")), wall)
                cpu_seconds[k] = min(cpu_seconds.get(k, float("inf")), cpu)
        base_stored, base_raw = shard_bytes(tmp / "topNone-0")
        tokens = ShardMetadata.read(tmp / "topNone-0").totals["teacher tokens"]
        print(json.dumps({"top_k": None, "scoring_s": round(seconds[None], 2),
                          "scoring_cpu_s": round(cpu_seconds[None], 2), "teacher_tokens": tokens,
                          "bytes_per_teacher_token": {"stored": round(base_stored / tokens, 2),
                                                      "raw": round(base_raw / tokens, 2)}}), flush=True)
        for k in ks:
            stored, raw = shard_bytes(tmp / f"top{k}-0")
            print(json.dumps({
                "top_k": k, "scoring_s": round(seconds[k], 2), "over_losses_only": round(seconds[k] / seconds[None], 3),
                "scoring_cpu_s": round(cpu_seconds[k], 2),
                "cpu_over_losses_only": round(cpu_seconds[k] / cpu_seconds[None], 3),
                "bytes_per_teacher_token": {"stored": round(stored / tokens, 2), "raw": round(raw / tokens, 2),
                                            "distribution_stored": round((stored - base_stored) / tokens, 2),
                                            "distribution_raw": round((raw - base_raw) / tokens, 2)},
                "layout_bytes_per_teacher_token": distribution_of(ShardMetadata.read(tmp / f"top{k}-0")).bytes_per_token(),
            }), flush=True)
        cfg = load_config(str(REPO / "yamls" / "tiny.yaml"), ["eval_loader=null"])  # its student and optimizer
        teacher = lambda: Teacher("tiny-math-teacher", tokenizer="mistral", dtype="float32")  # noqa: E731
        losses, cached, k = tmp / "topNone-0", tmp / f"top{args.train_k}-0", args.train_k
        runs = {
            "plain": (losses, lambda: None),
            "uld_online": (losses, lambda: ULD(teacher())),
            "uld_cached": (cached, lambda: ULD(teacher(), teacher_losses="cached", top_k=k)),
            "cross_kd_online": (losses, lambda: CrossVocabKD(teacher(), top_k=k)),
            "cross_kd_cached": (cached, lambda: CrossVocabKD(teacher(), teacher_losses="cached", top_k=k)),
        }
        step: dict = {}
        cpu_step: dict = {}
        for _ in range(args.rounds):
            for name, (shards, algorithm) in runs.items():
                wall, cpu = steps(cfg, shards, algorithm(), args.steps)
                step[name] = min(step.get(name, float("inf")), wall)
                cpu_step[name] = min(cpu_step.get(name, float("inf")), cpu)
        for name in runs:
            print(json.dumps({"run": name, "top_k": k if name != "plain" and name != "uld_online" else None,
                              "step_s": round(step[name], 4), "over_plain": round(step[name] / step["plain"], 3),
                              "step_cpu_s": round(cpu_step[name], 4),
                              "cpu_over_plain": round(cpu_step[name] / cpu_step["plain"], 3)}), flush=True)


if __name__ == "__main__":
    from vocagno import entry

    entry.run(main)
