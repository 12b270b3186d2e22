#!/usr/bin/env bash
# Guided training on N nodes x 8 GPUs with Slurm: sbatch --nodes=4 scripts/slurm_train.sh
# Every node runs `python -m vocagno.launch ... train` with its own node rank; the line is the one
# tests/distributed/test_multinode.py rehearses. Set, in the environment or below:
#   SHARDS       the training shards, where every node reads them (s3://bucket/owm, or a shared file system)
#   SAVE_FOLDER  checkpoints, where every node reaches them (s3://bucket/runs/{run_name}, or a shared file system)
#   CACHE        a folder on each node's own disk for Streaming's local copies (default: /tmp/vocagno-$SLURM_JOB_ID)
#   YAML         default: yamls/qwen_teacher.yaml; anything after the script's name goes to train.py as key=value
# Restarted after a node died (sbatch again, on as many nodes or fewer), the run resumes from SAVE_FOLDER.
#SBATCH --job-name=vocagno-train
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
set -euo pipefail
: "${SHARDS:?set SHARDS to the training shards (s3://... or a shared file system)}"
: "${SAVE_FOLDER:?set SAVE_FOLDER to where every node reaches the checkpoints}"
CACHE=${CACHE:-/tmp/vocagno-$SLURM_JOB_ID}
YAML=${YAML:-yamls/qwen_teacher.yaml}
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export SHARDS SAVE_FOLDER CACHE YAML MASTER_ADDR
# One task per node; Slurm gives each its node rank.
srun --kill-on-bad-exit=1 bash -c 'exec python -m vocagno.launch --nodes "$SLURM_NNODES" --node-rank "$SLURM_NODEID" \
  --nproc "${SLURM_GPUS_ON_NODE:-8}" --master-addr "$MASTER_ADDR" --cache "$CACHE" --shards "$SHARDS" \
  train "$YAML" "save_folder=$SAVE_FOLDER" "$@"' vocagno "$@"
