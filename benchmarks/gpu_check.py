"""Everything that needs a GPU, in one command, with one report: run it on a machine with one or more GPUs.

    python benchmarks/gpu_check.py --out gpu_report          # gpu_report/report.md and report.json
    python benchmarks/gpu_check.py --dry-run --out /tmp/r    # the same steps' CPU smoke: what CI checks of this script

Steps, each a command of its own (its output in ``OUT/logs/STEP.log``); one that fails or runs past its time is
reported as such and the others still run:

1. ``gpu_tests``: ``pytest -m gpu`` (FSDP against no FSDP, the teacher sharded or replicated, resuming under FSDP,
   the teacher's scoring memory: at most 2 GiB above its weights).
2. ``bench_tiny`` and ``bench_paper``: ``benchmarks/bench_step.py --preset tiny`` / ``--preset paper`` (TinyLlama-1.1B
   and Qwen2.5-Math-7B architectures, bf16, 4 x 2048): step times per selection scope, online and cached, the scoring
   pass's teacher tokens/s, MFU, peak memory.
3. ``fsdp_all_gpus``: ``composer -n GPUS train.py yamls/tiny.yaml`` with the student under FSDP and the teacher
   sharded, against one GPU without FSDP: the losses of the first steps side by side, step time.
4. ``sharded_resume_export``: the same FSDP run saving sharded checkpoints (``state_dict_type: sharded``) for 4
   batches, resumed by ``autoresume`` to 6 (losses against ``fsdp_all_gpus``' uninterrupted run), exported by
   ``python -m vocagno.export``, and the bits per byte of the export and of the save folder (``vocagno.eval --bpb``).
5. ``miniature``: ``experiments/miniature.py --size gpu`` (its table: held-out bits per byte per method).

Goals, each beside its figure in the report: ``microbatch`` overhead (guided / (plain + teacher forward)) at most
1.05 and cached steps at most 1.03 x plain (paper preset); plain MFU at least 40%; the scoring pass at least 29,000
teacher tokens/s; the gpu tests passing (and ``speed_tests``: Liger's kernels against PyTorch's). The speed options'
steps, ``bench_paper_torch``, ``bench_paper_liger``, ``bench_paper_liger_compiled`` and ``bench_paper_liger_levers``
(``SPEED_VARIANTS``), run the
paper preset's ``microbatch`` scope with each option, profiled (``OUT/profile_VARIANT/``). On one H200:
bench_paper 72 s, fsdp_all_gpus 74 s, sharded_resume_export 169 s, gpu_tests 42 s; on one H100: speed_tests 43 s,
bench_paper_torch 98 s, bench_paper_liger 82 s, bench_paper_liger_compiled over 287 s; the miniature alone runs for
longer than a 15-minute lease. With one GPU, Composer's FSDP falls back to NO_SHARD: steps 3 and 4 shard nothing there. The
report is rewritten after every step. Where Composer is missing (the GPU image of ``../shared/gpu/README.md``), the wheels in
``.whl/`` (``../shared/gpu/fetch-wheels.sh``) are installed into ``/tmp/site`` first, from no registry.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HELD_OUT = str(REPO / "vocagno" / "assets" / "text" / "gsm8k_heldout_100.jsonl")
SITE = "/tmp/site"


def steps(python: str, gpus: int, out: Path, dry: bool) -> list[dict]:
    """The steps: ``name``, ``command`` or ``commands`` (None: skipped, ``why``), ``timeout`` in seconds for all of
    them, ``parse`` (output -> figures)."""
    composer = [python, "-m", "composer.cli.launcher"]
    tiny = [str(REPO / "train.py"), str(REPO / "yamls" / "tiny.yaml"), "eval_loader=null", "selection_report=null",
            "loggers.console=null", "progress_bar=false", "max_duration=6ba", f"variables.data={out}/shards/tiny",
            f"train_loader.convert_if_missing.input={REPO}/vocagno/assets/text/gsm8k_train_500.jsonl"]
    fsdp = ["fsdp_config={sharding_strategy: FULL_SHARD, mixed_precision: PURE, state_dict_type: full}",
            "precision=amp_bf16", "teacher.dtype=bfloat16", "teacher.placement=fsdp"]
    sharded = [fsdp[0].replace("state_dict_type: full", "state_dict_type: sharded"), *fsdp[1:],
               f"save_folder={out}/sharded", "save_interval=2ba", "save_overwrite=true"]
    logs = {name: f"loggers.jsonl.path={out}/{name}.jsonl"
            for name in ("one_gpu", "all_gpus", "sharded_first", "sharded_resumed")}
    if dry:
        return [
            {"name": "gpu_tests", "command": [python, "-m", "pytest", "-q", "-m", "gpu", "--co", *gpu_test_files()],
             "timeout": 300, "parse": pytest_counts},
            {"name": "bench_tiny", "command": [python, "benchmarks/bench_step.py", "--preset", "tiny", "--steps", "3",
                                               "--scopes", "microbatch", "--no-cached"], "timeout": 600,
             "parse": bench_figures},
            {"name": "bench_paper", "command": None, "why": "the paper preset needs a GPU"},
            {"name": "fsdp_all_gpus", "command": None, "why": "Composer's FSDP needs CUDA"},
            {"name": "sharded_resume_export", "command": None, "why": "Composer's FSDP needs CUDA"},
            {"name": "miniature", "command": [python, "experiments/miniature.py", "--size", "toy", "--methods",
                                              "plain,vocagno_40", "--out", str(out / "miniature")], "timeout": 900,
             "parse": miniature_figures(out / "miniature")},
        ]
    return [
        {"name": "gpu_tests", "command": [python, "-m", "pytest", "-q", "-m", "gpu", *gpu_test_files()], "timeout": 300,
         "parse": pytest_counts},
        {"name": "bench_tiny", "command": [python, "benchmarks/bench_step.py", "--preset", "tiny"], "timeout": 180,
         "parse": bench_figures},
        {"name": "bench_paper", "command": [python, "benchmarks/bench_step.py", "--preset", "paper"], "timeout": 360,
         "parse": bench_figures},
        {"name": "speed_tests", "command": [python, "-m", "pytest", "-q", "-m", "gpu",
                                            str(REPO / "tests" / "integration" / "test_speed_options.py")],
         "timeout": 240, "parse": pytest_counts},
        *[{"name": f"bench_paper_{variant}", "parse": bench_figures, "timeout": timeout,
           "command": [python, "benchmarks/bench_step.py", "--preset", "paper", "--scopes", "microbatch", "--steps",
                       "8", "--profile", str(out / f"profile_{variant}"), *options]}
          for variant, options, timeout in SPEED_VARIANTS],
        {"name": "fsdp_all_gpus", "commands": [[*composer, "-n", "1", *tiny, logs["one_gpu"], "precision=amp_bf16"],
                                               [*composer, "-n", str(gpus), *tiny, *fsdp, logs["all_gpus"]]],
         "timeout": 240, "parse": fsdp_figures(out)},
        {"name": "sharded_resume_export", "commands": [
            [*composer, "-n", str(gpus), *tiny, *sharded, "max_duration=4ba", logs["sharded_first"]],
            [*composer, "-n", str(gpus), *tiny, *sharded, "autoresume=true", logs["sharded_resumed"]],
            [python, "-m", "vocagno.export", f"{out}/sharded", f"{out}/exported", "--overwrite"],
            [python, "-m", "vocagno.eval", "--model", f"{out}/exported", "--bpb", HELD_OUT],
            [python, "-m", "vocagno.eval", "--model", f"{out}/sharded", "--bpb", HELD_OUT, "--device", "cpu"],
            [python, "-m", "vocagno.eval", "--model", f"{out}/exported", "--bpb", HELD_OUT, "--device", "cpu"]],
         "timeout": 420, "parse": sharded_figures(out)},
        {"name": "miniature", "command": [python, "experiments/miniature.py", "--size", "gpu", "--out",
                                          str(out / "miniature")], "timeout": 900,
         "parse": miniature_figures(out / "miniature")},
    ]


# The paper preset's microbatch step and scoring pass with each speed option (vocagno.core.kernels): name, overrides,
# seconds at most. PyTorch's own kernels first: the figures beside which the others count.
SPEED_VARIANTS = [
    ("torch", [], 200),
    ("liger", ["model.kernels=liger", "teacher.kernels=liger"], 200),
    ("liger_compiled", ["model.kernels=liger", "teacher.kernels=liger", "compile_config={}",
                        "teacher.compile_config={}"], 360),
    # Issue 62's levers together, off by default until measured: the optimizer's update in one fused kernel, and
    # Liger's teacher chunks 8 x its default budget.
    ("liger_levers", ["model.kernels=liger", "teacher.kernels=liger", "teacher.chunk_mem_const=8",
                      "optimizer.kernels=fused"], 200),
]


def gpu_test_files() -> list[str]:
    """The test files that hold ``gpu`` tests: collecting the others would import what a GPU image may lack (moto,
    boto3, datasets, llm-foundry), and their collection errors would count as failed gpu tests."""
    files = [str(path) for path in sorted((REPO / "tests").rglob("test_*.py")) if "pytest.mark.gpu" in path.read_text()]
    if not files:  # pytest given no file would collect the whole suite
        raise SystemExit("error: no file under tests/ marks a test pytest.mark.gpu")
    return files


# What each step's output says: figures by name.
def pytest_counts(output: str) -> dict:
    """pytest's closing counts (``failed`` 0 where it names none), and ``collected`` for ``--co``."""
    found = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)\b", output)}
    figures = {}
    if found:
        figures = {key: found.get(key, 0) for key in ("passed", "failed", "skipped")}
        figures["failed"] += found.get("error", 0) + found.get("errors", 0)
    collected = re.search(r"(\d+)(?:/\d+)? tests? collected", output)
    if collected:
        figures["collected"] = int(collected.group(1))
    return figures


def bench_figures(output: str) -> dict:
    """``bench_step.py``'s JSON lines as figures: per scope (and cached), and the scoring line's."""
    figures = {}
    for line in output.splitlines():
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        if "scoring_teacher_tokens_per_s" in row:
            figures["scoring_teacher_tokens_per_s"] = row["scoring_teacher_tokens_per_s"]
            figures["training_teacher_tokens_per_s"] = row.get("training_teacher_tokens_per_s")
            continue
        scope = row["selection_scope"] + ("_cached" if row.get("teacher_losses") == "cached" else "")
        for key in ("plain_step_s", "guided_step_s", "overhead", "cached_step_s", "cached_over_plain", "mfu",
                    "peak_gib", "plain_peak_gib"):
            if row.get(key) is not None:
                figures[f"{scope}.{key}" if key not in ("plain_step_s", "mfu", "plain_peak_gib") else key] = row[key]
    return figures


def losses(out: Path, name: str) -> dict[int, float]:
    """step -> training loss, from a run's JSON lines log (empty when it has none)."""
    path = out / f"{name}.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return {r["step"]: r["loss/train/total"] for r in rows if "loss/train/total" in r}


def fsdp_figures(out: Path):
    def parse(output: str) -> dict:
        runs = {name: list(losses(out, name).values()) for name in ("one_gpu", "all_gpus")}
        if not runs["one_gpu"] or not runs["all_gpus"]:
            return {}
        worst = max(abs(a - b) / abs(a) for a, b in zip(runs["one_gpu"], runs["all_gpus"]))
        return {"steps": len(runs["all_gpus"]), "largest_relative_loss_difference": round(worst, 4)}
    return parse


def sharded_figures(out: Path):
    def parse(output: str) -> dict:
        figures = {}
        straight, resumed = losses(out, "all_gpus"), losses(out, "sharded_resumed")
        if resumed and all(step in straight for step in resumed):
            figures["resumed_steps"] = sorted(resumed)
            figures["resumed_largest_relative_loss_difference"] = round(
                max(abs(resumed[s] - straight[s]) / abs(straight[s]) for s in resumed), 4)
        bpb = [float(v) for v in re.findall(r"bits per byte on .*: ([0-9.]+)", output)]
        if len(bpb) == 3:  # the export on the GPU; the save folder and the export on the CPU
            figures["bits_per_byte_export_gpu"] = bpb[0]
            figures["bits_per_byte_checkpoint_minus_export"] = round(abs(bpb[1] - bpb[2]), 6)
        return figures
    return parse


def miniature_figures(folder: Path):
    def parse(output: str) -> dict:
        path = folder / "miniature.json"
        if not path.exists():
            return {}
        result = json.loads(path.read_text())
        return {f"bits_per_byte.{method}": round(sum(v) / len(v), 4) for method, v in result["bits_per_byte"].items()}
    return parse


def bench_goals(step: str) -> list[tuple]:
    return [
        (step, "microbatch.overhead", "at most", 1.05, "microbatch overhead, guided / (plain + teacher forward)"),
        (step, "microbatch_cached.cached_over_plain", "at most", 1.03, "cached step over plain step"),
        (step, "mfu", "at least", 0.40, "plain MFU"),
        (step, "scoring_teacher_tokens_per_s", "at least", 29000, "the scoring pass's teacher tokens/s"),
    ]


# (step, figure, at most / at least, target, what)
GOALS = [
    ("gpu_tests", "failed", "at most", 0, "the gpu tests pass (the teacher's scoring memory among them)"),
    ("speed_tests", "failed", "at most", 0, "Liger's kernels equal PyTorch's, per-token losses and gradients"),
    *bench_goals("bench_paper"),
    *[goal for variant, _, _ in SPEED_VARIANTS for goal in bench_goals(f"bench_paper_{variant}")],
    ("fsdp_all_gpus", "largest_relative_loss_difference", "at most", 0.02, "FSDP on all GPUs against one GPU (bf16)"),
    ("sharded_resume_export", "resumed_largest_relative_loss_difference", "at most", 0.02,
     "resumed from a sharded checkpoint against uninterrupted"),
    ("sharded_resume_export", "bits_per_byte_checkpoint_minus_export", "at most", 0.0,
     "a sharded checkpoint reads as its export"),
]


def chosen_steps(all_steps: list[dict], only: str | None) -> list[dict]:
    """The steps ``--only`` names, in its order (the most wanted first, where a machine's time may run out); all of
    them without it. A name that is no step, or named twice, is refused."""
    if not only:
        return all_steps
    by_name, names = {step["name"]: step for step in all_steps}, only.split(",")
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise SystemExit(f"error: --only names no step {', '.join(map(repr, unknown))}; the steps: {', '.join(by_name)}")
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise SystemExit(f"error: --only names {', '.join(map(repr, twice))} twice")
    return [by_name[name] for name in names]


class Stopped(Exception):
    """The check was stopped (SIGTERM, Ctrl-C) during a step: what that step had done by then, and why it stopped."""

    def __init__(self, result: dict, cause: BaseException):
        super().__init__(result["status"])
        self.result, self.cause = result, cause


def run_step(step: dict, logs: Path) -> dict:
    """Run a step's command (or commands, in turn, up to the first that fails) within its time, its output written to
    ``logs/STEP.log`` as it comes; parse that. Stopped from outside, it raises ``Stopped`` with what the step had
    printed by then (parsed too)."""
    commands = step.get("commands") or [step["command"]]
    if commands == [None]:
        return {"status": "skipped", "why": step["why"], "figures": {}}
    begin, status, stopped = time.perf_counter(), "ok", None
    log = logs / f"{step['name']}.log"
    with open(log, "w") as out:
        for command in commands:
            left = step["timeout"] - (time.perf_counter() - begin)
            # A session of its own, ended whole when the command ends, runs past its time or the check stops:
            # nothing it started (a launcher's ranks) is left holding a GPU for the next step.
            process = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                       env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
            try:
                process.wait(timeout=max(left, 1))
            except subprocess.TimeoutExpired:
                status = f"failed (past its {step['timeout']} s)"
            except BaseException as error:  # SIGTERM (exit_on_sigterm) or Ctrl-C
                status, stopped = "stopped (the check was ended during this step)", error
            finally:
                _end_session(process.pid)
                process.wait()
            if status == "ok" and process.returncode != 0:
                status = f"failed (exit {process.returncode})"
            if status != "ok":
                break
    output = log.read_text(errors="replace")
    try:
        figures = step["parse"](output)
    except (ValueError, KeyError) as error:
        figures, status = {}, f"{status}; its output could not be read ({error})"
    result = {"status": status, "seconds": round(time.perf_counter() - begin, 1), "figures": figures}
    if stopped is not None:
        raise Stopped(result, stopped)
    return result


def _end_session(pid: int) -> None:
    """SIGKILL every process left in the session a step's command leads (none, where it ended alone and whole)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def judge(results: dict) -> list[dict]:
    verdicts = []
    for step, figure, how, target, what in GOALS:
        value = results.get(step, {}).get("figures", {}).get(figure)
        met = None if value is None else (value <= target if how == "at most" else value >= target)
        verdicts.append({"step": step, "figure": figure, "goal": f"{how} {target}", "what": what, "value": value,
                         "met": met})
    return verdicts


def markdown(results: dict, verdicts: list[dict], header: str) -> str:
    """The report's page. A step's reason, and a figure's name and value, quote what its command printed: each is shown
    as its characters (``md_text``) unless it is a number or a plain name. The header is the check's own."""
    from vocagno.shown import md_text

    def shown(value) -> str:
        plain = isinstance(value, (int, float)) or re.fullmatch(r"[\w.]+", str(value))
        return str(value) if plain else md_text(value)

    lines = [f"# GPU check\n\n{header}\n", "| step | status | seconds |", "|---|---|---|"]  # the check's own words
    lines += [f"| {shown(name)} | {r['status']}{': ' + md_text(r['why']) if 'why' in r else ''} | "
              f"{shown(r['seconds']) if 'seconds' in r else '-'} |" for name, r in results.items()]
    lines += ["", "| goal | figure | value | met |", "|---|---|---|---|"]
    lines += [f"| {v['what']}: {v['goal']} | {v['step']}: {v['figure']} | "
              f"{'-' if v['value'] is None else shown(v['value'])} | "
              f"{'not measured' if v['met'] is None else 'yes' if v['met'] else 'NO'} |" for v in verdicts]
    for name, r in results.items():
        if r["figures"]:
            lines += ["", f"## {shown(name)}", ""] + [f"- {shown(k)}: {shown(v)}" for k, v in r["figures"].items()]
    return "\n".join(lines) + "\n"


def write_report(out: Path, results: dict, header: str) -> None:
    verdicts = judge(results)
    from vocagno.doors.writing import write_atomically

    write_atomically(out / "report.json", json.dumps({"header": header, "steps": results, "goals": verdicts},
                                                      indent=1))
    write_atomically(out / "report.md", markdown(results, verdicts, header))


def with_composer() -> None:
    """Re-run this script with ``.whl/``'s wheels on the path where Composer is not installed (the GPU image)."""
    try:
        import composer  # noqa: F401
        return
    except ImportError:
        pass
    wheels = sorted(str(p) for p in (REPO / ".whl").glob("*.whl"))
    if not wheels or os.environ.get("VOCAGNO_GPU_CHECK_SITE"):
        raise SystemExit("error: Composer is not installed and .whl/ holds no wheels: run "
                         "../shared/gpu/fetch-wheels.sh on a machine with a registry and bring .whl/ along")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--target", SITE, *wheels], check=True)
    path = os.pathsep.join([SITE, str(REPO), os.environ.get("PYTHONPATH", "")])
    os.execve(sys.executable, [sys.executable, *sys.argv],
              {**os.environ, "PYTHONPATH": path, "VOCAGNO_GPU_CHECK_SITE": "1"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu_report", help="the report's folder (report.md, report.json, logs/)")
    parser.add_argument("--dry-run", action="store_true", help="the steps' CPU smoke, for a machine without a GPU")
    parser.add_argument("--only", help="comma-separated steps to run, in this order (default: all)")
    args = parser.parse_args(argv)
    with_composer()
    import torch

    gpus = torch.cuda.device_count()
    if not gpus and not args.dry_run:
        raise SystemExit("error: no GPU here: run it on a GPU machine, or with --dry-run for the CPU smoke")
    out = Path(args.out).resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    chosen = chosen_steps(steps(sys.executable, gpus, out, args.dry_run), args.only)
    device = torch.cuda.get_device_name(0) if gpus else "no GPU (dry run)"
    begin, results = time.perf_counter(), {}
    for step in chosen:
        print(f"{step['name']} ...", flush=True)
        stop = None
        try:
            results[step["name"]] = run_step(step, out / "logs")
        except Stopped as stopped:
            results[step["name"]], stop = stopped.result, stopped
        print(f"{step['name']}: {results[step['name']]['status']}", flush=True)
        # After every step: a check stopped from outside (a machine's time running out) keeps what it had done.
        left = len(chosen) - len(results)
        header = (f"{device} x {gpus}; torch {torch.__version__}; {time.perf_counter() - begin:.0f} s in all"
                  f"{f'; {left} step(s) not run yet' if left else ''}"
                  f"{'; dry run: CPU smoke, no figure is a GPU figure' if args.dry_run else ''}.")
        write_report(out, results, header)
        if stop is not None:
            raise stop.cause
    print(f"wrote {out / 'report.md'} and report.json")
    return 1 if any(not r["status"].startswith(("ok", "skipped")) for r in results.values()) else 0


def exit_on_sigterm() -> None:
    """SIGTERM (``timeout``'s) as an exit, so that the running step's processes are ended with the check."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(main())
