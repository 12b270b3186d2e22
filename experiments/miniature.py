"""The miniature: does a teacher of another vocabulary make a student learn better from mixed data? Run through the
product's own commands, as a user would run them.

    python experiments/miniature.py --size cpu                 # a 2-core CPU, 3 seeds, at most 45 minutes
    python experiments/miniature.py --size gpu                 # one GPU (not yet run)
    python experiments/miniature.py --size toy --seeds 0       # the same chain in a few minutes (CI runs it)

1. **Convert.** The students' corpus is GSM8K training problems 1-500 (``vocagno/assets/text``; the toy size takes
   the first 100) and, ``--junk`` of all documents, copies of them with their words shuffled (the same words, no
   sense); it is converted with ``conversion/convert_dataset.py`` (Llama-2's tokenizer for the student, Mistral's for
   the teacher), and so is the held-out text, problems 501-600 (the toy size: 501-530).
2. **The teacher** is the shipped ``tiny-math-teacher``, pretrained on problems 601-7,473 (``experiments/
   tiny_teacher.py``): clean text the students never see. ``--size gpu`` pretrains a larger one the same way.
3. **Score once**: ``python -m vocagno.score`` writes the corpus again with the teacher's loss of each token.
4. **Train** with ``train.py yamls/miniature.yaml`` (``teacher_losses: cached``: no teacher is loaded), per method
   and seed, students from the same initialization and the same data order for a seed: ``plain`` (continual
   pretraining on every token), ``vocagno_40`` (the top 40%), ``vocagno_clean`` (the top-k at the corpus's clean
   share of mapped tokens: ideally every clean token and no junk), ``random_40`` (40% drawn at random), ``chunk_1``
   and ``chunk_16`` (the paper's chunk-level alignment, the chunk's mean loss). ULD and KLD need the teacher online at
   every step (its whole distribution per token), which does not fit the CPU size's budget: not run by default.
   Asked for by ``--methods``: ``uld_online`` (ULD paired by position, the teacher live), ``uld_cached`` and
   ``cross_kd_cached`` (ULD and cross-vocabulary KD from the teacher's top 32 cached by the same scoring pass, which
   then runs with ``--top-k 32``: ``docs/training.md``'s cached distributions).
5. **Measure**: each student's held-out bits per byte (``vocagno.training.metrics.bits_per_byte``, tokenizer-independent),
   the teacher's, the students' at initialization; and each selecting method's precision (``vocagno.selection`` on
   the held-out shards with canaries of the corpus's kind and fraction, ranked with the method's first-seed student).
6. ``OUT/miniature.json``, printed by ``python -m vocagno.report --miniature OUT/miniature.json [--plot bpb.png]``:
   mean ± sd over seeds per method, and each method against plain: the mean paired difference and whether it
   exceeds twice the paired differences' sd.
"""

from __future__ import annotations

import argparse
import json
import os
import random
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
from vocagno import score  # noqa: E402
from vocagno.diagnostics.canaries import NOISE  # noqa: E402
from vocagno.training.metrics import bits_per_byte  # noqa: E402
from vocagno.teacher.teacher import Teacher  # noqa: E402
from vocagno.core.tokenization import ASSETS, load_tokenizer  # noqa: E402

YAML = str(REPO / "yamls" / "miniature.yaml")
TEACHER = "tiny-math-teacher"
# A method: overrides of yamls/miniature.yaml ({clean} is the corpus's clean share of mapped tokens).
METHODS = {
    "plain": ["teacher=null", "algorithms.vocagno=null"],
    "vocagno_40": ["algorithms.vocagno.topk_ratio=0.4"],
    "vocagno_clean": ["algorithms.vocagno.topk_ratio={clean}"],
    "random_40": ["algorithms.vocagno.topk_ratio=0.4", "algorithms.vocagno.selection=random"],
    "chunk_1": ["algorithms.vocagno.alignment=chunk", "algorithms.vocagno.num_chunks=1",
                "algorithms.vocagno.aggregation=mean"],
    "chunk_16": ["algorithms.vocagno.alignment=chunk", "algorithms.vocagno.num_chunks=16",
                 "algorithms.vocagno.aggregation=mean"],
}
# Distillation from the teacher's distributions, run when --methods names them (the scoring pass stores its top 32).
DISTILLATION = {
    "uld_online": ["algorithms.vocagno=null", "algorithms.uld.weight=1.5"],
    "uld_cached": ["algorithms.vocagno=null", "algorithms.uld.teacher_losses=cached", "algorithms.uld.top_k=32"],
    "cross_kd_cached": ["algorithms.vocagno=null", "algorithms.cross_kd.teacher_losses=cached",
                        "algorithms.cross_kd.top_k=32"],
}
TOP_K = 32
# The selection variant (vocagno.selection) that measures what each selecting method keeps.
VARIANT = {"vocagno_40": "topk", "vocagno_clean": "topk", "random_40": "random", "chunk_1": "chunk_1",
           "chunk_16": "chunk_16"}
SIZES = {
    # docs: the clean training documents (the first of problems 1-500); heldout: the held-out ones (of 501-600).
    "toy": {"steps": 4, "seeds": "0", "docs": 100, "heldout": 30, "overrides": [], "selection_samples": 8},
    "cpu": {"steps": 250, "seeds": "0,1,2", "docs": 500, "heldout": 100, "overrides": [], "selection_samples": 64},
    "gpu": {"steps": 1500, "seeds": "0,1,2", "docs": 500, "heldout": 100, "selection_samples": 256, "overrides": [
        "global_train_batch_size=32", "device_train_microbatch_size=32", "precision=amp_bf16", "optimizer.lr=1.0e-3",
        "model.config.hidden_size=384", "model.config.intermediate_size=1024", "model.config.num_hidden_layers=6",
        "model.config.num_attention_heads=6", "model.config.num_key_value_heads=6"],
        "teacher_overrides": ["max_duration=3000ba", "model.config.hidden_size=384",
                              "model.config.intermediate_size=1024", "model.config.num_hidden_layers=6",
                              "model.config.num_attention_heads=6", "model.config.num_key_value_heads=6",
                              "precision=amp_bf16"]},
}


def texts(name: str) -> list[str]:
    with open(ASSETS / "text" / name, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def corpus(junk: float, docs: int, seed: int = 0) -> list[str]:
    """The first ``docs`` GSM8K problems of 1-500 and word-shuffled copies of them, ``junk`` of all documents, in a
    random order."""
    rng = random.Random(seed)
    clean = texts("gsm8k_train_500.jsonl")[:docs]
    count = round(len(clean) * junk / (1 - junk))
    mixed = clean + [NOISE["shuffled_words"](rng.choice(clean), rng) for _ in range(count)]
    rng.shuffle(mixed)
    return mixed


def convert(documents: list[str], out: Path) -> Path:
    if (out / "index.json").exists():
        return out
    source = out.with_suffix(".jsonl")
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in documents), encoding="utf-8")
    code = convert_main(["--input", str(source), "--student-tokenizer", "llama2", "--teacher-tokenizer",
                         "mistral", "--seq-len", "128", "--out-root", str(out)])
    if code != 0:
        raise SystemExit(f"error: converting {source} failed")
    return out


def clean_share(documents: list[str]) -> float:
    """The clean documents' share of the corpus's student tokens: the top-k ratio that could keep exactly them."""
    tokenizer = load_tokenizer("llama2")
    clean = set(texts("gsm8k_train_500.jsonl"))
    counts = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in documents]
    return round(sum(c for t, c in zip(documents, counts) if t in clean) / sum(counts), 3)


def experiment_parser(description: str, methods: dict, sizes: dict, out: str) -> argparse.ArgumentParser:
    """The options an experiment of this folder takes: its size, seeds, junk fraction, methods and work folder."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--size", choices=sorted(sizes), default="cpu")
    parser.add_argument("--seeds", help="comma-separated student seeds (default: the size's)")
    parser.add_argument("--junk", type=float, default=0.5, help="the fraction of word-shuffled documents, in (0, 1)")
    parser.add_argument("--methods", default=",".join(methods), help="comma-separated, of " + ", ".join(methods))
    parser.add_argument("--out", default=out, help=f"the work folder; OUT/{out}.json is the result")
    return parser


def experiment_settings(parser: argparse.ArgumentParser, args, methods: dict, sizes: dict):
    """``args`` checked: the methods to run (plain among them), the size, the seeds and the work folder."""
    if not 0 < args.junk < 1:
        parser.error(f"--junk must be in (0, 1), got {args.junk}")
    chosen = args.methods.split(",")
    if set(chosen) - set(methods) or "plain" not in chosen:
        parser.error(f"--methods takes plain and others of {', '.join(methods)}, got {args.methods}")
    size = sizes[args.size]
    return chosen, size, [int(s) for s in (args.seeds or size["seeds"]).split(",")], Path(args.out).resolve()


def main(argv: list[str] | None = None) -> int:
    parser = experiment_parser(__doc__.split("\n\n")[0], {**METHODS, **DISTILLATION}, SIZES, "miniature")
    parser.set_defaults(methods=",".join(METHODS))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    methods, size, seeds, out = experiment_settings(parser, args, {**METHODS, **DISTILLATION}, SIZES)
    begin = time.perf_counter()

    documents = corpus(args.junk, size["docs"])
    heldout = texts("gsm8k_heldout_100.jsonl")[:size["heldout"]]
    shards = convert(documents, out / "shards" / "corpus")
    heldout_shards = convert(heldout, out / "shards" / "heldout")
    share = clean_share(documents)
    teacher_name = TEACHER
    if "teacher_overrides" in size and args.device != "cpu":
        teacher_name = str(out / "teacher")
        if not (out / "teacher" / "model.safetensors").exists():
            from experiments import tiny_teacher

            tiny_teacher.main(["--out", teacher_name, f"variables.data={out}/shards/teacher",
                               f"variables.heldout={out}/shards/teacher-heldout", *tiny_teacher.OWN_CORPORA,
                               *size["teacher_overrides"]])
    scored = out / "shards" / "scored"
    if not (scored / "index.json").exists():
        distributions = ["--top-k", str(TOP_K)] if set(methods) & set(DISTILLATION) else []
        score.main(["--shards", str(shards), "--teacher", teacher_name, "--dtype", "float32", "--out", str(scored),
                    "--device", args.device, *distributions])
    teacher = Teacher(teacher_name, dtype="float32")  # loaded once
    teacher_model = teacher.scorer().to(args.device).model
    student_tok = load_tokenizer("llama2")
    result = {
        "size": args.size, "seeds": seeds, "junk": args.junk, "clean_share": share, "steps": size["steps"],
        "device": args.device, "teacher": teacher_name,
        "teacher_bits_per_byte": bits_per_byte(teacher_model.eval(), load_tokenizer("mistral"), heldout),
        "bits_per_byte": {}, "selection_precision": {},
    }
    common = [f"variables.data={scored}", f"max_duration={size['steps']}ba", *size["overrides"]]
    for method in ["init", *methods]:
        for seed in seeds:
            overrides = [o.replace("{clean}", str(share))
                         for o in {**METHODS, **DISTILLATION}.get(method, METHODS["plain"])]
            if method not in ("init", "plain"):
                overrides.append(f"teacher.name_or_path={teacher_name}")
            overrides += [*common, f"seed={seed}", f"run_name=miniature-{method}-{seed}"]
            cfg = load_config(YAML, overrides)
            student = (build_causal_lm(cfg.model, len(student_tok), seed) if method == "init" else
                       train(cfg).state.model.model)
            value = bits_per_byte(student.to(args.device).eval(), student_tok, heldout)
            result["bits_per_byte"].setdefault(method, []).append(value)
            print(f"{method} seed {seed}: held-out bits per byte {value:.4f} "
                  f"({time.perf_counter() - begin:.0f} s)", flush=True)
            if method in VARIANT and seed == seeds[0]:
                result["selection_precision"][method] = precision(heldout_shards, teacher, cfg, student, method,
                                                                  args, size, seed)
    result["seconds"] = round(time.perf_counter() - begin)
    (out / "miniature.json").write_text(json.dumps(result, indent=1) + "\n")
    from vocagno.report import miniature_table

    print(f"\n{miniature_table(result)}\nwrote {out / 'miniature.json'}")
    return 0


def precision(heldout_shards: Path, teacher: Teacher, cfg, student, method: str, args, size: dict,
              seed: int) -> float:
    """What ``method`` keeps of held-out text with canaries of the corpus's kind and fraction, ranked with its
    trained student: the precision of its selection variant."""
    from vocagno.diagnostics.selection import Settings, run

    report = run(str(heldout_shards), teacher, Settings.from_config(cfg), student=student,
                 student_name=f"{method} seed {seed}", samples=size["selection_samples"], canaries=args.junk,
                 noise=("shuffled_words",), seed=seed, device=args.device)
    return report.variants[VARIANT[method]]["precision"]


if __name__ == "__main__":
    from vocagno import entry

    entry.run(main)  # a refusal: one line, exit 2
