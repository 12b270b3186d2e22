"""Score once, train many: shards scored by python -m vocagno.score train as the online teacher does, loading none;
the scoring pass splits over ranks, resumes after a kill and writes to remote out-roots as the converter does."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from composer import Trainer
from composer.models import HuggingFaceModel
from helpers import Reached, command, first_documents, kill_group, reached
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from vocagno.conversion.convert import main as convert_main
from test_algorithm import Capture, tiny
from vocagno import score
from vocagno.teacher import scoring
from vocagno.errors import Refused
from vocagno.algorithms.vocagno_lm import VocAgnoLM
from vocagno.data.dataset import TeacherGuidedCollator, TeacherGuidedDataset
from vocagno.data.outroots import Output
from vocagno.teacher.model import TeacherScorer, weights_fingerprint
from vocagno.teacher.teacher import Teacher
from vocagno.data.shards import ShardMetadata
from vocagno.core.tokenization import ASSETS

REPO = Path(__file__).resolve().parents[2]
PARTS = 20  # input shards, one per converter part of 5 documents


@pytest.fixture(scope="module")
def scored(tmp_path_factory, tokenizers):
    root = tmp_path_factory.mktemp("score")
    convert_main(["--input", str(ASSETS / "text" / "gsm8k_heldout_100.jsonl"), "--student-tokenizer", "llama2",
                  "--teacher-tokenizer", "qwen2.5", "--seq-len", "64", "--docs-per-part", "5",
                  "--out-root", str(root / "shards")])
    tiny(Qwen2Config, Qwen2ForCausalLM, 152064).save_pretrained(root / "teacher")
    tokenizers["qwen2.5"].save_pretrained(root / "teacher")
    assert score.main(["--shards", str(root / "shards"), "--teacher", str(root / "teacher"), "--out",
                       str(root / "scored"), "--dtype", "float32", "--batch-tokens", "640", "--device", "cpu"]) == 0
    return root


def read(root: Path) -> list[dict]:
    dataset = TeacherGuidedDataset(local=str(root), batch_size=1)
    return [{k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in dataset[i].items()}
            for i in range(len(dataset))]


def shard_sizes(root: Path) -> list[int]:
    return [shard["samples"] for shard in json.loads((root / "index.json").read_text())["shards"]]


def same_samples(ours: list[dict], theirs: list[dict]) -> None:
    assert len(ours) == len(theirs)
    for one, other in zip(ours, theirs):
        assert sorted(one) == sorted(other)
        for key, value in one.items():
            if isinstance(value, np.ndarray):
                assert value.dtype == other[key].dtype and np.array_equal(value, other[key], equal_nan=True), key
            else:
                assert value == other[key], key


def fit(shards, tokenizers, teacher, lr=0.5, check_scored_by=True, **options):
    dataset = TeacherGuidedDataset(local=str(shards), batch_size=8)
    loader = DataLoader(dataset, batch_size=8, collate_fn=TeacherGuidedCollator(tokenizers["llama2"].eos_token_id,
                                                                               tokenizers["qwen2.5"].pad_token_id))
    student, capture = tiny(LlamaConfig, LlamaForCausalLM, 32000), Capture()
    algorithm = VocAgnoLM(teacher=Teacher(teacher, dtype="float32", check_scored_by=check_scored_by), **options)
    Trainer(model=HuggingFaceModel(student, use_logits=True), train_dataloader=loader, max_duration="2ba",
            device_train_microbatch_size=4, callbacks=[capture], algorithms=[algorithm],
            optimizers=torch.optim.SGD(student.parameters(), lr=lr), device="cpu", loggers=[],
            progress_bar=False).fit()
    return algorithm, capture


def test_the_scored_shards_hold_the_inputs_samples_shard_for_shard_with_the_teachers_losses(scored):
    """One shard per input shard, the same samples in the same order (a shuffled run sees the same order), each with
    the teacher's loss of each teacher token: what TeacherScorer gives the sample's row alone, in float16."""
    assert shard_sizes(scored / "scored") == shard_sizes(scored / "shards")
    assert len(shard_sizes(scored / "shards")) == PARTS
    meta = ShardMetadata.read(scored / "scored")
    assert meta.scored_by == {"name": str(scored / "teacher"), "dtype": "float32",
                              "fingerprint": weights_fingerprint(tiny(Qwen2Config, Qwen2ForCausalLM, 152064))}
    plain, losses = read(scored / "shards"), read(scored / "scored")
    same_samples([{k: v for k, v in s.items() if k != "teacher_loss"} for s in losses], plain)
    scorer = TeacherScorer(tiny(Qwen2Config, Qwen2ForCausalLM, 152064))
    for sample in losses[:: len(losses) // 7]:
        ids = torch.from_numpy(sample["teacher_ids"].astype(np.int64))[None]
        alone = scorer(ids, torch.ones_like(ids))[0].half().numpy()
        assert len(sample["teacher_loss"]) == ids.shape[1]
        assert np.array_equal(sample["teacher_loss"], sample["teacher_loss"].astype(np.float16), equal_nan=True)
        assert np.isnan(sample["teacher_loss"][0]) and not np.isnan(sample["teacher_loss"][1:]).any()
        np.testing.assert_allclose(sample["teacher_loss"], alone, rtol=2e-3, atol=2e-3, equal_nan=True)


@pytest.mark.slow
def test_the_scoring_pass_and_the_selection_report_start_without_composer():
    """Every rank of a scoring or selection job imports neither Composer nor what only training needs: what they share
    with training (the teacher's loading, scoring and sharding) is vocagno.teacher.model's, about 1.6 s less CPU a process."""
    code = ("import sys, vocagno.score, vocagno.selection; print(sorted(m for m in sys.modules if "
            "m == 'vocagno.algorithms.vocagno_lm' or m.split('.')[0] in ('composer', 'torchmetrics')))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"


def test_length_batches_hold_similar_lengths_within_the_token_budget():
    lengths = [130, 10, 500, 70, 64, 129, 700]
    batches = scoring.length_batches(lengths, batch_tokens=512)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    assert batches == [[1, 4, 3], [5, 0], [2], [6]]  # 3 x 128 <= 512 up to 70; 129 and 130 pad to 192: 2 x 192
    for batch in batches:
        assert len(batch) == 1 or len(batch) * -(-max(lengths[i] for i in batch) // 64) * 64 <= 512


# The Table 3 cells (unmapped x aggregation), the other selection scopes, the chunk alignment, another top-k. The
# README's test command takes the first five (include/max, exclude/mean, each other scope, the chunk alignment); the
# min aggregation, the other unmapped/aggregation pairs and top-k 0.2 are marked slow.
CELLS = [dict(unmapped="include", aggregation="max"), dict(unmapped="exclude", aggregation="mean"),
         dict(selection_scope="microbatch"), dict(selection_scope="sequence"),
         dict(alignment="chunk", num_chunks=4, aggregation="mean")] + [
    pytest.param(cell, marks=pytest.mark.slow) for cell in (
        dict(unmapped="include", aggregation="mean"), dict(unmapped="include", aggregation="min"),
        dict(unmapped="exclude", aggregation="max"), dict(unmapped="exclude", aggregation="min"),
        dict(topk_ratio=0.2))]


@pytest.mark.parametrize("options", CELLS, ids=lambda o: "-".join(map(str, o.values())))
def test_cached_losses_give_the_online_teachers_training_without_a_teacher(scored, tokenizers, monkeypatch, options):
    """Batch for batch, the same selection and loss as the online teacher whose losses are rounded to float16 as the
    shards store them (without the rounding, the tiny random models' scores, crowded around the top-k threshold,
    would trade a few tokens across it). One scoring pass serves every cell."""
    teacher = str(scored / "teacher")
    cached_algorithm, cached = fit(scored / "scored", tokenizers, teacher, teacher_losses="cached", **options)
    assert cached_algorithm.scorer is None  # no teacher was loaded
    online_forward = TeacherScorer.forward
    monkeypatch.setattr(TeacherScorer, "forward", lambda self, *a: online_forward(self, *a).half().float())
    _, online = fit(scored / "shards", tokenizers, teacher, **options)
    assert len(online.batches) == len(cached.batches) == 2 and len(online.losses) == len(cached.losses) == 4
    if options.get("selection_scope", "batch") == "batch":
        for one, other in zip(online.batches, cached.batches):
            torch.testing.assert_close(other["teacher_loss"], one["teacher_loss"], equal_nan=True)
            assert torch.equal(one["vocagno_selected"], other["vocagno_selected"])
    for one, other in zip(online.losses, cached.losses):
        for key, value in one.items():
            torch.testing.assert_close(other[key], value, rtol=1e-5, atol=1e-6)


def test_cached_mode_refuses_unscored_shards_and_another_teacher(scored, tokenizers, capsys):
    with pytest.raises(ValueError) as refused:
        fit(scored / "shards", tokenizers, str(scored / "teacher"), teacher_losses="cached")
    assert str(refused.value) == (
        f"teacher_losses: cached, but the training shards ({scored / 'shards'}) carry no teacher losses: score them "
        f"first (python -m vocagno.score --shards {scored / 'shards'} --teacher TEACHER --out SCORED) and train on "
        "SCORED")
    with pytest.raises(ValueError, match="scored by .* but the teacher is 'Qwen/Qwen2.5-Math-7B-Instruct'.*check_sco"):
        fit(scored / "scored", tokenizers, "Qwen/Qwen2.5-Math-7B-Instruct", teacher_losses="cached")
    torch.manual_seed(1)  # a teacher module of other weights than the one that scored
    other = Qwen2ForCausalLM(tiny(Qwen2Config, Qwen2ForCausalLM, 152064).config)
    with pytest.raises(ValueError, match="but this run's teacher has other weights"):
        fit(scored / "scored", tokenizers, other, teacher_losses="cached")
    # Told the name is only a label, the run takes the shards' losses and says whose they are.
    algorithm, _ = fit(scored / "scored", tokenizers, "Qwen/Qwen2.5-Math-7B-Instruct", teacher_losses="cached",
                       check_scored_by=False)
    assert algorithm.scorer is None and f"scored by {{'name': '{scored / 'teacher'}'" in capsys.readouterr().out


@pytest.mark.slow
def test_ranks_score_their_own_parts_and_the_last_to_finish_publishes(scored, tmp_path, monkeypatch):
    """Ranks as torchrun and composer -n name them (RANK, WORLD_SIZE): each scores every third part; the dataset is
    published by the last to finish, and is the one-rank result."""
    command = ["--shards", str(scored / "shards"), "--teacher", str(scored / "teacher"), "--dtype", "float32",
               "--batch-tokens", "640", "--device", "cpu", "--out", str(tmp_path / "ranks")]
    monkeypatch.setenv("WORLD_SIZE", "3")
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        assert score.main(command) == 0
    assert sorted(p.name for p in (tmp_path / "ranks").glob("part-*")) == [f"part-{i:05d}" for i in range(PARTS)
                                                                           if i % 3 != 2]
    assert not (tmp_path / "ranks" / "index.json").exists()  # rank 2 has not finished
    monkeypatch.setenv("RANK", "2")
    assert score.main(command) == 0
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")  # Streaming would look for the other ranks
    same_samples(read(tmp_path / "ranks"), read(scored / "scored"))
    assert ShardMetadata.read(tmp_path / "ranks").scored_by == ShardMetadata.read(scored / "scored").scored_by


@pytest.mark.slow
def test_a_remote_out_root_gets_the_dataset_and_another_teacher_cannot_resume_it(scored, tmp_path):
    teacher = Teacher(tiny(Qwen2Config, Qwen2ForCausalLM, 152064), label=str(scored / "teacher"), chunk_size=1024)
    remote, work = tmp_path / "remote", tmp_path / "work"
    scoring.score(str(scored / "shards"), Output(str(remote), str(work)), teacher, "cpu", 640)
    same_samples(read(remote), read(scored / "scored"))
    other = Teacher(tiny(Qwen2Config, Qwen2ForCausalLM, 152064), label="another", chunk_size=1024)
    with pytest.raises(Refused, match="scored_by differ"):
        scoring.score(str(scored / "shards"), Output(str(remote), str(tmp_path / "work2")), other, "cpu", 640)


@pytest.mark.slow
def test_kill_and_resume_gives_the_uninterrupted_scores(scored, tmp_path, capsys, monkeypatch):
    out = tmp_path / "killed"
    line = [sys.executable, "-m", "vocagno.score", "--shards", str(scored / "shards"), "--teacher",
            str(scored / "teacher"), "--dtype", "float32", "--batch-tokens", "640", "--device", "cpu",
            "--out", str(out)]
    env = {**os.environ, "WORLD_SIZE": "1", "RANK": "0"}
    process = subprocess.Popen(line, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    deadline = time.time() + 300
    while not list(out.glob("part-*/part.json")) and time.time() < deadline and process.poll() is None:
        time.sleep(0.01)
    kill_group(process.pid)
    process.wait()
    done = len(list(out.glob("part-*/part.json")))
    assert 1 <= done < PARTS, f"the kill should land mid-run ({done} of {PARTS} parts done)"
    assert not (out / "index.json").exists()
    (out / f".scratch-part-{PARTS - 1:05d}").mkdir(exist_ok=True)  # as a kill while decompressing leaves it
    (out / f".scratch-part-{PARTS - 1:05d}" / "shard.00000.mds").write_bytes(b"half a shard")
    monkeypatch.chdir(tmp_path)  # the same line again, in this process: the kill was the process
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    result = command(score.main, line[3:], capsys)
    assert result.returncode == 0, result.stderr
    assert "complete:" in result.stdout and not list(out.glob(".tmp-*")) and not list(out.glob(".scratch-*"))
    same_samples(read(out), read(scored / "scored"))


@pytest.mark.slow
def test_a_yamls_config_built_teacher_scores_what_its_training_run_would_use(tokenizers, tmp_path, capsys):
    """--config builds the teacher train.py builds for the same yaml (random weights from the yaml's seed), and a
    cached run of that yaml accepts the shards: the whole Table 3 grid of tiny runs from one scoring pass."""
    from vocagno.training.builders import build_algorithms
    from vocagno.training.config import load_config
    from vocagno.train import train

    # 20 documents: 2 batches of 8 samples a run (scoring the fixture's 100 through a 151K head took 23 s).
    assert convert_main(["--input", str(first_documents(tmp_path, 20)), "--student-tokenizer", "llama2",
                         "--teacher-tokenizer", "qwen2.5", "--seq-len", "64",
                         "--out-root", str(tmp_path / "shards")]) == 0
    overrides = ["variables.seq_len=64", f"train_loader.dataset.local={tmp_path / 'shards'}", "eval_loader=null",
                 "max_duration=2ba", "eval_interval=1", "loggers.console=null", "loggers.picture=null",
                 "callbacks=null",
                 "progress_bar=false"]
    assert score.main(["--shards", str(tmp_path / "shards"), "--config", str(REPO / "yamls" / "tiny_qwen.yaml"),
                       *overrides,
                       "--out", str(tmp_path / "scored"), "--batch-tokens", "2048", "--device", "cpu"]) == 0
    cfg = load_config(str(REPO / "yamls" / "tiny_qwen.yaml"), overrides)
    [algorithm] = build_algorithms(cfg, tokenizers["qwen2.5"])  # the teacher train.py builds for the yaml
    built = algorithm.teacher.model
    assert ShardMetadata.read(tmp_path / "scored").scored_by["fingerprint"] == weights_fingerprint(built)
    for unmapped in ("include", "exclude"):
        for aggregation in ("max", "mean", "min"):
            cell = [*overrides, f"train_loader.dataset.local={tmp_path / 'scored'}",
                    "algorithms.vocagno.teacher_losses=cached", f"algorithms.vocagno.unmapped={unmapped}",
                    f"algorithms.vocagno.aggregation={aggregation}"]
            trainer = train(load_config(str(REPO / "yamls" / "tiny_qwen.yaml"), cell))
            algorithm = next(a for a in trainer.state.algorithms if isinstance(a, VocAgnoLM))
            assert algorithm.scorer is None and algorithm.options["aggregation"] == aggregation
            assert int(trainer.state.timestamp.batch) == 2
            name = ShardMetadata.read(tmp_path / "scored").scored_by["name"]
            assert f"teacher losses: cached in the training shards, scored by {name}\n" in capsys.readouterr().out


def test_scoring_on_a_cpu_keeps_the_blocks_it_frees_for_the_next_batch(scored, tmp_path, monkeypatch):
    """vocagno.memory, as train.py on a CPU: the teacher's logits and log-softmax reused, not faulted in again."""
    monkeypatch.setattr(scoring, "keep_freed_memory", reached)
    with pytest.raises(Reached):
        score.main(["--shards", str(scored / "shards"), "--teacher", str(scored / "teacher"), "--out",
                    str(tmp_path / "scored"), "--dtype", "float32", "--device", "cpu"])
    assert not (tmp_path / "scored").exists()  # set before the first batch


@pytest.mark.slow
def test_a_compiled_teacher_cannot_resume_what_an_uncompiled_one_scored(scored, tmp_path):
    """Compiling changes the losses' last bits, as other kernels do: a pass is resumed only as it was started."""
    model = tiny(Qwen2Config, Qwen2ForCausalLM, 152064)
    out = Output(str(tmp_path / "scored"), None)
    scoring.score(str(scored / "shards"), out, Teacher(model, label="tiny", chunk_size=1024), "cpu", 640)
    compiled = Teacher(model, label="tiny", chunk_size=1024, compile_config={})
    with pytest.raises(Refused, match="compile_config"):
        scoring.score(str(scored / "shards"), out, compiled, "cpu", 640)
    assert compiled.at_initialization(0).scorer().compile_config == {}  # its control is compiled as it is


@pytest.mark.slow
def test_the_progress_bar_counts_every_batch_towards_its_total(scored, tmp_path, monkeypatch):
    """The scoring pass's bar has the shards' samples as its total and moves after each batch, not each part: a
    dataset of one large shard shows its progress as it is scored."""
    bars = []

    class Bar:
        def __init__(self, total, **options):
            self.total, self.updates, self.postfix = total, [], None
            bars.append(self)

        def update(self, rows):
            self.updates.append(rows)

        def set_postfix_str(self, text):
            self.postfix = text

        def close(self):
            pass

    monkeypatch.setattr(scoring, "tqdm", Bar)
    assert score.main(["--shards", str(scored / "shards"), "--teacher", str(scored / "teacher"), "--out",
                       str(tmp_path / "scored"), "--dtype", "float32", "--batch-tokens", "128", "--device", "cpu"]) == 0
    (bar,) = bars
    assert bar.total == sum(shard_sizes(scored / "shards")) == sum(bar.updates)
    assert len(bar.updates) > PARTS and max(bar.updates) <= 2  # rows of 64 tokens, 128 a batch
    assert bar.postfix.endswith(" teacher tok/s per device")
