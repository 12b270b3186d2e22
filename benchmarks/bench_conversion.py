"""Conversion throughput and size (llama2 student, qwen2.5 teacher) on the shipped math text, repeated.

    python benchmarks/bench_conversion.py [--shared ../shared/assets/benchmarks] [--seq-len 2048]

The corpus: GSM8K train and MATH test from ``../shared/assets/benchmarks`` when present (about 3M student tokens of
real, unrepeated text), else the shipped slices repeated ten times (repetition flatters tokenizer caches and zstd).

Prints student tokens/s of:
- the floor: only running both tokenizers over the same documents and taking their ids and offsets, in one process;
- conversion/convert_dataset.py with 1 and with 2 workers (wall time of the whole conversion, merge included);
and bytes on disk per student token of the vocagno shards against a one-tokenizer, ids-only MDS of the same corpus
(the student ids in samples of seq-len tokens, zstd). Goals: 1 worker >= 0.8x the floor; 2 workers >= 1.6x one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per process, as the converter runs
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from streaming import MDSWriter  # noqa: E402

from vocagno.conversion.convert import main as convert_main  # noqa: E402
from vocagno.conversion.parts import ENCODE_BATCH  # noqa: E402
from vocagno.core.tokenization import ASSETS, load_tokenizer  # noqa: E402


def corpus(folder: Path, shared: Path, files: int) -> list[str]:
    """GSM8K and MATH text as ``files`` jsonl files (sources the workers share)."""
    if (shared / "gsm8k" / "train.jsonl").exists():
        gsm8k, math, repeat = shared / "gsm8k" / "train.jsonl", shared / "math" / "test.jsonl", 1
    else:
        gsm8k, math, repeat = ASSETS / "text" / "gsm8k_train_500.jsonl", ASSETS / "text" / "math_test_100.jsonl", 10
    docs = []
    for line in open(gsm8k, encoding="utf-8"):
        row = json.loads(line)
        docs.append(row["text"] if "text" in row else f"Question: {row['question']}\nAnswer: {row['answer']}")
    for line in open(math, encoding="utf-8"):
        row = json.loads(line)
        docs.append(f"Problem: {row['problem']}\n\nSolution: {row['solution']}")
    docs = docs * repeat
    folder.mkdir(parents=True)
    for f in range(files):
        with open(folder / f"part{f}.jsonl", "w", encoding="utf-8") as out:
            for doc in docs[f::files]:
                out.write(json.dumps({"text": doc}) + "\n")
    return docs


def floor(docs: list[str]) -> tuple[float, int]:
    """Student tokens/s of tokenizing with offsets only (same batching as the converter)."""
    student = load_tokenizer("llama2").backend_tokenizer
    teacher = load_tokenizer("qwen2.5").backend_tokenizer
    begin, tokens = time.perf_counter(), 0
    for i in range(0, len(docs), ENCODE_BATCH):
        batch = docs[i : i + ENCODE_BATCH]
        for tokenizer in (student, teacher):
            taken = [(e.ids, e.offsets) for e in tokenizer.encode_batch(batch, add_special_tokens=False)]
            if tokenizer is student:
                tokens += sum(len(ids) for ids, _ in taken)
    return tokens / (time.perf_counter() - begin), tokens


def conversion(inputs: Path, out: Path, workers: int, seq_len: int, tokens: int) -> float:
    begin = time.perf_counter()
    convert_main([
        "--input", str(inputs), "--student-tokenizer", "llama2", "--teacher-tokenizer", "qwen2.5",
        "--seq-len", str(seq_len), "--out-root", str(out), "--workers", str(workers), "--docs-per-part", "500",
    ])
    return tokens / (time.perf_counter() - begin)


def ids_only_bytes(docs: list[str], out: Path, seq_len: int) -> int:
    tokenizer = load_tokenizer("llama2")
    stream = np.concatenate([np.asarray(ids + [tokenizer.eos_token_id], dtype=np.uint16)
                             for ids in tokenizer(docs, add_special_tokens=False)["input_ids"]])
    with MDSWriter(out=str(out), columns={"tokens": "ndarray:uint16"}, compression="zstd") as writer:
        for k in range(len(stream) // seq_len):
            writer.write({"tokens": stream[k * seq_len : (k + 1) * seq_len]})
    return sum(f.stat().st_size for f in out.glob("shard.*"))


def shard_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.glob("part-*/shard.*"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared/assets/benchmarks")
    parser.add_argument("--seq-len", type=int, default=2048)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-conversion-"))
    try:
        docs = corpus(work / "input", args.shared, files=4)
        floor_rate, tokens = floor(docs)
        one = conversion(work / "input", work / "one", 1, args.seq_len, tokens)
        two = conversion(work / "input", work / "two", 2, args.seq_len, tokens)
        vocagno_bytes = shard_bytes(work / "one")
        ids_bytes = ids_only_bytes(docs, work / "ids", args.seq_len)
        print(f"\ncorpus: {len(docs):,} documents, {tokens:,} student tokens, seq-len {args.seq_len}, {os.cpu_count()} cores")
        print(f"floor (both tokenizers with offsets, 1 process): {floor_rate:>12,.0f} student tokens/s")
        print(f"conversion, 1 worker:                            {one:>12,.0f} student tokens/s")
        print(f"conversion, 2 workers:                           {two:>12,.0f} student tokens/s")
        print(f"ratio 1 worker / floor:  {one / floor_rate:.2f} (goal >= 0.8)")
        print(f"ratio 2 workers / 1:     {two / one:.2f} (goal >= 1.6)")
        print(f"bytes per student token: vocagno shards {vocagno_bytes / tokens:.2f}, "
              f"ids-only MDS {ids_bytes / tokens:.2f} ({vocagno_bytes / ids_bytes:.1f}x)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    from vocagno import entry

    entry.run(main)  # a refusal: one line, exit 2
