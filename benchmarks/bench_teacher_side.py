"""CPU cost of making the teacher side of a batch of student tokens alone (``vocagno.teacher_side.TeacherSide``).

    python benchmarks/bench_teacher_side.py [--rows 4] [--seq-len 2048] [--repeats 20] [--student llama2] [--teacher qwen2.5]

Rows are cut as llm-foundry's ``convert_dataset_json`` concatenates documents (BOS text EOS, ...) from real math text
(GSM8K and MATH, shipped). Prints milliseconds per batch, in all and per stage (text of the student tokens, the
teacher's tokenization, alignment and the rest of the collator), on one core (``TOKENIZERS_PARALLELISM=false``, as in
a training process's loader workers). For comparison: the step of a 1.1B student on an H100 is ~100s of ms.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from vocagno.teacher_side import TeacherSide  # noqa: E402
from vocagno.tokenization import ASSETS, encode_with_offsets, load_tokenizer  # noqa: E402


def student_rows(tokenizer, rows: int, seq_len: int) -> torch.Tensor:
    texts = []
    for name, render in (("gsm8k_train_500.jsonl", lambda r: r["text"]),
                         ("math_test_100.jsonl", lambda r: f"Problem: {r['problem']}\n\nSolution: {r['solution']}")):
        with open(ASSETS / "text" / name, encoding="utf-8") as f:
            texts += [render(json.loads(line)) for line in f]
    ids: list[int] = []
    for text in texts:
        ids += encode_with_offsets(tokenizer, text, add_special_tokens=True)[0].tolist() + [tokenizer.eos_token_id]
        if len(ids) >= rows * seq_len:
            break
    if len(ids) < rows * seq_len:
        raise SystemExit(f"the shipped text makes {len(ids)} tokens, fewer than {rows} x {seq_len}")
    return torch.tensor(ids[: rows * seq_len]).reshape(rows, seq_len)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--student", default="llama2")
    parser.add_argument("--teacher", default="qwen2.5")
    args = parser.parse_args()
    student, teacher = load_tokenizer(args.student), load_tokenizer(args.teacher)
    side = TeacherSide(student, teacher)
    batch = {"input_ids": student_rows(student, args.rows, args.seq_len)}
    side(batch)  # warm up

    stages = {"student text": 0.0, "teacher tokens": 0.0, "alignment + collator": 0.0}
    rows = [row.numpy() for row in batch["input_ids"]]
    begin = time.perf_counter()
    for _ in range(args.repeats):
        side(batch)
    total = (time.perf_counter() - begin) / args.repeats
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for row in rows:
            side.student.row(row)
        t1 = time.perf_counter()
        samples = [side.sample(row) for row in rows]
        t2 = time.perf_counter()
        side.collator(samples)
        t3 = time.perf_counter()
        stages["student text"] += t1 - t0
        stages["teacher tokens"] += (t2 - t1) - (t1 - t0)  # sample() reads the text again, then tokenizes
        stages["alignment + collator"] += t3 - t2
    teacher_tokens = int(side(batch)["teacher_attention_mask"].sum())
    print(f"{args.rows} x {args.seq_len} {args.student} tokens -> {teacher_tokens} {args.teacher} tokens: "
          f"{1000 * total:.1f} ms per batch on one core ({args.rows * args.seq_len / total:,.0f} student tokens/s)")
    for stage, seconds in stages.items():
        print(f"  {stage:<22} {1000 * seconds / args.repeats:7.1f} ms")


if __name__ == "__main__":
    main()
