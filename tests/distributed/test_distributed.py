"""The multi-GPU code paths rehearsed on CPUs: gloo process groups of 2 and 4 ranks (``pytest -m distributed``)."""

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from helpers import ends, first_documents, run_whole, script

from vocagno.data.shards import ShardMetadata

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.distributed

TEACHERS = {  # tiny random-init teachers of two families, as a yaml's teacher.config builds them
    "qwen2": {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
              "tie_word_embeddings": False},
    "llama": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
              "tie_word_embeddings": False},
}


def _shard_and_score(rank: int, world: int, family: str, folder: str) -> None:
    """One rank: the whole teacher's token losses and the FSDP-sharded teacher's, on the same batch; what this rank
    holds of the sharded teacher's parameters."""
    import torch.distributed as dist
    from omegaconf import OmegaConf as om
    from torch.distributed.fsdp import FullyShardedDataParallel

    from vocagno.teacher.config import build_causal_lm
    from vocagno.teacher.model import TeacherScorer, shard_teacher

    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world)
    try:
        teacher = build_causal_lm(om.create({"config": TEACHERS[family]}), 1000, seed=5)
        whole = TeacherScorer(teacher)
        ids = torch.randint(0, 1000, (3, 40), generator=torch.Generator().manual_seed(9))
        mask = torch.ones_like(ids)
        mask[2, 30:] = 0  # a padded row
        expected = whole(ids, mask)
        total = sum(p.numel() for p in teacher.parameters())
        sharded = shard_teacher(TeacherScorer(build_causal_lm(om.create({"config": TEACHERS[family]}), 1000, seed=5)))
        got = sharded(ids, mask)
        # Between forwards each FSDP unit holds only this rank's piece of its flat parameter.
        held = sum(unit._handle.flat_param.numel() for unit in FullyShardedDataParallel.fsdp_modules(sharded)
                   if unit._handle is not None)
        torch.save({"expected": expected, "got": got, "total": total, "held": held}, f"{folder}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("family", sorted(TEACHERS))
def test_a_teacher_sharded_over_cpu_ranks_scores_as_the_whole_one_and_each_rank_holds_a_share(tmp_path, family, world):
    # forkserver: not forks of this process, whose threads' locks a fork would inherit
    torch.multiprocessing.start_processes(_shard_and_score, args=(world, family, str(tmp_path)), nprocs=world,
                                          join=True, start_method="forkserver")
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    for result in results:
        assert torch.allclose(result["got"], result["expected"], atol=1e-5, equal_nan=True)
        assert torch.isnan(result["got"][2, 30:]).all() and torch.isfinite(result["got"][:, 1:30]).all()
    held = [r["held"] for r in results]
    total = results[0]["total"]
    # FULL_SHARD: the ranks' shards are the parameters, each about 1/W of them (FSDP pads each unit to W pieces).
    assert total <= sum(held) <= total + world * 16 * 7, (held, total)
    assert max(held) <= total / world + 16 * 7, (held, total)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Shards as tiny.yaml's convert_if_missing makes them, of its first 160 documents (255 samples: the runs here
    take at most 32), converted once for the module's runs."""
    from vocagno.conversion.convert import main as convert_main

    folder = tmp_path_factory.mktemp("shards")
    assert convert_main(["--input", str(first_documents(folder, 160)), "--student-tokenizer", "llama2",
                         "--teacher-tokenizer", "mistral", "--seq-len", "128",
                         "--out-root", str(folder / "train")]) == 0
    return folder / "train"


def run_train(tmp_path, name, *overrides, data, ranks=2):
    """``composer -n RANKS train.py yamls/tiny.yaml ...``: Composer's launcher and its ranks, processes; one rank,
    the reference the ranks are compared with, is ``python train.py ...`` in this process (``helpers.script``)."""
    command = [str(Path(sys.executable).parent / "composer"), "-n", str(ranks), str(REPO / "train.py"),
               str(REPO / "yamls" / "tiny.yaml"), f"variables.data={data}", "eval_loader=null",
               "loggers.console=null", "loggers.picture=null", "selection_report=null", "max_duration=3ba",
               f"run_name={name}",
               f"loggers.jsonl.path={tmp_path}/{name}.jsonl", *overrides]
    if ranks == 1:
        result = script(command[3], command[4:], cwd=REPO)
    else:
        result = run_whole(command, 900, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-4000:]
    steps = {}
    for line in open(tmp_path / f"{name}.jsonl", encoding="utf-8"):
        row = json.loads(line)
        steps.setdefault(row.pop("step"), {}).update(row)
    return steps


def test_a_run_with_its_teacher_sharded_over_two_cpu_ranks_trains_as_with_it_replicated(shards, tmp_path):
    """composer -n 2 train.py yamls/tiny.yaml teacher.placement=fsdp: the shipped teacher sharded with PyTorch FSDP
    over two gloo ranks gives the losses and the selection of the teacher replicated on each."""
    replicated = run_train(tmp_path, "replicated", "teacher.placement=replicate", data=shards)
    sharded = run_train(tmp_path, "sharded", "teacher.placement=fsdp", f"save_folder={tmp_path}/ckpt",
                        "save_interval=3ba", data=shards)
    keys = ("loss/train/total", "loss/train/teacher_loss", "loss/train/kept_fraction", "loss/train/score")
    trained = [step for step in sorted(replicated) if "loss/train/total" in replicated[step]]
    assert trained == [step for step in sorted(sharded) if "loss/train/total" in sharded[step]] and len(trained) == 3
    for step in trained:
        for key in keys:
            assert sharded[step][key] == pytest.approx(replicated[step][key], rel=1e-5), (step, key)
    # The teacher is in neither the checkpoint nor the optimizer: both hold the student's parameters alone.
    from vocagno.training.checkpoint import load_checkpoint

    state = load_checkpoint(str(tmp_path / "ckpt" / "ep0-ba3-rank0.pt"))["state"]
    student_tensors = set(state["model"])
    assert student_tensors and all(k.startswith("model.model.") or k == "model.lm_head.weight" for k in student_tensors)
    optimizer = next(iter(state["optimizers"].values()))
    assert set(optimizer["state"]) == student_tensors - {"model.lm_head.weight"}  # tied to the embedding


def selections(tmp_path, name, *overrides, ranks, microbatch, data):
    """Sample (its first 32 token ids) -> the positions the batch scope kept, per batch, gathered over the ranks."""
    run_logging_samples(tmp_path, name, *overrides, ranks=ranks, microbatch=microbatch, data=data)
    return kept_of(tmp_path, name)


def run_logging_samples(tmp_path, name, *overrides, ranks, microbatch, data):
    """2 batches of 8 on ``ranks`` ranks of ``microbatch`` samples each, each rank logging its samples (the first 32
    token ids) and the positions the selection kept of each to ``tmp_path/NAME-RANK.jsonl``."""
    log = f"callbacks.sample_log.path={tmp_path}/{name}-{{rank}}.jsonl"
    run_train(tmp_path, name, "max_duration=2ba", "callbacks.sample_log.prefix=32",
              f"device_train_microbatch_size={microbatch}", log, *overrides, ranks=ranks, data=data)


def kept_of(tmp_path, name):
    """Sample -> the positions kept, per batch, gathered over the ranks of run ``name``."""
    by_batch = {}
    for path in sorted(tmp_path.glob(f"{name}-*.jsonl")):
        for row in map(json.loads, open(path, encoding="utf-8")):
            by_batch.setdefault(row["batch"], {}).update(zip(map(tuple, row["samples"]), row["selected"]))
    return by_batch


@pytest.fixture(scope="module")
def split_runs(shards, tmp_path_factory):
    """The global batch of 8 as 1 rank x 1 microbatch of 8 ("one") and as 2 ranks x 1 microbatch of 4 ("two"), 2
    batches each, their sample logs in the folder returned."""
    folder = tmp_path_factory.mktemp("split")
    run_logging_samples(folder, "one", ranks=1, microbatch=8, data=shards)
    run_logging_samples(folder, "two", ranks=2, microbatch=4, data=shards)
    return folder


def test_two_processes_train_on_different_samples(split_runs):
    ranks = []
    for rank in (0, 1):
        rows = [json.loads(line) for line in open(split_runs / f"two-{rank}.jsonl", encoding="utf-8")]
        assert [r["batch"] for r in rows] == [0, 1]
        ranks.append({tuple(sample) for r in rows for sample in r["samples"]})
        assert len(ranks[-1]) == 2 * 4  # 8 per global batch, 4 per rank
    assert not ranks[0] & ranks[1]


def test_batch_scope_selects_the_same_tokens_on_one_rank_and_on_two(split_runs):
    """The global batch of 8 as 1 microbatch of 8 on one rank, or as 4 samples on each of two ranks."""
    one, two = kept_of(split_runs, "one"), kept_of(split_runs, "two")
    assert sorted(one) == sorted(two) == [0, 1] and all(len(one[b]) == 8 for b in one)
    assert one == two
    kept = [len(positions) for positions in one[0].values()]
    assert len(set(kept)) > 1  # one top-k over the batch, not 40% of each sequence


def test_the_batch_scope_keeps_the_same_tokens_on_four_ranks_of_two_microbatches_as_on_one_rank(shards, split_runs,
                                                                                               tmp_path):
    """The global batch of 8 as 1 rank x 1 microbatch of 8, or 4 ranks x 2 microbatches of 1: one top-k over the
    whole batch either way, with the teacher online and from cached losses (shards scored by vocagno.score)."""
    from vocagno import score

    one = kept_of(split_runs, "one")
    four = selections(tmp_path, "four", ranks=4, microbatch=1, data=shards)
    assert sorted(one) == [0, 1] and all(len(one[b]) == 8 for b in one) and one == four
    assert score.main(["--shards", str(shards), "--config", str(REPO / "yamls" / "tiny.yaml"),
                       "--out", str(tmp_path / "scored"), "--device", "cpu"]) == 0
    cached = ["algorithms.vocagno.teacher_losses=cached"]
    one_cached = selections(tmp_path, "one-cached", *cached, ranks=1, microbatch=8, data=tmp_path / "scored")
    four_cached = selections(tmp_path, "four-cached", *cached, ranks=4, microbatch=1, data=tmp_path / "scored")
    assert one_cached == four_cached and sorted(one_cached) == [0, 1]


def test_the_scoring_pass_under_torchrun_on_two_cpu_processes_writes_the_one_process_result(tmp_path):
    """torchrun --nproc-per-node 2 -m vocagno.score: each process scores its shards, the last one publishes; the
    dataset equals one process's, sample for sample."""
    import numpy as np

    from vocagno import score
    from vocagno.conversion.convert import main as convert_main
    from vocagno.teacher.scoring import read_shard

    assert convert_main(["--input", str(REPO / "vocagno" / "assets" / "text" / "gsm8k_heldout_100.jsonl"),
                         "--student-tokenizer", "llama2", "--teacher-tokenizer", "mistral", "--seq-len", "128",
                         "--docs-per-part", "40", "--out-root", str(tmp_path / "shards")]) == 0
    arguments = ["-m", "vocagno.score", "--shards", str(tmp_path / "shards"), "--teacher", "tiny-math-teacher",
                 "--dtype", "float32", "--device", "cpu"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    torchrun = [str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", "2"]
    assert ends(score.main, [*arguments[2:], "--out", str(tmp_path / "one")]) == 0  # one process: this one
    result = run_whole([*torchrun, *arguments, "--out", str(tmp_path / "two")], 600, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 0 of 2" in result.stdout and "rank 1 of 2" in result.stdout

    def samples(folder):
        index = json.loads((folder / "index.json").read_text())
        return [s for info in index["shards"] for s in read_shard(folder, info)]

    one, two = samples(tmp_path / "one"), samples(tmp_path / "two")
    assert len(json.loads((tmp_path / "shards" / "index.json").read_text())["shards"]) == 3 and len(one) == len(two)
    for a, b in zip(one, two):
        assert a["text"] == b["text"] and np.array_equal(a["teacher_loss"], b["teacher_loss"], equal_nan=True)


def seen(tmp_path, name):
    """batch -> the samples (first 32 token ids) the ranks saw, from the sample logs of every rank."""
    by_batch = {}
    for path in sorted(tmp_path.glob(f"{name}-*.jsonl")):
        for row in map(json.loads, open(path, encoding="utf-8")):
            by_batch.setdefault(row["batch"], []).extend(map(tuple, row["samples"]))
    return by_batch


@pytest.fixture(scope="module")
def straight(shards, tmp_path_factory):
    """The batches an uninterrupted run of 4 batches on 2 ranks takes."""
    folder = tmp_path_factory.mktemp("straight")
    run_train(folder, "straight", "callbacks.sample_log.prefix=32", "max_duration=4ba",
              f"callbacks.sample_log.path={folder}/straight-{{rank}}.jsonl", data=shards, ranks=2)
    return seen(folder, "straight")


@pytest.mark.parametrize("before, after", [(4, 2), (2, 4)])
def test_a_run_checkpointed_on_some_ranks_resumes_on_others_without_seeing_a_sample_twice(shards, straight, tmp_path,
                                                                                           before, after):
    """autoresume on another world size (num_canonical_nodes fixed, as Streaming asks): the batches after the
    checkpoint are those an uninterrupted run would take, no sample seen twice or skipped within the epoch."""
    common = ["callbacks.sample_log.prefix=32", "save_interval=2ba", "autoresume=true", "device_train_microbatch_size=2",
              f"save_folder={tmp_path}/ckpt", "run_name=elastic"]
    run_train(tmp_path, "elastic", *common, "max_duration=2ba",
              f"callbacks.sample_log.path={tmp_path}/first-{{rank}}.jsonl", data=shards, ranks=before)
    run_train(tmp_path, "elastic", *common, "max_duration=4ba",
              f"callbacks.sample_log.path={tmp_path}/resumed-{{rank}}.jsonl", data=shards, ranks=after)
    first, resumed = seen(tmp_path, "first"), seen(tmp_path, "resumed")
    assert sorted(first) == [0, 1] and sorted(resumed) == [2, 3] and sorted(straight) == [0, 1, 2, 3]
    for batch in range(4):
        assert sorted((first | resumed)[batch]) == sorted(straight[batch]), batch
    everything = [sample for batch in range(4) for sample in (first | resumed)[batch]]
    assert len(everything) == len(set(everything)) == 32


def test_a_run_resumed_on_a_world_size_its_batch_cant_be_split_over_is_refused(shards, tmp_path):
    """A save folder of 2 ranks resumed on 3: 8 samples a batch don't divide into 3 ranks' batches; the run stops
    before loading anything, naming the numbers, and the checkpoint stays as it was. The first run converts its
    shards itself (convert_if_missing: the node's first rank converts, the other waits)."""
    common = ["save_interval=2ba", "autoresume=true", f"save_folder={tmp_path}/ckpt", "run_name=odd"]
    run_train(tmp_path, "odd", *common, "max_duration=2ba",
              f"train_loader.convert_if_missing.input={shards.parent / 'gsm8k_160.jsonl'}",
              data=tmp_path / "shards", ranks=2)
    made, expected = (ShardMetadata.read(folder).totals for folder in (tmp_path / "shards", shards))
    assert (made["documents read"], made["samples"]) == (expected["documents read"], expected["samples"]) == (160, 255)
    before = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    command = [str(Path(sys.executable).parent / "composer"), "-n", "3", str(REPO / "train.py"),
               str(REPO / "yamls" / "tiny.yaml"), f"variables.data={tmp_path / 'shards'}", "eval_loader=null",
               "selection_report=null", "max_duration=4ba", *common]
    result = run_whole(command, 900, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode != 0
    assert "global_train_batch_size 8 is not divisible by 3 ranks" in result.stderr + result.stdout
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == before
