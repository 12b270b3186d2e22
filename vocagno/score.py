"""Score once, train many: vocagno shards written again with the teacher's loss of each of its tokens.

    python -m vocagno.score --shards shards/owm-qwen --teacher Qwen/Qwen2.5-Math-7B-Instruct --out shards/scored

VocAgnoLM needs one scalar per teacher token from the teacher, and it does not depend on the student: scored once
(``TeacherScorer``, exactly as in training: the sample's teacher row as context, chunked cross-entropy), the losses
serve every run on these shards (a Table 3 grid, a top-k sweep, several seeds) with
``algorithms.vocagno.teacher_losses: cached``, and no teacher is loaded then. The output has the input's columns
plus ``teacher_loss`` (float16, NaN where undefined: a row's first token), and its ``vocagno.json`` records the
teacher (``scored_by``: name, a fingerprint of its weights, dtype).

This first version scores on one device, from local shards into a local folder, written whole and renamed into place
when complete (an interrupted run starts again; it does not resume).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from vocagno.algorithm import TeacherScorer, load_teacher
from vocagno.shards import COLUMNS, METADATA_FILE, SCORED_COLUMNS, SHARD_HASH, ShardMetadata

__all__ = ["weights_fingerprint", "score_shards", "main"]


def weights_fingerprint(model: torch.nn.Module) -> str:
    """16 hex digits from every parameter's name, shape and sum: which weights scored the shards, cheap on a GPU."""
    digest = hashlib.sha256()
    for name, parameter in model.named_parameters():
        digest.update(f"{name}{tuple(parameter.shape)}{float(parameter.double().sum()):.10e}".encode())
    return digest.hexdigest()[:16]


@torch.no_grad()
def score_shards(shards: str, out: str, scorer: TeacherScorer, scored_by: dict, batch_size: int = 8,
                 device: str = "cpu") -> int:
    """Write ``shards`` with each sample's ``teacher_loss`` into ``out``; return the number of samples."""
    from streaming import MDSWriter, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    metadata = ShardMetadata.read(shards)
    final = Path(out)
    if (final / "index.json").exists():
        raise SystemExit(f"error: {out} already holds shards; give another --out")
    staging = final.with_name(f".tmp-{final.name}")
    shutil.rmtree(staging, ignore_errors=True)
    clean_stale_shared_memory()
    dataset = StreamingDataset(local=shards, shuffle=False, batch_size=batch_size)
    scorer = scorer.to(device)
    begin, tokens = time.perf_counter(), 0
    with MDSWriter(out=str(staging), columns=SCORED_COLUMNS, compression="zstd", hashes=[SHARD_HASH],
                   size_limit=1 << 26) as writer, tqdm(total=len(dataset), unit="sample", desc="scoring") as progress:
        for first in range(0, len(dataset), batch_size):
            samples = [dataset[i] for i in range(first, min(first + batch_size, len(dataset)))]
            rows = [np.asarray(sample["teacher_ids"], dtype=np.int64) for sample in samples]
            ids = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
            mask = torch.zeros_like(ids)
            for b, row in enumerate(rows):
                ids[b, : len(row)] = torch.from_numpy(row)
                mask[b, : len(row)] = 1
            losses = scorer(ids.to(device), mask.to(device)).float().cpu().numpy()
            for sample, row, loss in zip(samples, rows, losses):
                written = {name: np.array(sample[name]) if name != "text" else sample[name] for name in COLUMNS}
                writer.write({**written, "teacher_loss": loss[: len(row)].astype(np.float16)})
            tokens += sum(map(len, rows))
            progress.update(len(samples))
            progress.set_postfix_str(f"{tokens / (time.perf_counter() - begin):,.0f} teacher tok/s")
    replace(metadata, scored_by=scored_by).write(staging)
    os.rename(staging, final)
    return len(dataset)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vocagno.score", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", required=True, help="a local folder of vocagno shards (the converter's)")
    parser.add_argument("--teacher", required=True, help="the teacher: a Hugging Face name or folder")
    parser.add_argument("--out", required=True, help="the new, scored shards' folder")
    parser.add_argument("--dtype", default="bfloat16", help="the teacher's dtype")
    parser.add_argument("--batch-size", type=int, default=8, help="samples scored at a time")
    parser.add_argument("--chunk-size", type=int, default=1024, help="teacher tokens per chunk of its LM head")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if not (Path(args.shards) / METADATA_FILE).exists():
        parser.error(f"--shards {args.shards} holds no {METADATA_FILE}: not vocagno shards")
    teacher = load_teacher(args.teacher, args.dtype)
    scored_by = {"name": args.teacher, "fingerprint": weights_fingerprint(teacher), "dtype": args.dtype}
    samples = score_shards(args.shards, args.out, TeacherScorer(teacher, args.chunk_size), scored_by,
                           args.batch_size, args.device)
    print(f"scored {samples} samples with {args.teacher} into {args.out}")
    return 0 if samples else 1


if __name__ == "__main__":
    sys.exit(main())
