"""A run over several nodes, rehearsed on one machine: each "node" is ``python -m vocagno.launch`` (the command
``scripts/slurm_train.sh`` runs on every node) in its own mount namespace with a private ``/dev/shm`` (``unshare -m``
and a tmpfs: with one ``/dev/shm``, the node leaders' Streaming cleanups collide), its own Streaming ``local`` cache,
the shards as ``remote``, the save folder shared, gloo over 127.0.0.1.

2 nodes x 2 ranks train what one process trains (the same batches, kept fractions and losses): with the teacher
sharded over them by FSDP what it trains with the teacher replicated, and from cached losses what it trains from them;
a node killed with ``kill -9`` after the first checkpoint resumes with autoresume on 2 x 2, or on 1 x 2 (a node lost
for good), to the batches and losses of the uninterrupted run (``num_canonical_nodes: 1``, fixed in tiny.yaml, is what
keeps the sample order when the nodes change); the scoring pass and the selection report on 2 x 2 write the
one-process result, their shared files once.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    assert_group_gone,
    ends,
    first_documents,
    kept_of,
    private_shm_works,
    read_log,
    script,
    with_private_shm,
)

from vocagno.launch import TRAIN_SCRIPT, node_command

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # every test here: minutes of several processes

REPO = Path(__file__).resolve().parents[2]
TEXT = REPO / "vocagno" / "assets" / "text"
TRAIN = ["eval_loader=null", "loggers.console=null", "loggers.picture=null", "selection_report=null",
         "progress_bar=false", "device_train_microbatch_size=2", "callbacks.sample_log.prefix=32"]
STEPS = 6


@pytest.fixture(scope="module", autouse=True)
def _mount_namespaces():
    why = private_shm_works()
    if why:
        pytest.skip(f"multi-node rehearsal needs a mount namespace per node (unshare -m, as root): {why}; run "
                    "pytest tests/distributed/test_multinode.py as root (docs/many-nodes.md)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nodes:
    """The node launchers of one job, each a process in a session of its own (its process group: what a node's death
    kills, the launcher with its ranks) and in a mount namespace of its own with its own /dev/shm, as a machine of its
    own has (``helpers.with_private_shm``)."""

    def __init__(self, job, job_args, *, nodes, nproc, where: Path, shards=None):
        self.where = where
        (where / "logs").mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.processes = []
        for node in range(nodes):
            command = node_command(job, job_args, nodes=nodes, node_rank=node, nproc=nproc, master_addr="127.0.0.1",
                                   master_port=port, cache=str(where / f"node{node}-cache"), shards=shards,
                                   logs=str(where / "logs"))
            with open(where / f"node{node}.out", "ab") as out:
                self.processes.append(subprocess.Popen(
                    with_private_shm(command), cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                    env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True))

    def wait(self, timeout=900):
        try:
            codes = [process.wait(timeout) for process in self.processes]
        except BaseException:  # a hung rendezvous or collective: the nodes go with the test
            self.end(grace=0)
            raise
        assert codes == [0] * len(codes), f"exit codes {codes}:\n{self.output()[-4000:]}"
        self.assert_gone()
        return self

    def kill(self, node):
        os.killpg(self.processes[node].pid, signal.SIGKILL)
        self.processes[node].wait()

    def end(self, grace=60):
        """The other nodes' ranks fail at their next collective with the dead node; what is left is killed (a
        scheduler ends the job), and nothing of any node outlives it."""
        deadline = time.time() + grace
        for process in self.processes:
            while process.poll() is None and time.time() < deadline:
                time.sleep(0.2)
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.assert_gone()

    def assert_gone(self):
        for process in self.processes:
            assert_group_gone(process.pid)

    def output(self) -> str:
        files = sorted(self.where.glob("node*.out")) + sorted((self.where / "logs").glob("*"))
        return "".join(path.read_text(errors="replace") for path in files if path.is_file())


def seen(folder: Path, name: str) -> dict[int, list[tuple]]:
    """batch -> the samples (first 32 token ids) every rank saw."""
    by_batch = {}
    for path in sorted(folder.glob(f"{name}-*.jsonl")):
        for row in map(json.loads, path.read_text(encoding="utf-8").splitlines()):
            by_batch.setdefault(row["batch"], []).extend(map(tuple, row["samples"]))
    return {batch: sorted(samples) for batch, samples in by_batch.items()}


def train(tmp: Path, log: str, *overrides, nodes: int, nproc: int, shards: Path, save: Path | None = None):
    """tiny.yaml on ``nodes`` x ``nproc`` ranks, saving every 2 batches to ``save`` (default: a folder of its own);
    its losses in ``tmp/LOG.jsonl``, its samples in ``tmp/LOG-RANK.jsonl``."""
    return Nodes("train", job(tmp, log, *overrides, save=save), nodes=nodes, nproc=nproc, where=tmp / log,
                 shards=str(shards))


def job(tmp: Path, log: str, *overrides, save: Path | None = None) -> list[str]:
    return [str(REPO / "yamls" / "tiny.yaml"), *TRAIN, "run_name=multinode", f"max_duration={STEPS}ba",
            f"loggers.jsonl.path={tmp}/{log}.jsonl", f"callbacks.sample_log.path={tmp}/{log}-{{rank}}.jsonl",
            f"save_folder={save or tmp / f'{log}-save'}", "save_interval=2ba", *overrides]


def train_here(tmp: Path, log: str, *overrides, shards: Path) -> None:
    """What ``train`` runs on 1 node x 1 rank, in this process (``helpers.script``): the node's command, less
    Composer's launcher, as one process runs it."""
    command = node_command("train", job(tmp, log, *overrides), nodes=1, node_rank=0, nproc=1, master_addr="127.0.0.1",
                           cache=str(tmp / log / "node0-cache"), shards=str(shards))
    at = command.index(str(TRAIN_SCRIPT))
    result = script(command[at], command[at + 1:], cwd=REPO)
    assert result.returncode == 0, result.stderr[-4000:]


def assert_trains_like(reference: dict, run: dict, steps, rel=1e-5):
    for step in steps:
        for key in ("loss/train/total", "loss/train/kept_fraction", "loss/train/teacher_loss", "loss/train/score"):
            assert run[step][key] == pytest.approx(reference[step][key], rel=rel), (step, key)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The shared file system: tiny.yaml's training shards (its convert_if_missing), converted once, and the
    uninterrupted reference run, in this process (its batch of 8 in 4 microbatches: the batch scope's one top-k, as
    over the 4 ranks of the runs it is compared with)."""
    from vocagno.conversion.convert import main as convert_main

    root = tmp_path_factory.mktemp("shared")
    assert convert_main(["--input", str(TEXT / "gsm8k_train_500.jsonl"), "--student-tokenizer", "llama2",
                         "--teacher-tokenizer", "mistral", "--seq-len", "128",
                         "--out-root", str(root / "shards")]) == 0
    train_here(root, "one-process", shards=root / "shards")
    return root


def test_two_nodes_of_two_ranks_train_what_one_process_trains_and_resume_after_a_node_dies(shared, tmp_path):
    reference, reference_seen = read_log(shared / "one-process.jsonl"), seen(shared, "one-process")
    trained = [step for step in sorted(reference) if "loss/train/total" in reference[step]]
    assert len(trained) == STEPS and sorted(reference_seen) == list(range(STEPS))
    everything = [sample for batch in range(STEPS) for sample in reference_seen[batch]]
    assert len(everything) == len(set(everything)) == 8 * STEPS  # one epoch: no sample twice

    save = tmp_path / "save"  # shared by the nodes
    sharded = "teacher.placement=fsdp"  # the teacher sharded with PyTorch FSDP over the 4 ranks of the 2 nodes
    run = train(tmp_path, "killed", sharded, nodes=2, nproc=2, shards=shared / "shards", save=save)
    deadline = time.time() + 600
    while not (save / "latest-rank0.pt").exists() and time.time() < deadline and run.processes[1].poll() is None:
        time.sleep(0.05)
    run.kill(1)  # node 1 dies: its launcher and ranks, kill -9
    run.end()
    saved = sorted(int(p.name.split("-ba")[1].split("-")[0]) for p in save.glob("ep0-ba*-rank0.pt"))
    assert saved and saved[-1] < STEPS, saved  # killed before the end
    killed, killed_seen = read_log(tmp_path / "killed.jsonl"), seen(tmp_path, "killed")
    assert_trains_like(reference, killed, [s for s in trained if "loss/train/total" in killed.get(s, {})])
    assert all(killed_seen[b] == reference_seen[b] for b in killed_seen)
    lost_node = shutil.copytree(save, tmp_path / "save-lost-node", symlinks=True)
    # The teacher is in neither the checkpoint nor the optimizer: both hold the student's parameters alone.
    from vocagno.training.checkpoint import load_checkpoint

    state = load_checkpoint(str(save / f"ep0-ba{saved[0]}-rank0.pt"))["state"]
    student_tensors = set(state["model"])
    assert student_tensors and all(k.startswith("model.model.") or k == "model.lm_head.weight" for k in student_tensors)
    optimizer = next(iter(state["optimizers"].values()))
    assert set(optimizer["state"]) == student_tensors - {"model.lm_head.weight"}  # tied to the embedding

    # Restarted with the same line on both nodes; and, from the same checkpoint, on one node (the other lost).
    for log, nodes, folder in (("resumed", 2, save), ("lost-node", 1, lost_node)):
        train(tmp_path, log, sharded, nodes=nodes, nproc=2, shards=shared / "shards", save=folder).wait()
        resumed, resumed_seen = read_log(tmp_path / f"{log}.jsonl"), seen(tmp_path, log)
        steps = [s for s in trained if "loss/train/total" in resumed.get(s, {})]
        assert steps == trained[saved[-1]:], (log, steps)  # from the last checkpoint to the end
        assert_trains_like(reference, resumed, steps)
        # The batches after the checkpoint are the uninterrupted run's: none seen twice, none skipped.
        assert sorted(resumed_seen) == list(range(saved[-1], STEPS)), log
        assert all(resumed_seen[b] == reference_seen[b] for b in resumed_seen), log
    assert sorted(p.name for p in save.iterdir() if p.name.startswith("latest")) == ["latest-rank0.pt"]


def test_the_scoring_pass_and_cached_losses_on_two_nodes_give_what_one_process_gives(tmp_path):
    # The scoring pass on 2 nodes x 2 ranks writes what one process writes; the last rank to finish publishes once.
    # Its shards: 120 documents in 4 parts, a part for each rank to score.
    from vocagno.conversion.convert import main as convert_main
    from vocagno.teacher.scoring import read_shard

    assert convert_main(["--input", str(first_documents(tmp_path, 120)), "--student-tokenizer", "llama2",
                         "--teacher-tokenizer", "mistral", "--seq-len", "128", "--docs-per-part", "30",
                         "--out-root", str(tmp_path / "shards")]) == 0
    arguments = ["--shards", str(tmp_path / "shards"), "--config", str(REPO / "yamls" / "tiny.yaml"), "--device", "cpu"]
    scored = Nodes("score", [*arguments, "--out", str(tmp_path / "scored")], nodes=2, nproc=2,
                   where=tmp_path / "score").wait()
    assert scored.output().count("complete:") == 1
    scored_by_rank = {int(rank): int(samples) for rank, samples in
                      re.findall(r"rank (\d) of 4: (\d+) samples scored", scored.output())}
    assert sorted(scored_by_rank) == [0, 1, 2, 3] and all(scored_by_rank.values()), scored_by_rank
    from vocagno import score

    assert ends(score.main, [*arguments, "--out", str(tmp_path / "one")]) == 0  # one process: this one

    def samples(folder):
        index = json.loads((folder / "index.json").read_text())
        return [s for info in index["shards"] for s in read_shard(folder, info)]

    for a, b in zip(samples(tmp_path / "one"), samples(tmp_path / "scored"), strict=True):
        assert a["text"] == b["text"] and np.array_equal(a["teacher_loss"], b["teacher_loss"], equal_nan=True)

    # Cached losses are stored in float16: a run from them is compared with one from them on one node, in one process
    # (its batch of 8 in 4 microbatches: the batch scope's one top-k, as the four ranks here).
    cached = ["algorithms.vocagno.teacher_losses=cached", "max_duration=2ba"]
    train_here(tmp_path, "cached1x1", *cached, shards=tmp_path / "scored")
    train(tmp_path, "cached2x2", *cached, nodes=2, nproc=2, shards=tmp_path / "scored").wait()
    one_process = read_log(tmp_path / "cached1x1.jsonl")
    steps = [step for step in sorted(one_process) if "loss/train/total" in one_process[step]]
    assert len(steps) == 2
    assert_trains_like(one_process, read_log(tmp_path / "cached2x2.jsonl"), steps)
    assert seen(tmp_path, "cached2x2") == seen(tmp_path, "cached1x1")
    assert kept_of(tmp_path, "cached2x2") == kept_of(tmp_path, "cached1x1")  # the batch scope's one top-k, token for token


def test_the_selection_report_on_two_nodes_is_the_one_process_report_written_once(shared, tmp_path):
    arguments = ["--shards", str(shared / "shards"), "--teacher", "tiny-math-teacher", "--dtype", "float32",
                 "--teacher-tokenizer", "mistral", "--samples", "8", "--device", "cpu"]
    report = Nodes("selection", [*arguments, "--work", str(tmp_path / "work"), "--json",
                                 str(tmp_path / "two.json")], nodes=2, nproc=2, where=tmp_path / "selection").wait()
    assert report.output().count(f"wrote {tmp_path / 'two.json'}") == 1
    from vocagno import selection

    assert ends(selection.main, [*arguments, "--json", str(tmp_path / "one.json")]) == 0  # one process: this one
    two, one = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("two", "one"))
    two.pop("seconds", None), one.pop("seconds", None)
    _close(two, one)


def _close(a, b, path=""):
    """Nested JSON equal, floats within rel 1e-6."""
    assert type(a) is type(b) or {type(a), type(b)} <= {int, float}, path
    if isinstance(a, dict):
        assert sorted(a) == sorted(b), path
        return all(_close(a[k], b[k], f"{path}.{k}") for k in a)
    if isinstance(a, list):
        assert len(a) == len(b), path
        return all(_close(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b)))
    if isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-6), path
        return True
    assert a == b, path
    return True
