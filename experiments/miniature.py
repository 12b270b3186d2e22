"""A one-GPU miniature of the paper: does a teacher of another vocabulary make a student learn from mixed data better?

    python experiments/miniature.py                       # the real size: one GPU (sized for ~15 minutes; not yet run)
    python experiments/miniature.py --size toy --seeds 0  # the same steps at a toy size: a CPU, ~2 minutes (CI runs it)

1. A small **teacher** (Qwen2 architecture around the real Qwen2.5 tokenizer) is pretrained on clean math text: the
   shipped GSM8K training problems (``vocagno/assets/text``).
2. A **corpus** mixes that text with junk: each document again with its words shuffled (the same words, no sense).
   It is converted into vocagno shards (``conversion/convert_dataset.py``: both tokenizations, both offsets).
3. **Students** (Llama architecture around the real Llama-2 tokenizer), from the same initialization per seed, train
   on the corpus with (a) ``plain`` causal LM loss on every token, (b) ``vocagno``: the teacher-guided top 40% (plus
   the unmapped tokens, ``vocagno.loss.guided_loss``), (c) ``random``: a random selection of as many tokens.
4. Each student's **bits per byte** on held-out GSM8K test problems (``vocagno.metrics.bits_per_byte``, which
   compares models of any tokenizer on the same bytes) is printed in a table with the teacher's own figure: mean and
   spread over the seeds.

A plain PyTorch loop over the functional core (``align`` via the collator, ``TeacherScorer``, ``guided_loss``): the
data flow in one file. Training through Composer is what ``train.py`` does; this is the quick check before that.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from streaming.base.util import clean_stale_shared_memory  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from conversion import convert_dataset  # noqa: E402
from vocagno.algorithm import TeacherScorer, teacher_guided_loss  # noqa: E402
from vocagno.data import teacher_guided_loader  # noqa: E402
from vocagno.eval.benchmarks import SHIPPED_DATA, read_test_split  # noqa: E402
from vocagno.loss import token_cross_entropy  # noqa: E402
from vocagno.metrics import bits_per_byte  # noqa: E402
from vocagno.tokenization import ASSETS, load_tokenizer  # noqa: E402

METHODS = ("plain", "vocagno", "random")
# guided_loss's selection for each guided method: random keeps as many mapped tokens as the top-k, drawn at random.
SELECTION = {"vocagno": "topk", "random": "random"}
SIZES = {  # width, layers, heads, seq_len, batch, teacher steps, student steps, learning rate, held-out problems
    "toy": dict(width=32, layers=1, heads=2, seq_len=64, batch=8, teacher_steps=30, student_steps=20, lr=3e-3,
                heldout=40),
    "gpu": dict(width=384, layers=6, heads=6, seq_len=512, batch=32, teacher_steps=1500, student_steps=600, lr=1e-3,
                heldout=1319),
}


def documents() -> list[str]:
    with open(ASSETS / "text" / "gsm8k_train_500.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def shuffled_words(text: str, rng: random.Random) -> str:
    words = text.split()
    rng.shuffle(words)
    return " ".join(words)


def convert(texts: list[str], folder: Path, seq_len: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    convert_dataset.main(["--input", str(corpus), "--student-tokenizer", "llama2", "--teacher-tokenizer", "qwen2.5",
                          "--seq-len", str(seq_len), "--out-root", str(folder / "shards")])
    return folder / "shards"


def batches(shards: Path, tokenizers, batch: int, seed: int):
    """Endless batches of the shards, reshuffled each epoch."""
    epoch = 0
    while True:
        clean_stale_shared_memory()
        loader: DataLoader = teacher_guided_loader(
            {"local": str(shards), "shuffle": True, "shuffle_seed": seed + epoch, "num_canonical_nodes": 1},
            *tokenizers, batch, drop_last=True)
        yield from loader
        epoch += 1


def build_model(kind: str, vocab: int, size: dict, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    student = kind == "student"
    config_class, model_class = (LlamaConfig, LlamaForCausalLM) if student else (Qwen2Config, Qwen2ForCausalLM)
    config = config_class(vocab_size=vocab, hidden_size=size["width"], intermediate_size=4 * size["width"],
                          num_hidden_layers=size["layers"], num_attention_heads=size["heads"],
                          num_key_value_heads=size["heads"], max_position_embeddings=2 * size["seq_len"],
                          tie_word_embeddings=True)
    return model_class(config)


def train_teacher(teacher, data, size: dict, device: str) -> None:
    optimizer = torch.optim.AdamW(teacher.parameters(), lr=size["lr"], weight_decay=0.0)
    for _ in range(size["teacher_steps"]):
        batch = next(data)
        ids, mask = batch["teacher_input_ids"].to(device), batch["teacher_attention_mask"].to(device)
        labels = ids.masked_fill(mask == 0, -100)
        loss = teacher(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def train_student(student, scorer, method: str, data, size: dict, device: str, seed: int) -> None:
    generator = torch.Generator(device=device).manual_seed(seed)
    optimizer = torch.optim.AdamW(student.parameters(), lr=size["lr"], weight_decay=0.0)
    for _ in range(size["student_steps"]):
        batch = {k: v.to(device) for k, v in next(data).items()}
        logits = student(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        if method == "plain":
            loss = token_cross_entropy(logits[:, :-1], batch["labels"][:, 1:])
            loss = loss[batch["labels"][:, 1:] != -100].mean()
        else:
            teacher_loss = scorer(batch["teacher_input_ids"], batch["teacher_attention_mask"])
            loss = teacher_guided_loss(logits, batch["labels"], batch, teacher_loss, selection=SELECTION[method],
                                       generator=generator)["total"]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


@torch.no_grad()
def heldout_bits_per_byte(model, tokenizer, texts: list[str]) -> float:
    model.eval()
    value = bits_per_byte(model, tokenizer, texts)
    model.train()
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="gpu")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated student seeds")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    size, seeds = SIZES[args.size], [int(s) for s in args.seeds.split(",")]
    begin = time.perf_counter()
    student_tok, teacher_tok = load_tokenizer("llama2"), load_tokenizer("qwen2.5")
    rows = read_test_split(Path(SHIPPED_DATA), "gsm8k")[: size["heldout"]]
    heldout = [f"Question: {r['question']}\nAnswer: {r['answer']}" for r in rows]
    clean = documents()
    rng = random.Random(0)
    mixed = clean + [shuffled_words(text, rng) for text in clean]
    rng.shuffle(mixed)
    with tempfile.TemporaryDirectory() as tmp:
        clean_shards = convert(clean, Path(tmp) / "clean", size["seq_len"])
        mixed_shards = convert(mixed, Path(tmp) / "mixed", size["seq_len"])
        tokenizers = (student_tok, teacher_tok)
        teacher = build_model("teacher", len(teacher_tok), size, seed=1000).to(args.device)
        train_teacher(teacher, batches(clean_shards, tokenizers, size["batch"], 0), size, args.device)
        scorer = TeacherScorer(teacher)
        results = {
            "teacher (clean text)": [heldout_bits_per_byte(teacher, teacher_tok, heldout)],
            "student at init": [heldout_bits_per_byte(build_model("student", len(student_tok), size, seed).to(
                args.device), student_tok, heldout) for seed in seeds],
        }
        for method in METHODS:
            for seed in seeds:
                student = build_model("student", len(student_tok), size, seed).to(args.device)
                data = batches(mixed_shards, tokenizers, size["batch"], seed)
                train_student(student, scorer, method, data, size, args.device, seed)
                results.setdefault(method, []).append(heldout_bits_per_byte(student, student_tok, heldout))
    print(f"\nheld-out bits per byte, {len(heldout)} GSM8K test problems; students on clean + word-shuffled text "
          f"({args.size} size, seeds {args.seeds}, {time.perf_counter() - begin:.0f} s)")
    print(f"{'model':<22} {'bits/byte':>10} {'spread':>8}")
    for name, values in results.items():
        spread = statistics.pstdev(values) if len(values) > 1 else 0.0
        print(f"{name:<22} {statistics.mean(values):>10.4f} {spread:>8.4f}")


if __name__ == "__main__":
    main()
