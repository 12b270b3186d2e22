"""Seconds per training step through Composer's Trainer, plain and guided by VocAgnoLM.

    python benchmarks/bench_step.py [--preset tiny|paper] [--steps 12] [--scopes batch,microbatch] [--no-cached]
                                    [--scoring-batch-tokens 16384] [--profile DIR] [KEY=VALUE ...]

Builds everything from ``yamls/tiny_qwen.yaml`` as ``train.py`` does (real llama2 / qwen2.5 tokenizers, the shipped
GSM8K sample converted to shards under a temporary folder) with the preset's models:

- ``tiny``: the yaml's tiny random-init models, global batch 8 in microbatches of 4, seq 128, fp32 on the CPU;
- ``paper`` (a GPU): TinyLlama-1.1B student and Qwen2.5-Math-7B teacher architectures, random init, bf16
  (``amp_bf16``, the teacher in bfloat16), one microbatch of 4 x 2048 per step.

Prints one JSON line per run: ``plain_step_s`` (no teacher), ``teacher_forward_s`` (the teacher's share of a guided
step), ``guided_step_s``, ``overhead`` = guided / (plain + teacher forward), ``student_tokens_per_s``, ``mfu`` (the
student's training FLOPs as ``vocagno.training.builders.student_flops_per_batch`` counts them over the device's
bf16 peak; null on a CPU), ``peak_gib`` (CUDA memory allocated at most; null on a CPU) and ``selection_scope``.
Medians over the steps after two warm-up steps; on a GPU each step ends with ``torch.cuda.synchronize()``, so its
time is its kernels' too.
``batch`` scope adds a no-grad student forward per step (its scoring pass): the figure to compare with
``microbatch``. Every line names its ``preset`` and ``overrides``.

``KEY=VALUE`` overrides the yaml after the preset, as on train.py's command line; the speed options among them:
``model.kernels=liger`` and ``teacher.kernels=liger`` (Liger-Kernel's fused kernels, ``vocagno.core.kernels``),
``compile_config={}`` (the student compiled by Composer) and ``teacher.compile_config={}`` (each of the teacher's
decoder layers compiled). ``--profile DIR`` runs two more steps of the plain run and of each guided run under
``torch.profiler`` (not timed) and writes their top kernels by device time to ``DIR/NAME.txt``.

Then (unless ``--no-cached``) the shards are scored once with the same teacher (``vocagno.score``): one line with
``scoring_teacher_tokens_per_s`` (the scoring pass, one device) beside ``training_teacher_tokens_per_s`` (the
teacher's forward inside a guided step) and the shards' ``bytes_per_student_token``, unscored and scored; and one
line per scope trained from the cached losses: ``cached_step_s``, ``cached_over_plain`` (goal: at most 1.03; the
``batch`` scope keeps its scoring pass, a student forward, which cached losses do not remove).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
TRAIN_TEXT = REPO / "vocagno" / "assets" / "text" / "gsm8k_train_500.jsonl"  # tiny_qwen.yaml's corpus
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from composer import Trainer  # noqa: E402
from composer.loggers import LoggerDestination  # noqa: E402
from composer.models import HuggingFaceModel  # noqa: E402

from vocagno.training.builders import build_algorithms, build_optimizer, student_flops_per_batch  # noqa: E402
from vocagno.training.config import load_config  # noqa: E402
from vocagno.training.loaders import build_loader  # noqa: E402
from vocagno.teacher import scoring  # noqa: E402
from vocagno.teacher import config as sections  # noqa: E402
from vocagno.training import config  # noqa: E402
from vocagno.data.outroots import Output  # noqa: E402
from vocagno.core.tokenization import load_tokenizer  # noqa: E402
from vocagno.core.kernels import use_kernels  # noqa: E402

WARMUP = 2
PROFILED = 2  # steps under the profiler, after the timed ones
H100_BF16_FLOPS = 989e12  # dense bf16 peak of an H100 SXM: the MFU's denominator

# Overrides of yamls/tiny_qwen.yaml per preset: the paper's architectures (TinyLlama-1.1B; Qwen2.5-Math-7B), random init.
PRESETS = {
    "tiny": [],
    "paper": [
        "variables.seq_len=2048", "global_train_batch_size=4", "device_train_microbatch_size=4", "precision=amp_bf16",
        "model.config={model_type: llama, hidden_size: 2048, intermediate_size: 5632, num_hidden_layers: 22, "
        "num_attention_heads: 32, num_key_value_heads: 4, max_position_embeddings: 2048, tie_word_embeddings: false}",
        "teacher.dtype=bfloat16",
        "teacher.config={model_type: qwen2, hidden_size: 3584, intermediate_size: 18944, num_hidden_layers: 28, "
        "num_attention_heads: 28, num_key_value_heads: 4, max_position_embeddings: 4096, tie_word_embeddings: false}",
    ],
}


class StepTimes(LoggerDestination):
    """Wall time of each step, from BEFORE_DATALOADER (so the collation and ``batch`` scope's scoring pass, which run
    before BATCH_START, count) to BATCH_END, and the teacher forward seconds the algorithm logs. With ``profile``
    (a path), the steps from ``profile_from`` on run under ``torch.profiler``, whose top kernels go to that file."""

    def __init__(self, profile: Path | None = None, profile_from: int = 0):
        self.steps, self.teacher = [], []
        self._begin = 0.0
        self.flops, self.peak_bytes, self.teacher_tokens = 0, 0, []
        self.profile, self.profile_from, self._profiler = profile, profile_from, None

    def before_dataloader(self, state, logger):
        if self.profile is not None and len(self.steps) == self.profile_from:
            self._profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU] + (
                [torch.profiler.ProfilerActivity.CUDA] if torch.cuda.is_available() else []))
            self._profiler.__enter__()
        self._begin = time.perf_counter()

    def fit_end(self, state, logger):
        if self._profiler is not None:
            self._profiler.__exit__(None, None, None)
            device = "cuda" if torch.cuda.is_available() else "cpu"
            table = self._profiler.key_averages().table(sort_by=f"self_{'device' if device == 'cuda' else 'cpu'}"
                                                        "_time_total", row_limit=25)
            self.profile.parent.mkdir(parents=True, exist_ok=True)
            self.profile.write_text(f"{len(self.steps) - self.profile_from} steps, top kernels by self {device} "
                                    f"time\n{table}\n")
            self._profiler = None

    def batch_end(self, state, logger):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.steps.append(time.perf_counter() - self._begin)
        self.flops = state.model.flops_per_batch(state.batch)  # the rank's batch, restored after microbatches
        self.teacher_tokens.append(int(state.batch["teacher_attention_mask"].sum()))
        if torch.cuda.is_available():
            self.peak_bytes = max(self.peak_bytes, torch.cuda.max_memory_allocated())

    def log_metrics(self, metrics, step=None):
        if "vocagno/teacher_forward_seconds" in metrics:
            self.teacher.append(float(metrics["vocagno/teacher_forward_seconds"]))


@contextlib.contextmanager
def random_init_on(device: str):
    """The runs' random-init models (student, teacher, the scoring pass's teacher) built on ``device``: initializing
    the paper preset's 7B teacher on the CPU takes minutes each time (on an H100 machine the preset printed nothing in
    420 s), on a GPU a second. The weights differ from a CPU build's; no figure here depends on them."""
    build = sections.build_causal_lm

    def on_device(*args, **kwargs):
        with torch.device(device):
            return build(*args, **kwargs)

    with mock.patch.object(sections, "build_causal_lm", on_device):
        yield


def run(cfg, guided: bool, scope: str | None, steps: int, profile: Path | None = None) -> StepTimes:
    free_earlier_runs()
    student_tok, teacher_tok = load_tokenizer(cfg.tokenizer.name), load_tokenizer(cfg.teacher.tokenizer)
    world_batch = cfg.global_train_batch_size
    loader = build_loader(cfg.train_loader, student_tok, teacher_tok, world_batch)
    student = use_kernels(sections.build_causal_lm(cfg.model, len(student_tok)),
                          sections.ModelConfig.of(cfg.model).kernels, "model.kernels")
    algorithms = []
    if guided:
        cfg.algorithms.vocagno.selection_scope = scope
        algorithms = build_algorithms(cfg, teacher_tok)
    timer = StepTimes(profile, steps + WARMUP)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model = HuggingFaceModel(student, tokenizer=student_tok, use_logits=True)
    model.flops_per_batch = student_flops_per_batch(student)
    Trainer(
        model=model, train_dataloader=loader,
        algorithms=algorithms, max_duration=f"{steps + WARMUP + (PROFILED if profile else 0)}ba",
        optimizers=build_optimizer(cfg, student), compile_config=config.plain(cfg.get("compile_config")),
        device_train_microbatch_size=cfg.device_train_microbatch_size, precision=cfg.get("precision"),
        loggers=[timer], progress_bar=False, seed=cfg.seed,  # a logger destination gets every event too
    ).fit()
    return timer


def free_earlier_runs() -> None:
    """Let the runs before this one go: a finished Trainer lives in reference cycles, and the garbage collector's
    full pass, which would free it, comes seldom. On an H200 the paper preset's runs took 38, 65, 92, 119 GiB in turn
    (each holding the ones before) and the scoring pass ran out of memory."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--steps", type=int, default=12, help="timed steps (after two warm-up steps)")
    parser.add_argument("--scopes", default="batch,microbatch,sequence")
    parser.add_argument("--no-cached", action="store_true", help="skip the scoring pass and the cached-losses rows")
    parser.add_argument("--scoring-batch-tokens", type=int, default=scoring.BATCH_TOKENS,
                        help="padded teacher tokens per batch of the scoring pass (vocagno.score --batch-tokens)")
    parser.add_argument("--profile", type=Path, help="a folder for the top kernels of two profiled steps per run")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE overrides of the yaml, after the preset's")
    args = parser.parse_args()
    scopes = args.scopes.split(",")
    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as tmp, random_init_on("cuda") if cuda else contextlib.nullcontext():
        overrides = [f"variables.data={tmp}/train", f"train_loader.convert_if_missing.input={TRAIN_TEXT}",
                     "eval_loader=null", "train_loader.dataset.shuffle=false",
                     *PRESETS[args.preset], *args.overrides]
        cfg = load_config(str(REPO / "yamls" / "tiny_qwen.yaml"), overrides)
        label = {"preset": args.preset, "overrides": args.overrides}  # on every line
        profile = (lambda name: args.profile / f"{name}.txt") if args.profile else (lambda name: None)
        timed = slice(WARMUP, WARMUP + args.steps)
        plain_timer = run(cfg, False, None, args.steps, profile("plain"))
        plain = statistics.median(plain_timer.steps[timed])
        online: dict[str, float] = {}
        for scope in scopes:
            timer = run(cfg, True, scope, args.steps, profile(f"online_{scope}"))
            guided = online[scope] = statistics.median(timer.steps[timed])
            teacher = statistics.median(timer.teacher[timed])
            tokens = cfg.global_train_batch_size * cfg.variables.seq_len
            print(json.dumps({
                **label, "selection_scope": scope, "plain_step_s": round(plain, 4),
                "teacher_forward_s": round(teacher, 4), "guided_step_s": round(guided, 4),
                "overhead": round(guided / (plain + teacher), 3), "student_tokens_per_s": round(tokens / guided),
                "mfu": round(plain_timer.flops / plain / H100_BF16_FLOPS, 3) if cuda else None,
                "guided_mfu": round(plain_timer.flops / guided / H100_BF16_FLOPS, 3) if cuda else None,
                "peak_gib": round(timer.peak_bytes / 2**30, 2) if cuda else None,
                "plain_peak_gib": round(plain_timer.peak_bytes / 2**30, 2) if cuda else None,
            }), flush=True)
        if args.no_cached:
            return
        scored = score_once(cfg, f"{tmp}/train", f"{tmp}/scored", args.scoring_batch_tokens)
        in_training = sum(timer.teacher_tokens[timed]) / sum(timer.teacher[timed])  # the last guided run's
        scored["training_teacher_tokens_per_s"] = round(in_training)
        print(json.dumps({**label, **scored}), flush=True)
        cfg.train_loader.dataset.local = f"{tmp}/scored"
        cfg.algorithms.vocagno.teacher_losses = "cached"
        for scope in scopes:
            cached = statistics.median(run(cfg, True, scope, args.steps, profile(f"cached_{scope}")).steps[timed])
            print(json.dumps({
                **label, "selection_scope": scope, "teacher_losses": "cached",
                "plain_step_s": round(plain, 4), "online_step_s": round(online[scope], 4),
                "cached_step_s": round(cached, 4), "cached_over_plain": round(cached / plain, 3),
            }), flush=True)


def shard_bytes_per_student_token(root: str) -> float:
    index = json.loads((Path(root) / "index.json").read_text())
    stored = sum((shard.get("zip_data") or shard["raw_data"])["bytes"] for shard in index["shards"])
    return stored / json.loads((Path(root) / "vocagno.json").read_text())["totals"]["student tokens"]


def score_once(cfg, shards: str, scored: str, batch_tokens: int = scoring.BATCH_TOKENS) -> dict:
    """Score ``shards`` into ``scored`` with the yaml's teacher (the weights its runs build): the pass's teacher
    tokens/s on one device, and the shards' bytes per student token before and after."""
    free_earlier_runs()
    teacher = config.scoring_teacher(cfg, "bench_step")
    teacher.scored_by()  # loading it and fingerprinting its weights are not the pass's speed
    device = "cuda" if torch.cuda.is_available() else "cpu"
    begin = time.perf_counter()
    scoring.score(shards, Output(scored, None), teacher, device, batch_tokens)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - begin
    tokens = sum(json.loads(part.read_text())["teacher tokens"] for part in Path(scored).glob("part-*/part.json"))
    return {
        "scoring_s": round(seconds, 2), "scoring_batch_tokens": batch_tokens,
        "scoring_teacher_tokens_per_s": round(tokens / seconds),
        "bytes_per_student_token": {"unscored": round(shard_bytes_per_student_token(shards), 2),
                                    "scored": round(shard_bytes_per_student_token(scored), 2)},
    }


if __name__ == "__main__":
    from vocagno import entry

    entry.run(main)  # a refusal: one line, exit 2
