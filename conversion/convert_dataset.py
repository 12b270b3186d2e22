"""Convert a text corpus into vocagno MDS shards: raw text, both tokenizations and both offset arrays per sample.

    python conversion/convert_dataset.py --out-root shards/owm                       # OpenWebMath from the hub
    python conversion/convert_dataset.py --input data/ more.jsonl --out-root shards/mine --workers 8
    python conversion/convert_dataset.py --out-root s3://bucket/owm --num-jobs 64 --job-index $SLURM_ARRAY_TASK_ID

The command of ``vocagno.conversion.convert`` (its ``main``, ``--help`` and docs/conversion.md say what it does).
"""

import sys
from pathlib import Path

if not __package__:  # run as the script it is (python conversion/convert_dataset.py): `conversion` is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vocagno.conversion.convert import main  # noqa: E402
from vocagno.entry import run  # noqa: E402

__all__ = ["main"]

if __name__ == "__main__":
    run(main)
