"""Training on several datasets mixed (Streaming's ``streams``, as llm-foundry yamls write them): proportions drawn,
streams made alike or refused by name, a kill and autoresume giving the uninterrupted run, per-stream logs."""

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from helpers import assert_same_losses, kill_when, read_log
from streaming.base.util import clean_stale_shared_memory

from conversion import convert_dataset
from vocagno.data import TeacherGuidedDataset
from vocagno.tokenization import ASSETS

REPO = Path(__file__).resolve().parent.parent
TEXT = ASSETS / "text"


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("streams")
    for name, text, teacher in (("gsm", "gsm8k_train_500.jsonl", "mistral"), ("heldout", "gsm8k_heldout_100.jsonl",
                                                                              "mistral"),
                                ("qwen", "gsm8k_heldout_100.jsonl", "qwen2.5")):
        convert_dataset.main(["--input", str(TEXT / text), "--student-tokenizer", "llama2", "--teacher-tokenizer",
                              teacher, "--seq-len", "128", "--out-root", str(root / name)])
    return root


def test_streams_are_drawn_in_their_proportions_over_an_epoch(shards):
    clean_stale_shared_memory()
    dataset = TeacherGuidedDataset(streams={"gsm": {"local": str(shards / "gsm"), "proportion": 0.75},
                                            "heldout": {"local": str(shards / "heldout"), "proportion": 0.25}},
                                   epoch_size=400, shuffle=True, shuffle_seed=3, num_canonical_nodes=1, batch_size=8)
    drawn = Counter(int(sample["stream"]) for sample in dataset)
    clean_stale_shared_memory()
    assert dataset.stream_names == ["gsm", "heldout"] and sum(drawn.values()) == 400
    assert abs(drawn[0] / 400 - 0.75) <= 0.02, drawn  # Streaming draws the proportions exactly, up to rounding


def test_a_stream_made_with_another_tokenizer_is_refused_by_name(shards):
    with pytest.raises(ValueError, match=r"stream 'other': made with the teacher tokenizer 'qwen2.5', stream 'gsm' "
                                         r"with 'mistral'"):
        TeacherGuidedDataset(streams={"gsm": {"local": str(shards / "gsm")},
                                      "other": {"local": str(shards / "qwen")}}, batch_size=8)
    with pytest.raises(ValueError, match="give local .* or streams .*, not both"):
        TeacherGuidedDataset(local=str(shards / "gsm"), streams={"gsm": {"local": str(shards / "gsm")}})


@pytest.mark.parametrize("weights, message", [
    (({"proportion": 0.5}, {"repeat": 2}), r"streams \(0: 'gsm', 1: 'heldout'\): Relative \(`proportion`\) and "
                                           r"absolute .* incompatible"),
    (({"proportion": -1}, {"proportion": 0.5}), "`proportion` must be non-negative"),
    (({"weight": 2}, {}), "unexpected keyword argument 'weight'"),
])
def test_weights_streaming_refuses_are_one_line_naming_the_streams(shards, weights, message):
    clean_stale_shared_memory()
    streams = {name: {"local": str(shards / name), **w} for name, w in zip(("gsm", "heldout"), weights)}
    with pytest.raises(ValueError, match=message):
        TeacherGuidedDataset(streams=streams, batch_size=8)
    clean_stale_shared_memory()


def test_a_stream_that_is_no_shard_folder_is_named(shards, tmp_path):
    with pytest.raises(FileNotFoundError, match="stream 'b': .*vocagno.json is missing"):
        TeacherGuidedDataset(streams={"a": {"local": str(shards / "gsm")}, "b": {"local": str(tmp_path)}})


def train_command(shards, folder, name):
    streams = (f"{{gsm: {{local: {shards}/gsm, proportion: 0.75}}, "
               f"heldout: {{local: {shards}/heldout, proportion: 0.25}}}}")
    return [sys.executable, str(REPO / "train.py"), str(REPO / "yamls" / "tiny.yaml"),
            "train_loader.dataset.local=null", f"train_loader.dataset.streams={streams}",
            "train_loader.dataset.epoch_size=400",
            "train_loader.convert_if_missing=null", "eval_loader=null", "selection_report=null",
            "loggers.console=null", "max_duration=6ba", "save_interval=2ba", "autoresume=true",
            f"save_folder={folder}/ckpt", f"run_name={name}", f"loggers.jsonl.path={folder}/log.jsonl"]


def test_a_mixture_trains_logs_each_streams_share_and_kept_fraction_and_resumes_after_a_kill(shards, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    straight = train_command(shards, tmp_path / "straight", "straight")
    assert subprocess.run(straight, cwd=REPO, env=env, capture_output=True, timeout=900).returncode == 0
    killed_at = tmp_path / "killed"
    command = train_command(shards, killed_at, "killed")
    kill_when(command, (killed_at / "ckpt" / "ep0-ba2-rank0.pt").exists, settle=0.5, cwd=REPO, env=env)
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    expected, resumed = read_log(tmp_path / "straight" / "log.jsonl"), read_log(killed_at / "log.jsonl")
    trained = assert_same_losses(expected, resumed, 6)
    for step in trained:
        shares = [expected[step][f"vocagno/stream_share/{n}"] for n in ("gsm", "heldout")]
        assert sum(shares) == pytest.approx(1.0) and 0 <= expected[step]["vocagno/kept_fraction/heldout"] <= 1
    overall = [expected[s]["vocagno/stream_share/gsm"] for s in trained]
    assert 0.5 <= sum(overall) / len(overall) <= 1.0  # 6 batches of 8 from a 75/25 mixture
