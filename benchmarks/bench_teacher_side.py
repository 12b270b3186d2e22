"""CPU cost of making the teacher side of a batch of student tokens alone (``vocagno.teacher.side.TeacherSide``).

    python benchmarks/bench_teacher_side.py [--rows 4] [--seq-len 2048] [--repeats 20] [--student S] [--teacher T]
    python benchmarks/bench_teacher_side.py --workers 2        # + where it is made: training process or loader workers
    python benchmarks/bench_teacher_side.py --end-to-end       # + student tokens/s of short training runs

Rows are cut as llm-foundry's ``convert_dataset_json`` concatenates documents (BOS text EOS, ...) from real math text
(GSM8K and MATH, shipped). Prints milliseconds per batch, in all and per stage (text of the student tokens, the
teacher's tokenization, alignment and the rest of the collator), on one core (``TOKENIZERS_PARALLELISM=false``, as in
a training process's loader workers). For comparison: the step of a 1.1B student on an H100 is ~100s of ms.

``--workers N`` prints a JSON line per path with ``main_process_ms_per_batch``, the training process's time per
batch on the teacher side: made there (AFTER_DATALOADER without workers), or, with N loader workers making it
(``WithTeacherSide``) while a step of ``--step-ms`` runs, taking such a batch minus taking the loader's plain batch
(the transfer of the teacher side's tensors, and unpacking them); and ``worker_ms_per_batch``.
``--end-to-end`` trains a tiny student guided by the shipped tiny teacher for a few batches, from student tokens alone
(llm-foundry's ``text`` loader on a ``convert_dataset_json`` MDS where llm-foundry is installed, else a PyTorch
``DataLoader`` of the same token rows) with 2 workers, and from our shards, and prints both student tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from vocagno.teacher.side import TeacherSide, WithTeacherSide, unpack_teacher_side  # noqa: E402
from vocagno.core.tokenization import ASSETS, encode_with_offsets, load_tokenizer  # noqa: E402


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
    parser.add_argument("--workers", type=int, default=0, help="also time the teacher side made in N loader workers")
    parser.add_argument("--step-ms", type=float, default=300.0, help="the training step the workers overlap with")
    parser.add_argument("--end-to-end", action="store_true", help="also the student tokens/s of short training runs")
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
    if args.workers:
        print(json.dumps({"path": "training process", "main_process_ms_per_batch": round(1000 * total, 2),
                          "worker_ms_per_batch": None}))
        # The loader's own batches cost the training process something too: the teacher side's share is the rest.
        timed = {name: in_workers(collate, batch["input_ids"], args.workers, args.repeats, args.step_ms / 1000)
                 for name, collate in (("plain", torch.utils.data.default_collate),
                                       ("guided", WithTeacherSide(torch.utils.data.default_collate, side, "rows")))}
        print(json.dumps({"path": f"{args.workers} loader workers",
                          "main_process_ms_per_batch": round(timed["guided"] - timed["plain"], 2),
                          "worker_ms_per_batch": round(1000 * total, 2), "taking_a_batch_ms": round(timed["guided"], 2),
                          "taking_a_plain_batch_ms": round(timed["plain"], 2), "step_ms": args.step_ms}))
    if args.end_to_end:
        print(json.dumps(end_to_end()))


def in_workers(collate, ids: torch.Tensor, workers: int, batches: int, step_s: float) -> float:
    """Milliseconds per batch the training process spends taking a batch from N workers that collate it with
    ``collate`` while each step (a sleep of ``step_s``) runs: the batch's transfer, and unpacking the teacher side
    (what AFTER_DATALOADER then does with it)."""
    rows = [{"input_ids": row} for row in ids] * batches
    loader = torch.utils.data.DataLoader(rows, batch_size=len(ids), num_workers=workers, collate_fn=collate)
    batches_in = iter(loader)
    next(batches_in)  # the workers start
    time.sleep(step_s * 2)
    waited = 0.0
    for _ in range(batches - 1):
        begin = time.perf_counter()
        unpack_teacher_side(next(batches_in))
        waited += time.perf_counter() - begin
        time.sleep(step_s)
    return 1000 * waited / (batches - 1)


def end_to_end(seq_len: int = 512, batch_size: int = 8, batches: int = 12) -> dict:
    """Student tokens/s of a tiny guided run from student tokens alone (2 workers make the teacher side) and from
    our shards (2 workers read them), the same student, teacher and text."""
    import tempfile

    from composer import Callback, Trainer
    from composer.models import HuggingFaceModel
    from omegaconf import OmegaConf as om

    from vocagno.conversion.convert import main as convert_main
    from vocagno.algorithms.vocagno_lm import VocAgnoLM
    from vocagno.teacher.config import build_causal_lm
    from vocagno.data.dataset import teacher_guided_loader
    from vocagno.teacher.model import load_teacher
    from vocagno.teacher.teacher import Teacher

    class Clock(Callback):
        def __init__(self):
            self.ends = []

        def batch_end(self, state, logger):
            self.ends.append(time.perf_counter())

    text = str(ASSETS / "text" / "gsm8k_train_500.jsonl")
    student_tok, figures = load_tokenizer("llama2"), {"seq_len": seq_len, "batch": batch_size, "batches": batches}
    with tempfile.TemporaryDirectory() as work:
        try:
            from llmfoundry.command_utils.data_prep.convert_dataset_json import convert_dataset_json
            from llmfoundry.data.text_data import build_text_dataloader

            student_tok.save_pretrained(f"{work}/student")  # it loads the tokenizer by name: the shipped copy's folder
            convert_dataset_json(path=text, out_root=f"{work}/tokens", compression=None, concat_tokens=seq_len,
                                 split="train", tokenizer=f"{work}/student", eos_text="</s>")
            tokens = build_text_dataloader(student_tok, batch_size, {"local": f"{work}/tokens", "split": None,
                                           "shuffle": False, "max_seq_len": seq_len}, drop_last=True,
                                           num_workers=2).dataloader
            figures["tokens_loader"] = "llm-foundry text"
        except ImportError:
            ids = student_rows(student_tok, batch_size * batches, seq_len)
            tokens = torch.utils.data.DataLoader([{"input_ids": row} for row in ids], batch_size=batch_size,
                                                 num_workers=2)
            figures["tokens_loader"] = "torch DataLoader of token rows (llm-foundry is not installed)"
        convert_main(["--input", text, "--student-tokenizer", "llama2", "--teacher-tokenizer", "mistral",
                      "--seq-len", str(seq_len), "--out-root", f"{work}/shards"])
        shards = teacher_guided_loader({"local": f"{work}/shards"}, student_tok, "mistral", batch_size, num_workers=2)
        student_config = om.create({"config": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 192,
                                               "num_hidden_layers": 2, "num_attention_heads": 4,
                                               "num_key_value_heads": 2, "max_position_embeddings": seq_len}})
        for name, loader in (("tokens", tokens), ("shards", shards)):
            clock = Clock()
            student = build_causal_lm(student_config, len(student_tok), seed=0)
            Trainer(model=HuggingFaceModel(student, tokenizer=student_tok, use_logits=True), train_dataloader=loader,
                    max_duration=f"{batches}ba", callbacks=[clock], device="cpu", loggers=[], progress_bar=False,
                    algorithms=[VocAgnoLM(teacher=Teacher(load_teacher("tiny-math-teacher", "float32"),
                                                          tokenizer="mistral"))],
                    optimizers=torch.optim.AdamW(student.parameters(), lr=1e-3)).fit()
            seconds = clock.ends[-1] - clock.ends[1]  # after two batches: the workers started, the caches warm
            figures[f"{name}_student_tokens_per_s"] = round((batches - 2) * batch_size * seq_len / seconds)
    return figures


if __name__ == "__main__":
    from vocagno import entry

    entry.run(main)  # a refusal: one line, exit 2
