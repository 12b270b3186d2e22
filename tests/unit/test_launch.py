"""The launch of a run over several nodes: the Slurm scripts run ``python -m vocagno.launch`` on every node, and it
gives the command ``tests/distributed/test_multinode.py`` rehearses (``node_command``); what it refuses."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from vocagno.launch import main, node_command

REPO = Path(__file__).resolve().parents[2]


def slurm(script: str, nodes: int, env: dict, tmp_path: Path, *args: str) -> list[list[str]]:
    """What each node of ``sbatch --nodes=N script`` would run: srun and scontrol stand-ins run the script's line
    once per node (SLURM_NODEID), with a python that asks vocagno.launch for --dry-run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text("#!/bin/sh\nprintf 'node-a\\nnode-b\\nnode-c\\nnode-d\\n'\n")
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\n'
                                  f'for n in $(seq 0 $(({nodes} - 1))); do SLURM_NODEID=$n "$@" || exit 1; done\n')
    (bin_dir / "python").write_text(f'#!/bin/sh\n[ "$1 $2" = "-m vocagno.launch" ] && shift 2 && '
                                    f'exec {sys.executable} -m vocagno.launch --dry-run "$@"\nexit 9\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    result = subprocess.run(["bash", str(REPO / "scripts" / script), *args], cwd=REPO, capture_output=True,
                            text=True, timeout=120, env={**os.environ, **env, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                                                         "SLURM_NNODES": str(nodes), "SLURM_JOB_ID": "42",
                                                         "SLURM_JOB_NODELIST": "node-[a-d]", "SLURM_GPUS_ON_NODE": "8",
                                                         "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    return [shlex.split(line) for line in result.stdout.splitlines()]


@pytest.mark.slow
def test_the_slurm_training_script_runs_on_each_node_the_command_the_rehearsal_runs(tmp_path):
    lines = slurm("slurm_train.sh", 4, {"SHARDS": "s3://b/owm", "SAVE_FOLDER": "s3://b/runs/{run_name}"}, tmp_path,
                  "max_duration=10ba")
    assert lines == [node_command("train", ["yamls/qwen_teacher.yaml", "save_folder=s3://b/runs/{run_name}",
                                            "max_duration=10ba"], nodes=4, node_rank=rank, nproc=8,
                                  master_addr="node-a", cache="/tmp/vocagno-42", shards="s3://b/owm")
                     for rank in range(4)]
    assert lines[3][lines[3].index("--world_size") + 1] == "32" and lines[3][lines[3].index("--node_rank") + 1] == "3"
    assert lines[0][-1] == "autoresume=true" and "train_loader.dataset.local=/tmp/vocagno-42/train" in lines[0]


def test_the_slurm_scoring_script_runs_vocagno_score_on_each_node(tmp_path):
    lines = slurm("slurm_score.sh", 2, {"SHARDS": "/shared/owm", "OUT": "s3://b/owm-scored"}, tmp_path)
    assert lines == [node_command("score", ["--shards", "/shared/owm", "--config", "yamls/qwen_teacher.yaml", "--out",
                                            "s3://b/owm-scored"], nodes=2, node_rank=rank, nproc=8,
                                  master_addr="node-a") for rank in range(2)]


def test_a_training_launch_without_a_shared_save_folder_or_its_shards_is_refused(capsys):
    common = ["--nodes", "2", "--node-rank", "0", "--nproc", "2", "--master-addr", "h", "--dry-run"]
    with pytest.raises(SystemExit):
        main([*common, "--cache", "/tmp/c", "--shards", "/s", "train", str(REPO / "yamls" / "tiny.yaml")])
    assert "sets no save_folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*common, "train", str(REPO / "yamls" / "tiny.yaml"), "save_folder=/shared/x"])
    assert "train needs --shards" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*common[:3], "2", *common[4:], "score", "--shards", "x"])
    assert "--node-rank 2 of --nodes 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # after the job it is the job's argument: the run would start
        main([*common[:-1], "score", "--shards", "x", "--dry-run"])
    assert "--dry-run goes before the job" in capsys.readouterr().err


def test_each_node_reads_the_eval_shards_from_its_own_cache_too():
    """tiny.yaml's eval loader converts into its local folder when missing: on several nodes, each node's own."""
    command = node_command("train", [str(REPO / "yamls" / "tiny.yaml"), "save_folder=/shared/run"], nodes=2,
                           node_rank=1, nproc=2, master_addr="h", cache="/local", shards="/shared/shards")
    assert "eval_loader.dataset.local=/local/eval" in command and "train_loader.dataset.local=/local/train" in command
    from vocagno.training.config import load_config

    yaml = next(i for i, arg in enumerate(command) if arg.endswith("train.py")) + 1
    cfg = load_config(command[yaml], command[yaml + 1:])  # as train.py reads it on the node
    assert cfg.eval_loader.convert_if_missing.input == "vocagno/assets/text/gsm8k_heldout_100.jsonl"
    no_eval = node_command("train", [str(REPO / "yamls" / "tiny.yaml"), "save_folder=/shared/run", "eval_loader=null"],
                           nodes=2, node_rank=1, nproc=2, master_addr="h", cache="/local", shards="/shared/shards")
    assert not [arg for arg in no_eval if arg.startswith("eval_loader.dataset")]
