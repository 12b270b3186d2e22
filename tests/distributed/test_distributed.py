"""The multi-GPU code paths rehearsed on CPUs: gloo process groups of 2 and 4 ranks (``pytest -m distributed``)."""

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from helpers import ends, first_documents, kept_of, run_whole, script

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
    take at most 48), converted once for the module's runs."""
    from vocagno.conversion.convert import main as convert_main

    folder = tmp_path_factory.mktemp("shards")
    assert convert_main(["--input", str(first_documents(folder, 160)), "--student-tokenizer", "llama2",
                         "--teacher-tokenizer", "mistral", "--seq-len", "128",
                         "--out-root", str(folder / "train")]) == 0
    return folder / "train"


def run_train(tmp_path, name, *overrides, data, ranks=2):
    """``composer -n RANKS train.py yamls/tiny.yaml ...``: Composer's launcher and its ranks, processes; one rank,
    the reference the ranks are compared with, is ``python train.py ...`` in this process (``helpers.script``). Each
    rank logs its samples (their first 32 token ids) and the positions the selection kept of each to
    ``tmp_path/NAME-RANK.jsonl``."""
    command = [str(Path(sys.executable).parent / "composer"), "-n", str(ranks), str(REPO / "train.py"),
               str(REPO / "yamls" / "tiny.yaml"), f"variables.data={data}", "eval_loader=null",
               "loggers.console=null", "loggers.picture=null", "selection_report=null", f"run_name={name}",
               f"loggers.jsonl.path={tmp_path}/{name}.jsonl", "callbacks.sample_log.prefix=32",
               f"callbacks.sample_log.path={tmp_path}/{name}-{{rank}}.jsonl", *overrides]
    if ranks == 1:
        result = script(command[3], command[4:], cwd=REPO)
    else:
        result = run_whole(command, 900, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-4000:]


def seen(tmp_path, name):
    """batch -> the samples (first 32 token ids) the ranks saw, from the sample logs of every rank."""
    by_batch = {}
    for path in sorted(tmp_path.glob(f"{name}-*.jsonl")):
        for row in map(json.loads, path.read_text(encoding="utf-8").splitlines()):
            by_batch.setdefault(row["batch"], []).extend(map(tuple, row["samples"]))
    return by_batch


STEPS = 6  # the uninterrupted run's batches of 8: 48 of the 255 samples, one epoch


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted run, 2 ranks x 1 microbatch of 4, 6 batches, saving every 2 to ``ckpt``. Its shards are
    its own: tiny.yaml's convert_if_missing on the 160 documents (the node's first rank converts, the other waits).
    Its folder."""
    folder = tmp_path_factory.mktemp("straight")
    run_train(folder, "straight", f"max_duration={STEPS}ba", "device_train_microbatch_size=4", "save_interval=2ba",
              "autoresume=true", f"save_folder={folder}/ckpt",
              f"train_loader.convert_if_missing.input={first_documents(folder, 160)}", data=folder / "shards")
    return folder


@pytest.fixture(scope="module")
def one(shards, tmp_path_factory):
    """The global batch of 8 as 1 rank x 1 microbatch of 8, 2 batches, in this process: the selections' reference."""
    folder = tmp_path_factory.mktemp("one")
    run_train(folder, "one", "max_duration=2ba", "device_train_microbatch_size=8", data=shards, ranks=1)
    return kept_of(folder, "one")


@pytest.fixture(scope="module")
def elastic(shards, tmp_path_factory):
    """One save folder resumed on another world size twice (autoresume; num_canonical_nodes fixed, as Streaming
    asks): 2 batches on 4 ranks x 2 microbatches of 1, then to batch 4 on 1 rank x 4 microbatches of 2 (in this
    process), then to batch 6 on 2 ranks x 2 of 2: fewer ranks, then more. Its folder; the sample logs ``first``,
    ``second``, ``third``."""
    folder = tmp_path_factory.mktemp("elastic")
    common = ["save_interval=2ba", "autoresume=true", f"save_folder={folder}/ckpt"]
    for name, ranks, microbatch, batches in (("first", 4, 1, 2), ("second", 1, 2, 4), ("third", 2, 2, STEPS)):
        run_train(folder, name, *common, "run_name=elastic", f"max_duration={batches}ba",
                  f"device_train_microbatch_size={microbatch}", data=shards, ranks=ranks)
    return folder


@pytest.mark.slow
def test_two_processes_train_on_different_samples(straight):
    ranks = []
    for rank in (0, 1):
        rows = [json.loads(line) for line in (straight / f"straight-{rank}.jsonl").read_text(encoding="utf-8").splitlines()]
        assert [r["batch"] for r in rows] == list(range(STEPS))
        ranks.append({tuple(sample) for r in rows for sample in r["samples"]})
        assert len(ranks[-1]) == STEPS * 4  # 8 per global batch, 4 per rank
    assert not ranks[0] & ranks[1]


@pytest.mark.slow
def test_the_batch_scope_selects_the_same_tokens_on_one_rank_two_and_four_of_two_microbatches(one, straight,
                                                                                               elastic):
    """The global batch of 8 as 1 microbatch of 8 on one rank, as 4 samples on each of two ranks, or as 4 ranks x 2
    microbatches of 1: one top-k over the whole batch either way (cached losses: test_multinode)."""
    two, four = kept_of(straight, "straight"), kept_of(elastic, "first")
    assert sorted(one) == sorted(four) == [0, 1] and all(len(one[b]) == 8 for b in one)
    assert one == {b: two[b] for b in (0, 1)} == four
    kept = [len(positions) for positions in one[0].values()]
    assert len(set(kept)) > 1  # one top-k over the batch, not 40% of each sequence


@pytest.mark.slow
def test_a_run_checkpointed_on_some_ranks_resumes_on_others_without_seeing_a_sample_twice(shards, straight, elastic):
    """4 ranks -> 1 -> 2: the batches after each checkpoint are those the uninterrupted run took, no sample seen twice
    or skipped within the epoch; the shards convert_if_missing made on 2 ranks are the ones converted here."""
    made, expected = (ShardMetadata.read(folder).totals for folder in (straight / "shards", shards))
    assert (made["documents read"], made["samples"]) == (expected["documents read"], expected["samples"]) == (160, 255)
    reference = seen(straight, "straight")
    runs = [seen(elastic, name) for name in ("first", "second", "third")]
    assert [sorted(run) for run in runs] == [[0, 1], [2, 3], [4, 5]] and sorted(reference) == list(range(STEPS))
    resumed = {batch: samples for run in runs for batch, samples in run.items()}
    for batch in range(STEPS):
        assert sorted(resumed[batch]) == sorted(reference[batch]), batch
    everything = [sample for batch in range(STEPS) for sample in resumed[batch]]
    assert len(everything) == len(set(everything)) == 8 * STEPS


@pytest.mark.slow
def test_a_run_resumed_on_a_world_size_its_batch_cant_be_split_over_is_refused(straight):
    """The uninterrupted run's save folder (2 ranks) resumed on 3: 8 samples a batch don't divide into 3 ranks'
    batches; the run stops before loading anything, naming the numbers, and the checkpoint stays as it was."""
    before = sorted(p.name for p in (straight / "ckpt").iterdir())
    command = [str(Path(sys.executable).parent / "composer"), "-n", "3", str(REPO / "train.py"),
               str(REPO / "yamls" / "tiny.yaml"), f"variables.data={straight / 'shards'}", "eval_loader=null",
               "selection_report=null", f"max_duration={STEPS + 2}ba", "save_interval=2ba", "autoresume=true",
               f"save_folder={straight}/ckpt", "run_name=straight"]
    result = run_whole(command, 900, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode != 0
    assert "global_train_batch_size 8 is not divisible by 3 ranks" in result.stderr + result.stdout
    assert sorted(p.name for p in (straight / "ckpt").iterdir()) == before


@pytest.mark.slow
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
