"""What several test files share: a command run in this process where the process is not what a test is about
(``command``, ``ends``, ``script``), a process and its children run or killed whole where it is (``run_whole``,
``kill_when``), reading back a run's JSON lines log and comparing it with an uninterrupted run's, an S3 bucket's
keys, what the algorithm left in a Trainer's batches and losses, a stand-in that says it was reached."""

import contextlib
import gc
import json
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from composer import Callback


class Reached(Exception):
    """Raised by ``reached``: the code under test called what ``reached`` stands in for (and went no further)."""


def reached(*args, **kwargs):
    raise Reached


def own_data(yaml, data, heldout=None) -> list[str]:
    """Overrides that put a yaml's shards in ``data`` (and ``heldout``), converting its own corpora into them when
    missing: a folder named on the command line is converted into only when the command line also says from what."""
    from omegaconf import OmegaConf as om

    from vocagno.training.config import load_config

    cfg = load_config(str(yaml), [])
    overrides = [f"variables.data={data}"]
    for section, folder in (("train_loader", data), ("eval_loader", heldout)):
        corpus = om.select(cfg, f"{section}.convert_if_missing.input")
        if folder is not None and section == "eval_loader":
            overrides.append(f"variables.heldout={folder}")
        if corpus is not None and folder is not None:
            overrides.append(f"{section}.convert_if_missing.input={corpus}")
    return overrides


def read_log(path):
    """step -> metrics, the last line written for a step winning (a resumed run writes its steps again)."""
    steps = {}
    for line in open(path, encoding="utf-8"):
        row = json.loads(line)
        steps.setdefault(row.pop("step"), {}).update(row)
    return steps


def assert_same_losses(expected: dict, resumed: dict, batches: int) -> list[int]:
    """The resumed run's log trained the same ``batches`` steps as the uninterrupted one's, each to its loss (rel
    1e-6); the steps trained."""
    trained = [s for s in sorted(expected) if "loss/train/total" in expected[s]]
    assert len(trained) == batches and trained == [s for s in sorted(resumed) if "loss/train/total" in resumed[s]]
    for step in trained:
        assert resumed[step]["loss/train/total"] == pytest.approx(expected[step]["loss/train/total"], rel=1e-6), step
    return trained


def first_documents(folder, count: int):
    """A .jsonl of the first ``count`` documents of the shipped GSM8K sample (gsm8k_train_500.jsonl), in ``folder``."""
    from vocagno.core.tokenization import ASSETS

    lines = (ASSETS / "text" / "gsm8k_train_500.jsonl").read_text(encoding="utf-8").splitlines()
    path = folder / f"gsm8k_{count}.jsonl"
    path.write_text("\n".join(lines[:count]) + "\n", encoding="utf-8")
    return path


def bucket_keys(client, prefix, bucket="runs"):
    """The keys under ``prefix`` in the bucket of conftest's ``s3`` server, sorted."""
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []))


def kill_when(command, ready, settle=0.0, timeout=600, **popen):
    """Start ``command`` in a session of its own and ``kill -9`` its whole process group, as a node's death kills a
    run with its children (dataloader workers, spawned ranks, resource trackers), as soon as ``ready()`` holds
    (``settle`` seconds later), or when ``timeout`` passed or it ended by itself; nothing of it outlives this."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                               **popen)
    deadline = time.time() + timeout
    while not ready() and time.time() < deadline and process.poll() is None:
        time.sleep(0.05)
    time.sleep(settle)
    kill_group(process.pid)
    process.wait()
    assert_group_gone(process.pid)


def kill_group(group: int) -> None:
    """``kill -9`` every process of the process group ``group`` (none left: nothing to do)."""
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:  # it ended by itself, its group with it
        pass


def run_whole(command, timeout, **popen) -> subprocess.CompletedProcess:
    """``subprocess.run(command, capture_output=True, text=True, timeout=timeout)`` for a command that starts
    processes of its own (a launcher and its ranks): in a session of its own, killed whole past ``timeout`` or when
    the wait is interrupted, so that no rank outlives the test."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, **popen)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException:
        kill_group(process.pid)
        process.communicate()
        assert_group_gone(process.pid)
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def assert_group_gone(group: int, timeout: float = 30.0) -> None:
    """No process of the process group ``group`` is left (killed ones are reaped within ``timeout`` seconds)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail(f"processes of the killed process group {group} outlived it")


class Capture(Callback):
    """What the algorithm left in each batch and loss: the batch before its split, and every microbatch's loss dict."""

    def __init__(self):
        self.batches, self.losses = [], []

    def after_dataloader(self, state, logger):
        self.batches.append({k: v.clone() for k, v in state.batch.items() if isinstance(v, torch.Tensor)})

    def after_loss(self, state, logger):
        self.losses.append({k: v.detach().clone() for k, v in state.loss.items()})


def ends(main, argv) -> int:
    """``main(argv)`` ended as its command line ends it (``vocagno.entry.run``): the exit code; a refusal's one line
    ``error: ...`` on stderr."""
    from vocagno.entry import run

    try:
        run(lambda: main(argv))
    except SystemExit as exit:
        return exit.code


def private_shm_works() -> str | None:
    """Why a process can't have a /dev/shm of its own here (None: it can)."""
    try:
        result = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                                 "mount -t tmpfs -o size=64m tmpfs /dev/shm"], capture_output=True, text=True,
                                timeout=30)
    except FileNotFoundError:
        return "no unshare command"
    return None if result.returncode == 0 else result.stderr.strip().splitlines()[-1]


def with_private_shm(command: list[str]) -> list[str]:
    """``command`` in a mount namespace of its own with an empty /dev/shm (``unshare -m``, as root), as a machine of
    its own has: Streaming's shared memory there is neither taken by nor takes another job's."""
    return ["unshare", "-m", "--propagation", "private", "sh", "-c",
            'mount -t tmpfs -o size=2g tmpfs /dev/shm && exec "$@"', "sh", *command]


def command(main, argv, capsys) -> subprocess.CompletedProcess:
    """``python -m X ARGV`` in this process, where the process boundary is not what a test is about: ``main(argv)``
    ended as its command line ends it (``ends``), with what it printed (``capsys``, emptied first)."""
    capsys.readouterr()
    code = ends(main, [str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, out, err)


def script(path, argv, cwd=None) -> subprocess.CompletedProcess:
    """``python PATH ARGV`` in this process, where the process is not what a test is about (a run of ``train.py``
    whose losses, checkpoints or lines are the point): the script run as ``__main__`` as the interpreter runs it
    (``runpy``), its exit code and what it printed. ``sys.argv``, the working folder (``cwd``) and the SIGTERM and
    SIGINT handlers it set are restored after it, and what it left for the collector collected (the shared memory of
    its datasets); so is ``sys.path``, which a script may add its checkout to. An exception it does not end in is
    raised here, as a traceback would end the process."""
    # Files, not StringIO: as a process's redirected output, they have a file descriptor (Composer's progress bar asks
    # whether stderr is a terminal).
    out, err = (tempfile.TemporaryFile("w+", encoding="utf-8", errors="backslashreplace") for _ in range(2))
    argv = [str(path), *map(str, argv)]
    saved_argv, saved_path, here = sys.argv, list(sys.path), os.getcwd()
    handlers = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
    code = 0
    try:
        if cwd is not None:
            os.chdir(cwd)
        sys.argv = list(argv)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_path(str(path), run_name="__main__")
            except SystemExit as exit:
                code = exit.code
                if code is not None and not isinstance(code, int):  # sys.exit("message"): printed, exit code 1
                    print(code, file=sys.stderr)
                    code = 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        os.chdir(here)
        for number, handler in handlers.items():
            signal.signal(number, handler)
        gc.collect()
        printed = []
        for file in (out, err):
            file.seek(0)
            printed.append(file.read())
            file.close()
    return subprocess.CompletedProcess([sys.executable, *argv], code or 0, *printed)


def kept_of(folder, name: str) -> dict[int, dict[tuple, list]]:
    """batch -> sample (its first token ids) -> the positions the selection kept, gathered over every rank's sample
    log ``folder/NAME-RANK.jsonl`` (``callbacks.sample_log``)."""
    by_batch = {}
    for path in sorted(Path(folder).glob(f"{name}-*.jsonl")):
        for row in map(json.loads, path.read_text(encoding="utf-8").splitlines()):
            by_batch.setdefault(row["batch"], {}).update(zip(map(tuple, row["samples"]), row["selected"]))
    return by_batch
