"""The whole chain on an object store: moto's S3 server on this machine, through the clients a real bucket uses
(boto3 under Streaming and Composer): converting into it, scoring into it, training from shards there with
checkpoints saved there, killed and resumed, and exporting the run from there. One chain, run once (``chain``),
serves the tests: each run saving to a store starts four processes (Composer's uploaders). The runs are in this process
(``helpers.script``) but the killed one, a process of its own killed whole."""

import os
import re
import sys
from pathlib import Path

import pytest
import torch
from helpers import assert_same_losses, first_documents, kill_when, read_log, script
from helpers import bucket_keys as keys
from test_export import from_pretrained, logits, student_with
from test_untrusted import gadgets, whole_with

from vocagno.conversion.convert import main as convert_main
from vocagno import score
from vocagno.training.checkpoint import load_checkpoint
from vocagno.export import main as export_main

pytestmark = pytest.mark.slow  # converts, scores, trains, kills and resumes on an S3 server: minutes

REPO = Path(__file__).resolve().parents[2]
# Long enough for the killed run's first checkpoint to reach the store before it ends: Composer uploads from
# processes it spawns, which import Composer first; a 12-batch run once ended before its first upload (CI, quiet).
BATCHES = 24
CACHED_BATCHES = 4  # the run from the scored shards: that it trains from the store, not how far


@pytest.fixture(scope="module")
def chain(s3, tmp_path_factory):
    """Converted into the store, scored into it, then four runs of tiny.yaml from there: uninterrupted on the shards
    and, for 4 batches, on the scored shards (cached teacher losses), and one saving its checkpoints to the store every 2 batches,
    killed once its first checkpoint is there and resumed by the same command (autoresume). The folder the runs ran
    in and the store's client."""
    env, client = s3
    tmp_path = tmp_path_factory.mktemp("chain")
    with pytest.MonkeyPatch.context() as monkeypatch:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        # 160 documents (about 260 samples) in two parts: the runs take 8 a batch.
        args = ["--input", str(first_documents(tmp_path, 160)), "--student-tokenizer", "llama2", "--teacher-tokenizer",
                "mistral", "--seq-len", "128", "--docs-per-part", "80"]
        assert convert_main([*args, "--out-root", "s3://runs/chain/shards",
                             "--local-root", str(tmp_path / "work")]) == 0
        assert {"chain/shards/index.json", "chain/shards/vocagno.json"} <= set(keys(client, "chain/shards/"))
        assert score.main(["--shards", str(tmp_path / "work"), "--teacher", "tiny-math-teacher", "--dtype", "float32",
                           "--device", "cpu", "--out", "s3://runs/chain/scored",
                           "--local-root", str(tmp_path / "scoring")]) == 0
        assert "chain/scored/index.json" in keys(client, "chain/scored/")

        def command(name, data, *overrides):
            return [sys.executable, str(REPO / "train.py"), str(REPO / "yamls" / "tiny.yaml"),
                    f"train_loader.dataset.remote=s3://runs/chain/{data}",
                    f"train_loader.dataset.local={tmp_path}/{name}", "train_loader.convert_if_missing=null",
                    "eval_loader=null", "selection_report=null", "loggers.console=null", "loggers.picture=null",
                    f"max_duration={BATCHES}ba",
                    f"run_name={name}", f"loggers.jsonl.path={tmp_path}/{name}.jsonl", *overrides,
                    *(["algorithms.vocagno.teacher_losses=cached"] if data == "scored" else [])]

        run_env = {**os.environ, "PYTHONPATH": str(REPO)}
        for data, batches in (("shards", BATCHES), ("scored", CACHED_BATCHES)):
            straight = script(REPO / "train.py", command(f"straight-{data}", data, f"max_duration={batches}ba")[2:],
                              cwd=tmp_path)
            assert straight.returncode == 0, straight.stderr[-4000:]
        # The uninterrupted runs save nothing: the killed one's checkpoints are what the store must hold.
        # From tmp_path: Composer keeps a remote run's local copies in a folder named after the URI ("s3:/runs/...").
        killed = command("killed", "shards", "save_interval=2ba", "autoresume=true",
                         "save_folder=s3://runs/chain/killed")
        # Killed once its first checkpoint is in the store, whether or not the latest symlink is (autoresume's repair
        # points it to the newest complete checkpoint when it is not).
        kill_when(killed, lambda: any(k.endswith("-rank0.pt") for k in keys(client, "chain/killed/")), cwd=tmp_path,
                  env=run_env)
        first = read_log(tmp_path / "killed.jsonl")
        killed_at = max(s for s in first if "loss/train/total" in first[s])
        assert killed_at < BATCHES - 1, "the kill should land before the run ends"
        # Where Composer's own autoresume looks for a local copy of the store's latest before it downloads one (a
        # folder named after the URI), someone who can write the run's folder plants a checkpoint that runs a command.
        planted = tmp_path / "s3:" / "runs" / "chain" / "killed" / "latest-rank0.pt"
        planted.parent.mkdir(parents=True, exist_ok=True)
        whole_with(gadgets(tmp_path / "ran")["os.system"], planted)
        # Resumed from the store: a restart instead would fail to upload ep0-ba2 again (the object exists).
        resumed = script(killed[1], killed[2:], cwd=tmp_path)  # the same command, here: the kill was the process
        assert resumed.returncode == 0, resumed.stderr[-4000:]
        assert not (tmp_path / "ran").exists(), "the planted local copy was loaded"
        assert re.search(r"^resuming at batch (\d+) from s3://runs/chain/killed/ep0-ba\d+-rank0.pt$", resumed.stdout,
                         re.M), resumed.stdout
    return tmp_path, client


def test_convert_score_and_train_on_s3_and_resume_after_a_kill(chain):
    tmp_path, client = chain
    expected, got = read_log(tmp_path / "straight-shards.jsonl"), read_log(tmp_path / "killed.jsonl")
    assert_same_losses(expected, got, BATCHES)
    assert f"chain/killed/ep0-ba{BATCHES}-rank0.pt" in keys(client, "chain/killed/")
    cached = read_log(tmp_path / "straight-scored.jsonl")
    assert len([s for s in cached if "loss/train/total" in cached[s]]) == CACHED_BATCHES


def test_a_run_saved_to_s3_exports_from_there_and_resumed_from_there(chain, s3, tmp_path, monkeypatch):
    """train.py uploads its checkpoints and latest-rank0.pt.symlink as Composer does, the resumed run repoints it
    to its last checkpoint within seconds of that one's upload (Composer's saver looks every 30 s by default, and the
    run waits for it before it ends), and vocagno.export reads the run from the store by its save folder."""
    run, client = chain
    for name, value in s3[0].items():
        monkeypatch.setenv(name, value)
    last = f"chain/killed/ep0-ba{BATCHES}-rank0.pt"
    link = client.get_object(Bucket="runs", Key="chain/killed/latest-rank0.pt.symlink")
    assert link["Body"].read() == last.encode()
    lag = link["LastModified"] - client.head_object(Bucket="runs", Key=last)["LastModified"]
    assert lag.total_seconds() <= 5, lag
    # vocagno downloaded what the run resumed from into a private folder, gone with the run: nothing was fetched to
    # the folder Composer's autoresume reads first, where the planted file still stands.
    assert [p.name for p in (run / "s3:" / "runs" / "chain" / "killed").iterdir()] == ["latest-rank0.pt"]
    assert export_main(["s3://runs/chain/killed", str(tmp_path / "model")]) == 0
    card = (tmp_path / "model" / "README.md").read_text()
    assert f"{BATCHES * 8 * 128:,} student tokens, {BATCHES} batches" in card, card
    client.download_file("runs", last, str(tmp_path / "last.pt"))
    checkpoint = load_checkpoint(str(tmp_path / "last.pt"))
    assert checkpoint["state"]["timestamp"]["Timestamp"]["sample"] == BATCHES * 8
    torch.testing.assert_close(logits(from_pretrained(tmp_path / "model")),
                               logits(student_with(checkpoint["state"]["model"])))
