#!/usr/bin/env bash
# The scoring pass (the teacher's losses cached into the shards) on N nodes x 8 GPUs with Slurm:
#   SHARDS=/shared/owm OUT=s3://bucket/owm-scored sbatch --nodes=4 scripts/slurm_score.sh
# Every rank scores its parts into OUT (an object store or a shared file system); the last rank to finish merges
# them once. Killed, the same command resumes: finished parts are kept. YAML (default yamls/qwen_teacher.yaml)
# names the teacher; anything after the script's name goes to vocagno.score.
#SBATCH --job-name=vocagno-score
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
set -euo pipefail
: "${SHARDS:?set SHARDS to the converted shards, on a file system every node reads}"
: "${OUT:?set OUT to where the scored shards go (s3://... or a shared file system)}"
YAML=${YAML:-yamls/qwen_teacher.yaml}
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export SHARDS OUT YAML MASTER_ADDR
srun --kill-on-bad-exit=1 bash -c 'exec python -m vocagno.launch --nodes "$SLURM_NNODES" --node-rank "$SLURM_NODEID" \
  --nproc "${SLURM_GPUS_ON_NODE:-8}" --master-addr "$MASTER_ADDR" \
  score --shards "$SHARDS" --config "$YAML" --out "$OUT" "$@"' vocagno "$@"
