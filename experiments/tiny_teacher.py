"""Make the shipped tiny teacher, ``vocagno/assets/models/tiny-math-teacher``, with the product's own training run.

    python experiments/tiny_teacher.py                 # about 12 minutes on a 2-core CPU
    python experiments/tiny_teacher.py --out /tmp/t max_duration=20ba   # yaml overrides, for a quick look

``train.py yamls/tiny_teacher.yaml`` pretrains a small Mistral-architecture model (Mistral's real 32K tokenizer) on
GSM8K training problems 601-7,473 (``vocagno/assets/text/gsm8k_train_rest.jsonl.gz``: text no student of the tiny
yamls or the miniature trains on); the result is saved as a Hugging Face folder, bf16 safetensors (the tokenizer is
not copied: ``vocagno.tokenization.shipped_model_dir`` adds the shipped Mistral tokenizer when it unpacks the
model). The run's held-out bits per byte (GSM8K problems 501-600) is printed and kept in ``training.json``.
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

import train  # noqa: E402

YAML = REPO / "yamls" / "tiny_teacher.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "vocagno" / "assets" / "models" / "tiny-math-teacher"))
    parser.add_argument("overrides", nargs="*", help="key=value overrides of yamls/tiny_teacher.yaml")
    args = parser.parse_args(argv)
    os.chdir(REPO)  # the yaml's shard paths are relative to the repository
    trainer = train.main(train.load_config(str(YAML), ["loggers.console={}", *args.overrides]))
    bits_per_byte = float(trainer.state.eval_metric_values["BitsPerByte"])
    model = trainer.state.model.model
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    settings = [o for o in args.overrides if not o.startswith("variables.")]  # not where the shards were put
    record = {"made_by": " ".join(["python experiments/tiny_teacher.py", *settings]), "yaml": YAML.name,
              "tokenizer": "mistral", "steps": int(trainer.state.timestamp.batch),
              "heldout_bits_per_byte": round(bits_per_byte, 4)}
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}: held-out bits per byte {bits_per_byte:.4f} after {record['steps']} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
