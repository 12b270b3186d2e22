"""What a run says at its start it will do (vocagno.training.plan): batches and tokens from the yaml's durations in
any unit, and a bare number named as the epochs it is."""

from pathlib import Path

import pytest

from vocagno.training.config import load_config
from vocagno.training.plan import batches_of, plan_line

TINY = str(Path(__file__).resolve().parents[2] / "yamls" / "tiny.yaml")


@pytest.mark.parametrize("value, batches", [("80ba", 80), ("2ep", 124), (3, 186), ("100sp", 13), ("10240tok", 10),
                                            ("0.5dur", 40)])
def test_each_unit_counts_in_batches(value, batches):
    assert batches_of(value, batches_an_epoch=62, batch_samples=8, seq_len=128, total=80) == batches


def test_the_tiny_run_says_its_length_warm_up_evaluations_and_checkpoints():
    cfg = load_config(TINY, ["save_folder=runs/x", "save_interval=20ba"])
    assert plan_line(cfg, samples=500, seq_len=128) == (
        "training 80 batches of 8 samples x 128 student tokens (81,920 tokens; 62 batches an epoch of 500 samples); "
        "warm-up 10 batches; held-out bits per byte every 40 batches; a checkpoint every 20 batches into runs/x")


def test_a_duration_without_a_unit_is_named_as_the_epochs_it_is():
    cfg = load_config(TINY, ["max_duration=30", "eval_loader=null"])
    line = plan_line(cfg, samples=500, seq_len=128)
    assert line.startswith("training 1,860 batches of 8 samples x 128 student tokens (1,904,640 tokens; 62 batches")
    assert "max_duration 30 is 30 epochs: a number without a unit is epochs to Composer (write 30ba for batches)" in line
