"""One node's command of a run over several nodes: training, the scoring pass, or the selection report.

    python -m vocagno.launch --nodes 4 --node-rank 0 --nproc 8 --master-addr node0 --cache /local/vocagno \\
        --shards s3://bucket/owm train yamls/qwen_teacher.yaml save_folder=s3://bucket/runs/{run_name}
    python -m vocagno.launch --nodes 4 --node-rank 0 --nproc 8 --master-addr node0 \\
        score --shards /shared/owm --config yamls/qwen_teacher.yaml --out s3://bucket/owm-scored

Each node runs the same line with its own ``--node-rank`` (``scripts/slurm_train.sh`` and ``scripts/slurm_score.sh``
pass Slurm's). It execs Composer's launcher with the world size, node rank and rendezvous, which starts ``--nproc``
ranks on this node. For training it also points the loaders at the shards as Streaming's ``remote`` (shared: an
object store or a shared file system) and at a node-local ``local`` cache under ``--cache``, and turns autoresume on:
``save_folder`` must be one place every node reaches (an object store or a shared file system), and a run restarted
with the same line, on the same or fewer nodes, resumes there. ``--dry-run`` prints the command instead.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from vocagno.entry import Parser

__all__ = ["node_command", "main"]

TRAIN_SCRIPT = Path(__file__).resolve().parent.parent / "train.py"
JOBS = {"train": None, "score": "vocagno.score", "selection": "vocagno.selection"}


def node_command(job: str, job_args: list[str], *, nodes: int, node_rank: int, nproc: int, master_addr: str,
                 master_port: int = 29500, cache: str | None = None, shards: str | None = None,
                 eval_shards: str | None = None, logs: str | None = None, python: str = sys.executable) -> list[str]:
    """The command node ``node_rank`` of ``nodes`` runs for ``job`` (``train``: ``job_args`` are the yaml and its
    overrides; ``score``, ``selection``: the module's own arguments). ``logs``: a folder for the output of every rank
    but each node's first, whose output is the node's own (``RANK.out``, ``RANK.err``; Composer's launcher
    otherwise drops it)."""
    if job not in JOBS:
        raise ValueError(f"job {job!r}: one of {', '.join(JOBS)}")
    if nodes < 1 or nproc < 1 or not 0 <= node_rank < nodes:
        raise ValueError(f"--node-rank {node_rank} of --nodes {nodes} with --nproc {nproc}: need 0 <= node rank < "
                         "nodes and at least one process a node")
    launcher = [python, "-m", "composer.cli.launcher", "--world_size", str(nodes * nproc), "--nproc", str(nproc),
                "--node_rank", str(node_rank), "--master_addr", master_addr, "--master_port", str(master_port)]
    if logs:
        launcher += ["--stdout", f"{logs}/{{rank}}.out", "--stderr", f"{logs}/{{rank}}.err"]
    if job != "train":
        return [*launcher, "-m", JOBS[job], *job_args]
    if not job_args:
        raise ValueError("train needs a yaml (and its key=value overrides)")
    if cache is None or shards is None:
        raise ValueError("train needs --shards (where every node reads them: an object store or a shared file "
                         "system) and --cache (a folder on this node's own disk for Streaming's local copies)")
    from omegaconf import OmegaConf as om

    from vocagno.training.config import load_config

    cfg = load_config(job_args[0], job_args[1:])
    if not cfg.get("save_folder"):
        raise ValueError(f"train: {job_args[0]} sets no save_folder: a run of several nodes resumes from where every "
                         "node reaches it (save_folder=s3://... or a shared file system)")
    loaders = [f"train_loader.dataset.remote={shards}", f"train_loader.dataset.local={cache}/train"]
    if cfg.get("eval_loader") is not None:  # node-local too: without --eval-shards, each node converts its own
        loaders += [*([f"eval_loader.dataset.remote={eval_shards}"] if eval_shards else []),
                    f"eval_loader.dataset.local={cache}/eval"]
        corpus = om.select(cfg, "eval_loader.convert_if_missing.input")
        if not eval_shards and corpus is not None:  # the yaml's own held-out corpus, into the node's cache folder
            loaders.append(f"eval_loader.convert_if_missing.input={corpus}")
    elif eval_shards:
        raise ValueError(f"--eval-shards, but {job_args[0]} has no eval_loader")
    return [*launcher, str(TRAIN_SCRIPT), *job_args, *loaders, "autoresume=true"]


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m vocagno.launch", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("--nodes", type=int, required=True, help="nodes in the run")
    parser.add_argument("--node-rank", type=int, required=True, help="this node's rank, 0 to nodes - 1")
    parser.add_argument("--nproc", type=int, required=True, help="ranks on each node (its GPUs)")
    parser.add_argument("--master-addr", required=True, help="the address of node 0, which every node reaches")
    parser.add_argument("--master-port", type=int, default=29500)
    parser.add_argument("--cache", help="train: a folder on this node's disk for Streaming's local copies")
    parser.add_argument("--shards", help="train: the training shards, where every node reads them (s3://..., or a "
                                         "shared file system)")
    parser.add_argument("--eval-shards", help="train: the eval loader's shards, likewise")
    parser.add_argument("--logs", help="a folder for the stdout and stderr of every rank but the node's first "
                                       "(RANK.out, RANK.err), which prints as the node")
    parser.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    parser.add_argument("job", choices=sorted(JOBS), help="train (train.py), score (vocagno.score) or selection "
                                                          "(vocagno.selection)")
    parser.add_argument("job_args", nargs=argparse.REMAINDER, help="train: YAML [key=value ...]; score, selection: "
                                                                   "the module's arguments")
    args = parser.parse_args(argv)
    if "--dry-run" in args.job_args:  # after the job it would be the job's: the run would start
        parser.error("--dry-run goes before the job (train, score, selection)")
    try:
        command = node_command(args.job, args.job_args, nodes=args.nodes, node_rank=args.node_rank, nproc=args.nproc,
                               master_addr=args.master_addr, master_port=args.master_port, cache=args.cache,
                               shards=args.shards, eval_shards=args.eval_shards, logs=args.logs)
    except ValueError as error:
        parser.error(str(error))
    if args.dry_run:
        print(shlex.join(command))
        return 0
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
    sys.stdout.flush()
    os.execv(command[0], command)


if __name__ == "__main__":
    from vocagno.entry import run

    run(main)
