"""The miniature with two domains: do two teachers of different domains and vocabularies guide a student better than
either one alone? Run through the product's own commands, as a user would run them.

    python experiments/two_teachers.py --size cpu               # a 2-core CPU, 3 seeds
    python experiments/two_teachers.py --size toy               # the same chain on 24 documents per domain

1. **Corpus.** Clean documents of two domains, GSM8K word problems 1-500 (``gsm8k_train_500.jsonl``) and 500 MATH
   competition problems in LaTeX (``math_train_500.jsonl``), plus junk made from both: word-shuffled copies,
   ``--junk`` of all documents, in a random order. Converted with Llama-2's tokenizer for the student and Mistral's
   for the teacher tokens (the GSM8K teacher's), and again with DeepSeek's (the MATH teacher's), for that teacher
   alone: the same student samples in the same order, since packing follows the student's tokens.
2. **Teachers**, shipped: ``tiny-math-teacher`` (GSM8K problems 601-7,473, Mistral's tokenizer) and
   ``tiny-latex-teacher`` (other MATH problems, DeepSeek's tokenizer; ``experiments/tiny_teacher.py``); neither has
   seen a document of the corpus or of the held-out sets.
3. **Score once per teacher** (``python -m vocagno.score``): the Mistral shards by the GSM8K teacher, then by the
   MATH one beside it (``--name latex``, its tokens made from the student's); the DeepSeek shards by the MATH teacher.
4. **Train** ``yamls/miniature.yaml`` (cached losses, no teacher loaded), per method and seed, students from the same
   initialization and data order for a seed: ``plain`` (every token), ``gsm8k_teacher`` and ``latex_teacher`` (each
   teacher alone, top 40%), ``both_min`` and ``both_mean`` (both teachers, ``combine: min`` / ``mean``, top 40%), and
   ``random_40`` (40% at random).
5. **Measure** held-out bits per byte (``vocagno.training.metrics.bits_per_byte``) on GSM8K problems 501-600, on 100 held-out
   MATH problems (``math_heldout_100.jsonl``), and on both together (their total bits over their total bytes); each
   method against plain and against each teacher alone: the mean paired difference over seeds, and whether it lies
   beyond twice the paired differences' sd. ``OUT/two_teachers.json`` and the table, printed.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from vocagno.teacher.config import build_causal_lm  # noqa: E402
from vocagno.training.config import load_config  # noqa: E402
from vocagno.train import train  # noqa: E402
from vocagno.conversion.convert import main as convert_main  # noqa: E402
from experiments.miniature import experiment_parser, experiment_settings, texts  # noqa: E402
from vocagno import score  # noqa: E402
from vocagno.diagnostics.canaries import NOISE  # noqa: E402
from vocagno.training.metrics import bits_per_byte  # noqa: E402
from vocagno.core.tokenization import load_tokenizer  # noqa: E402

YAML = str(REPO / "yamls" / "miniature.yaml")
DOMAINS = {"gsm8k": ("gsm8k_train_500.jsonl", "gsm8k_heldout_100.jsonl"),
           "math": ("math_train_500.jsonl", "math_heldout_100.jsonl")}
TEACHERS = {"gsm8k": ("tiny-math-teacher", "mistral"), "latex": ("tiny-latex-teacher", "deepseek-llm")}
SET = [f"teachers.{name}.{key}={value}" for name, (model, tokenizer) in TEACHERS.items()
       for key, value in (("name_or_path", model), ("tokenizer", tokenizer), ("dtype", "float32"))]
# A method: (the shards it trains on: "mistral" or "deepseek", overrides of yamls/miniature.yaml).
METHODS = {
    "plain": ("mistral", ["teacher=null", "algorithms.vocagno=null"]),
    "gsm8k_teacher": ("mistral", []),
    "latex_teacher": ("deepseek", ["teacher.name_or_path=tiny-latex-teacher", "teacher.tokenizer=deepseek-llm"]),
    "both_min": ("mistral", ["teacher=null", *SET, "algorithms.vocagno.combine=min"]),
    "both_mean": ("mistral", ["teacher=null", *SET, "algorithms.vocagno.combine=mean"]),
    "random_40": ("mistral", ["algorithms.vocagno.selection=random"]),
}
SIZES = {"toy": {"steps": 4, "seeds": "0", "docs": 24}, "cpu": {"steps": 250, "seeds": "0,1,2", "docs": 500}}


def corpus(junk: float, docs: int, seed: int = 0) -> list[str]:
    """Each domain's first ``docs`` clean documents and word-shuffled copies of them, ``junk`` of all documents, in a
    random order."""
    rng = random.Random(seed)
    clean = [text for train_file, _ in DOMAINS.values() for text in texts(train_file)[:docs]]
    count = round(len(clean) * junk / (1 - junk))
    mixed = clean + [NOISE["shuffled_words"](rng.choice(clean), rng) for _ in range(count)]
    rng.shuffle(mixed)
    return mixed


def convert(documents: list[str], teacher_tokenizer: str, out: Path) -> Path:
    if not (out / "index.json").exists():
        source = out.with_suffix(".jsonl")
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text("".join(json.dumps({"text": t}) + "\n" for t in documents), encoding="utf-8")
        if convert_main(["--input", str(source), "--student-tokenizer", "llama2", "--teacher-tokenizer",
                         teacher_tokenizer, "--seq-len", "128", "--out-root", str(out)]) != 0:
            raise SystemExit(f"error: converting {source} failed")
    return out


def scored(shards: Path, out: Path, *args: str) -> Path:
    if not (out / "index.json").exists():
        score.main(["--shards", str(shards), *args, "--dtype", "float32", "--out", str(out), "--device", "cpu"])
    return out


def heldout_bits_per_byte(model, tokenizer) -> dict[str, float]:
    """Bits per byte on each domain's held-out text and on both together (total bits over total bytes)."""
    result, bits, size = {}, 0.0, 0
    for domain, (_, heldout_file) in DOMAINS.items():
        heldout = texts(heldout_file)
        result[domain] = bits_per_byte(model, tokenizer, heldout)
        nbytes = sum(len(text.encode()) for text in heldout)
        bits, size = bits + result[domain] * nbytes, size + nbytes
    result["overall"] = bits / size
    return result


def _mean_sd(values: list[float]) -> str:
    return f"{statistics.mean(values):.4f}" + (f" ± {statistics.stdev(values):.4f}" if len(values) > 1 else "")


def compare(values: list[float], against: list[float]) -> str:
    """The mean paired difference ± its sd, and whether it lies beyond twice that sd (lower is better)."""
    differences = [a - b for a, b in zip(values, against)]
    mean = statistics.mean(differences)
    if len(differences) < 2:
        return f"{mean:+.4f} (one seed)"
    sd = statistics.stdev(differences)
    beyond = ("lower" if mean < 0 else "higher") if abs(mean) > 2 * sd else "within 2 sd"
    return f"{mean:+.4f} ± {sd:.4f} ({beyond})"


def table(result: dict) -> str:
    bpb = result["bits_per_byte"]
    lines = [f"Held-out bits per byte, {result['size']} size, {result['steps']} steps, seeds "
             f"{', '.join(map(str, result['seeds']))}, junk {result['junk']:.0%}; teachers: "
             + ", ".join(f"{name} {values['overall']:.4f} overall ({values['gsm8k']:.4f} GSM8K, {values['math']:.4f} "
                         f"MATH)" for name, values in result["teachers"].items()),
             "", "| method | overall | GSM8K | MATH | overall vs plain | vs gsm8k_teacher | vs latex_teacher |",
             "|---|---|---|---|---|---|---|"]
    for method, runs in bpb.items():
        overall = [run["overall"] for run in runs]
        row = [method, _mean_sd(overall), _mean_sd([r["gsm8k"] for r in runs]), _mean_sd([r["math"] for r in runs])]
        for other in ("plain", "gsm8k_teacher", "latex_teacher"):
            row.append("-" if method in (other, "init") or other not in bpb else
                       compare(overall, [run["overall"] for run in bpb[other]]))
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Per domain, against plain (mean paired difference ± sd):", "",
              "| method | GSM8K vs plain | MATH vs plain |", "|---|---|---|"]
    for method, runs in bpb.items():
        if method not in ("init", "plain"):
            lines.append(f"| {method} | " + " | ".join(
                compare([r[d] for r in runs], [r[d] for r in bpb["plain"]]) for d in ("gsm8k", "math")) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = experiment_parser(__doc__.split("\n\n")[0], METHODS, SIZES, "two_teachers")
    args = parser.parse_args(argv)
    methods, size, seeds, out = experiment_settings(parser, args, METHODS, SIZES)
    begin = time.perf_counter()

    documents = corpus(args.junk, size["docs"])
    mistral = convert(documents, "mistral", out / "shards" / "mistral")
    deepseek = convert(documents, "deepseek-llm", out / "shards" / "deepseek")
    data = {"mistral": scored(scored(mistral, out / "shards" / "mistral-scored", "--teacher", "tiny-math-teacher"),
                              out / "shards" / "mistral-scored-twice", "--teacher", "tiny-latex-teacher",
                              "--name", "latex"),
            "deepseek": scored(deepseek, out / "shards" / "deepseek-scored", "--teacher", "tiny-latex-teacher")}
    student_tok = load_tokenizer("llama2")
    result = {"size": args.size, "seeds": seeds, "junk": args.junk, "steps": size["steps"], "teachers": {},
              "bits_per_byte": {}}
    from vocagno.teacher.model import load_teacher

    for name, (model, tokenizer) in TEACHERS.items():
        result["teachers"][name] = heldout_bits_per_byte(load_teacher(model, "float32").eval(), load_tokenizer(tokenizer))
    for method in ["init", *methods]:
        shards, overrides = METHODS.get(method, METHODS["plain"])
        for seed in seeds:
            cfg = load_config(YAML, [*overrides, f"variables.data={data[shards]}", f"max_duration={size['steps']}ba",
                                           f"seed={seed}", f"run_name=two-teachers-{method}-{seed}"])
            student = (build_causal_lm(cfg.model, len(student_tok), seed) if method == "init" else
                       train(cfg).state.model.model)
            with torch.no_grad():
                values = heldout_bits_per_byte(student.eval(), student_tok)
            result["bits_per_byte"].setdefault(method, []).append(values)
            print(f"{method} seed {seed}: held-out bits per byte {values['overall']:.4f} overall, "
                  f"{values['gsm8k']:.4f} GSM8K, {values['math']:.4f} MATH ({time.perf_counter() - begin:.0f} s)",
                  flush=True)
    result["seconds"] = round(time.perf_counter() - begin)
    (out / "two_teachers.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{table(result)}\n\n{result['seconds']} s; wrote {out / 'two_teachers.json'}")
    return 0


if __name__ == "__main__":
    from vocagno import entry

    entry.run(main)  # a refusal: one line, exit 2
