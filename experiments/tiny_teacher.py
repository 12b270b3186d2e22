"""Make a shipped tiny teacher, ``vocagno/assets/models/NAME``, with the product's own training run.

    python experiments/tiny_teacher.py                               # tiny-math-teacher: 12 minutes on 2 CPU cores
    python experiments/tiny_teacher.py --teacher tiny-latex-teacher  # about 12 minutes on 2 idle CPU cores
    python experiments/tiny_teacher.py --out /tmp/t max_duration=20ba  # yaml overrides, for a quick look

Each teacher is ``train.py`` on its yaml, plain causal LM pretraining of a small model around a real tokenizer on text
no student of the tiny yamls or the miniature trains on:

* ``tiny-math-teacher`` (``yamls/tiny_teacher.yaml``): Mistral architecture and tokenizer (32K), GSM8K training
  problems 601-7,473 (``vocagno/assets/text/gsm8k_train_rest.jsonl.gz``); held out: GSM8K problems 501-600.
* ``tiny-latex-teacher`` (``yamls/tiny_latex_teacher.yaml``): Llama architecture, DeepSeek-LLM's tokenizer (100K),
  3,813 MATH problems in LaTeX (``vocagno/assets/text/math_teacher.jsonl.gz``, ``experiments/math_text.py``: MATH
  test without MATH-500); held out: 100 other MATH problems (``math_heldout_100.jsonl``).

The result is saved as a Hugging Face folder, bf16 safetensors. The tokenizer is not copied:
``vocagno.core.tokenization.shipped_model_dir`` adds the shipped one ``SHIPPED_MODELS`` names when it unpacks the model.
The run's held-out bits per byte is printed and kept in ``training.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from vocagno.training.config import load_config  # noqa: E402
from vocagno.train import train  # noqa: E402
from vocagno.core.tokenization import ASSETS, SHIPPED_MODELS  # noqa: E402

YAMLS = {"tiny-math-teacher": "tiny_teacher.yaml", "tiny-latex-teacher": "tiny_latex_teacher.yaml"}


# What tiny_teacher.yaml converts, for shard folders named by variables.data and variables.heldout.
OWN_CORPORA = ["train_loader.convert_if_missing.input=vocagno/assets/text/gsm8k_train_rest.jsonl.gz",
               "eval_loader.convert_if_missing.input=vocagno/assets/text/gsm8k_heldout_100.jsonl"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", choices=YAMLS, default="tiny-math-teacher")
    parser.add_argument("--out", help="the model's folder (default: vocagno/assets/models/TEACHER)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the teacher's yaml")
    args = parser.parse_args(argv)
    yaml = REPO / "yamls" / YAMLS[args.teacher]
    cfg = load_config(str(yaml), ["loggers.console={}", *args.overrides])
    if cfg.tokenizer.name != SHIPPED_MODELS[args.teacher]:  # the tokenizer shipped beside it must be the one it read
        raise SystemExit(f"{yaml.name} trains with tokenizer {cfg.tokenizer.name!r}, but {args.teacher} ships with "
                         f"{SHIPPED_MODELS[args.teacher]!r} (vocagno.core.tokenization.SHIPPED_MODELS)")
    os.chdir(REPO)  # the yaml's shard paths are relative to the repository
    trainer = train(cfg)
    bits_per_byte = float(trainer.state.eval_metric_values["BitsPerByte"])
    model = trainer.state.model.model
    model.config.use_cache = True  # train.py turns it off for training forwards; a teacher that generates wants it
    out = Path(args.out or ASSETS / "models" / args.teacher)
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    settings = [o for o in args.overrides if not o.startswith("variables.")]  # not where the shards were put
    record = {"made_by": " ".join(["python experiments/tiny_teacher.py", "--teacher", args.teacher, *settings]),
              "yaml": yaml.name, "tokenizer": cfg.tokenizer.name, "steps": int(trainer.state.timestamp.batch),
              "heldout_bits_per_byte": round(bits_per_byte, 4)}
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}: held-out bits per byte {bits_per_byte:.4f} after {record['steps']} steps")
    return 0


if __name__ == "__main__":
    from vocagno import entry

    entry.run(main)  # a refusal: one line, exit 2
