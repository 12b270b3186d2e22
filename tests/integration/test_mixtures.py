"""Training on several datasets mixed (Streaming's ``streams``, as llm-foundry yamls write them): proportions drawn,
streams made alike or refused by name, a kill and autoresume giving the uninterrupted run, per-stream logs."""

import os
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from composer import Trainer
from composer.loggers import InMemoryLogger
from composer.models import HuggingFaceModel
from helpers import Capture, assert_same_losses, kill_when, read_log, script
from transformers import LlamaConfig, LlamaForCausalLM

from vocagno.conversion.convert import main as convert_main
from vocagno import score
from vocagno.algorithms.vocagno_lm import VocAgnoLM
from vocagno.data.dataset import TeacherGuidedDataset, teacher_guided_loader
from vocagno.core.tokenization import ASSETS
from vocagno.teacher.teacher import Teacher

REPO = Path(__file__).resolve().parents[2]
TEXT = ASSETS / "text"


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("streams")
    for name, text, teacher in (("gsm", "gsm8k_train_500.jsonl", "mistral"), ("heldout", "gsm8k_heldout_100.jsonl",
                                                                              "mistral"),
                                ("qwen", "gsm8k_heldout_100.jsonl", "qwen2.5")):
        convert_main(["--input", str(TEXT / text), "--student-tokenizer", "llama2", "--teacher-tokenizer",
                      teacher, "--seq-len", "128", "--out-root", str(root / name)])
    return root


def test_streams_are_drawn_in_their_proportions_over_an_epoch(shards):
    dataset = TeacherGuidedDataset(streams={"gsm": {"local": str(shards / "gsm"), "proportion": 0.75},
                                            "heldout": {"local": str(shards / "heldout"), "proportion": 0.25}},
                                   epoch_size=400, shuffle=True, shuffle_seed=3, num_canonical_nodes=1, batch_size=8)
    drawn = Counter(int(sample["stream"]) for sample in dataset)
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
    streams = {name: {"local": str(shards / name), **w} for name, w in zip(("gsm", "heldout"), weights)}
    with pytest.raises(ValueError, match=message):
        TeacherGuidedDataset(streams=streams, batch_size=8)


def test_a_stream_that_is_no_shard_folder_is_named(shards, tmp_path):
    with pytest.raises(FileNotFoundError, match="stream 'b': .* holds no shards: convert a corpus into it first"):
        TeacherGuidedDataset(streams={"a": {"local": str(shards / "gsm")}, "b": {"local": str(tmp_path)}})


def train_command(shards, folder, name):
    streams = (f"{{gsm: {{local: {shards}/gsm, proportion: 0.75}}, "
               f"heldout: {{local: {shards}/heldout, proportion: 0.25}}}}")
    return [sys.executable, str(REPO / "train.py"), str(REPO / "yamls" / "tiny.yaml"),
            "train_loader.dataset.local=null", f"train_loader.dataset.streams={streams}",
            "train_loader.dataset.epoch_size=400",
            "train_loader.convert_if_missing=null", "eval_loader=null", "selection_report=null",
            "loggers.console=null", "loggers.picture=null", "max_duration=6ba", "save_interval=2ba", "autoresume=true",
            f"save_folder={folder}/ckpt", f"run_name={name}", f"loggers.jsonl.path={folder}/log.jsonl"]


@pytest.mark.slow
def test_a_mixture_trains_logs_each_streams_share_and_kept_fraction_and_resumes_after_a_kill(shards, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    straight = train_command(shards, tmp_path / "straight", "straight")
    assert script(straight[1], straight[2:], cwd=REPO).returncode == 0
    killed_at = tmp_path / "killed"
    command = train_command(shards, killed_at, "killed")
    kill_when(command, (killed_at / "ckpt" / "ep0-ba2-rank0.pt").exists, settle=0.5, cwd=REPO, env=env)
    result = script(command[1], command[2:], cwd=REPO)  # the same command again, here: the kill was the process
    assert result.returncode == 0, result.stderr[-4000:]
    expected, resumed = read_log(tmp_path / "straight" / "log.jsonl"), read_log(killed_at / "log.jsonl")
    trained = assert_same_losses(expected, resumed, 6)
    for step in trained:
        shares = [expected[step][f"vocagno/stream_share/{n}"] for n in ("gsm", "heldout")]
        assert sum(shares) == pytest.approx(1.0) and 0 <= expected[step]["vocagno/kept_fraction/heldout"] <= 1
    overall = [expected[s]["vocagno/stream_share/gsm"] for s in trained]
    assert 0.5 <= sum(overall) / len(overall) <= 1.0  # 6 batches of 8 from a 75/25 mixture


def tiny_llama(seed=0):
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=32000, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128))


def mixture_fit(shards, streams, teacher, scope="batch", batches=1, **options):
    """``batches`` steps of a tiny student on a 2-stream mixture, 8 rows a batch in microbatches of 4."""
    loader = teacher_guided_loader({"streams": {n: {"local": str(shards / n), "proportion": 0.5} for n in streams},
                                    "epoch_size": 64, "shuffle": True, "shuffle_seed": 1, "num_canonical_nodes": 1},
                                   "llama2", None, 8, drop_last=True)
    memory, capture, student = InMemoryLogger(), Capture(), tiny_llama()
    trainer = Trainer(model=HuggingFaceModel(student, use_logits=True), train_dataloader=loader,
                      max_duration=f"{batches}ba", device_train_microbatch_size=4, callbacks=[capture],
                      algorithms=[VocAgnoLM(teacher=Teacher(teacher, dtype="float32"), selection_scope=scope,
                                            **options)],
                      optimizers=torch.optim.SGD(student.parameters(), lr=0.1), device="cpu", loggers=[memory],
                      progress_bar=False)
    trainer.fit()
    return memory.data, capture


@pytest.mark.parametrize("scope", ["batch", "microbatch", "sequence"])
def test_each_streams_kept_fraction_is_logged_over_the_whole_batch_in_every_selection_scope(shards, scope):
    """``vocagno/kept_fraction/NAME`` adds the kept tokens of the stream's rows over both microbatches: the streams'
    kept tokens add up to the batch's (as the microbatches' loss dicts count them), their shares to its rows."""
    logged, capture = mixture_fit(shards, ("gsm", "heldout"), tiny_llama(1), scope, batches=2)
    for step, batch in enumerate(capture.batches):
        stream, labeled = batch["stream"], (batch["labels"][:, 1:] != -100).sum(1).float()
        pieces = capture.losses[2 * step : 2 * step + 2]
        if scope == "batch":  # each microbatch's counts are divided by the global batch's, times its share
            kept = sum(p["kept_fraction"] for p in pieces) * labeled.sum() / 2
        else:
            kept = sum(p["kept_fraction"] * labeled[4 * i : 4 * i + 4].sum() for i, p in enumerate(pieces))
        by_stream = 0.0
        for index, name in enumerate(("gsm", "heldout")):
            rows = stream == index
            assert logged[f"vocagno/stream_share/{name}"][step][1] == pytest.approx(rows.float().mean().item())
            if rows.any():
                fraction = logged[f"vocagno/kept_fraction/{name}"][step][1]
                assert 0.3 < fraction < 0.8  # 40% of the mapped tokens, plus the unmapped
                by_stream += fraction * labeled[rows].sum()
        assert float(by_stream) == pytest.approx(float(kept), rel=1e-5)


@pytest.fixture(scope="module")
def scored(shards, tmp_path_factory):
    """The held-out stream scored by the shipped tiny teacher, twice (two streams), and left unscored."""
    root = tmp_path_factory.mktemp("scored")
    assert score.main(["--shards", str(shards / "heldout"), "--teacher", "tiny-math-teacher", "--dtype", "float32",
                       "--device", "cpu", "--out", str(root / "one")]) == 0
    shutil.copytree(root / "one", root / "two")
    shutil.copytree(shards / "heldout", root / "unscored")
    return root


@pytest.mark.slow
def test_cached_losses_are_checked_in_every_stream_naming_the_one_that_differs(scored):
    teacher = "tiny-math-teacher"
    with pytest.raises(ValueError, match=f"stream 'unscored': teacher_losses: cached, but the training shards "
                                         f"\\({scored / 'unscored'}\\) carry no teacher losses"):
        mixture_fit(scored, ("one", "unscored"), teacher, teacher_losses="cached")
    with pytest.raises(ValueError, match="stream 'one': the shards were scored by 'tiny-math-teacher', but the teacher "
                                         "is 'another-teacher'"):
        mixture_fit(scored, ("one", "two"), "another-teacher", teacher_losses="cached")
    logged, capture = mixture_fit(scored, ("one", "two"), teacher, teacher_losses="cached")
    assert "teacher_loss" in capture.batches[0] and 0.3 < logged["vocagno/kept_fraction/two"][0][1] < 0.8
