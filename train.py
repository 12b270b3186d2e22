"""Train a student with Composer, guided by a teacher of another vocabulary (VocAgnoLM), in llm-foundry's conventions.

    composer train.py yamls/qwen_teacher.yaml [key=value ...]      # every GPU of the node
    python train.py yamls/tiny.yaml max_duration=6ba save_folder=runs/x save_interval=3ba autoresume=true

The face of ``vocagno.train``: ``train(cfg)`` is the run, ``command(argv)`` this command line. The yaml's keys
are on docs/training.md.
"""

import sys
from pathlib import Path

from vocagno.entry import run
from vocagno.train import MISTAKES, command

if __name__ == "__main__":
    # A mistake ends in one line error: ...; VOCAGNO_TRACEBACK=1 shows its traceback.
    run(lambda: command(sys.argv[1:], docs=Path(__file__).resolve().parent / "docs" / "training.md"), MISTAKES)
