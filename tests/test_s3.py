"""The whole chain on an object store: moto's S3 server on this machine, through the clients a real bucket uses
(boto3 under Streaming and Composer): converting into it, scoring into it, training from shards there with
checkpoints saved there, killed and resumed."""

import os
import sys
from pathlib import Path

import forked
from helpers import assert_same_losses, first_documents, kill_when, read_log
from helpers import bucket_keys as keys

from conversion import convert_dataset
from vocagno import score

REPO = Path(__file__).resolve().parent.parent
# Long enough for the killed run's first checkpoint to reach the store before it ends: Composer uploads from
# processes it spawns, which import Composer first; a 12-batch run once ended before its first upload (CI, quiet).
BATCHES = 24


def test_convert_score_and_train_on_s3_and_resume_after_a_kill(s3, tmp_path, monkeypatch):
    env, client = s3
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # 160 documents (about 260 samples) in two parts: the runs take 8 a batch.
    args = ["--input", str(first_documents(tmp_path, 160)), "--student-tokenizer", "llama2", "--teacher-tokenizer",
            "mistral", "--seq-len", "128", "--docs-per-part", "80"]
    assert convert_dataset.main([*args, "--out-root", "s3://runs/chain/shards",
                                 "--local-root", str(tmp_path / "work")]) == 0
    assert {"chain/shards/index.json", "chain/shards/vocagno.json"} <= set(keys(client, "chain/shards/"))
    assert score.main(["--shards", str(tmp_path / "work"), "--teacher", "tiny-math-teacher", "--dtype", "float32",
                       "--device", "cpu", "--out", "s3://runs/chain/scored",
                       "--local-root", str(tmp_path / "scoring")]) == 0
    assert "chain/scored/index.json" in keys(client, "chain/scored/")

    def command(name, data, *overrides):
        return [sys.executable, str(REPO / "train.py"), str(REPO / "yamls" / "tiny.yaml"),
                f"train_loader.dataset.remote=s3://runs/chain/{data}", f"train_loader.dataset.local={tmp_path}/{name}",
                "train_loader.convert_if_missing=null", "eval_loader=null", "selection_report=null",
                "loggers.console=null", f"max_duration={BATCHES}ba", f"run_name={name}",
                f"loggers.jsonl.path={tmp_path}/{name}.jsonl", *overrides,
                *(["algorithms.vocagno.teacher_losses=cached"] if data == "scored" else [])]

    run_env = {**os.environ, "PYTHONPATH": str(REPO)}
    for data in ("shards", "scored"):
        straight = forked.run(command(f"straight-{data}", data), cwd=tmp_path, env=run_env, timeout=900)
        assert straight.returncode == 0, straight.stderr[-4000:]
    # The uninterrupted runs save nothing: the killed one's checkpoints are what the store must hold.
    killed = command("killed", "shards", "save_interval=2ba", "autoresume=true", "save_folder=s3://runs/chain/killed")
    # Killed once its first checkpoint is in the store, whether or not the latest symlink is (autoresume's repair
    # points it to the newest complete checkpoint when it is not).
    kill_when(killed, lambda: any(k.endswith("-rank0.pt") for k in keys(client, "chain/killed/")), cwd=tmp_path,
              env=run_env)
    first = read_log(tmp_path / "killed.jsonl")
    killed_at = max(s for s in first if "loss/train/total" in first[s])
    assert killed_at < BATCHES - 1, "the kill should land before the run ends"
    resumed = forked.run(killed, cwd=tmp_path, env=run_env, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    expected, got = read_log(tmp_path / "straight-shards.jsonl"), read_log(tmp_path / "killed.jsonl")
    assert_same_losses(expected, got, BATCHES)
    assert f"chain/killed/ep0-ba{BATCHES}-rank0.pt" in keys(client, "chain/killed/")
    cached = read_log(tmp_path / "straight-scored.jsonl")
    assert len([s for s in cached if "loss/train/total" in cached[s]]) == BATCHES
