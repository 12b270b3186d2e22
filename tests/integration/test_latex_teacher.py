"""The second shipped teacher, tiny-latex-teacher (MATH problems in LaTeX, DeepSeek-LLM's tokenizer), and its MATH
text (experiments/math_text.py): no problem evaluation scores, and each teacher knows its own domain best."""

import gzip
import json

import pytest

from experiments import math_text
from vocagno.eval.benchmarks import SHIPPED_DATA, read_test_split
from vocagno.core.tokenization import ASSETS

MATH_SPLITS = {"math_heldout_100.jsonl": 100, "math_train_500.jsonl": 500, "math_teacher.jsonl.gz": 3813}


def texts(name: str) -> list[str]:
    path = ASSETS / "text" / name
    with (gzip.open(path, "rt", encoding="utf-8") if name.endswith(".gz") else open(path, encoding="utf-8")) as f:
        return [json.loads(line)["text"] for line in f]


def problem_of(text: str) -> str:
    assert text.startswith("Problem: ") and text.count("\nSolution: ") == 1, text[:80]
    return text[len("Problem: "):text.index("\nSolution: ")].strip()


def test_the_math_text_holds_no_math500_or_alignment_problem_and_its_splits_are_disjoint():
    math500 = {row["problem"].strip() for row in read_test_split(SHIPPED_DATA, "math500")}
    alignment_only = {json.loads(line)["problem"].strip() for line in open(ASSETS / "text" / "math_test_100.jsonl")}
    assert len(math500) == 500 and len(alignment_only) == 100
    splits = {name: [problem_of(text) for text in texts(name)] for name in MATH_SPLITS}
    assert {name: len(problems) for name, problems in splits.items()} == MATH_SPLITS
    every = [problem for problems in splits.values() for problem in problems]
    assert len(set(every)) == len(every) == 4413  # 5,000 MATH test problems less 587: disjoint, no repeats
    assert not set(every) & (math500 | alignment_only)


@pytest.mark.skipif(not (math_text.SHARED_BENCHMARKS / "math").is_dir(), reason="needs ../shared/assets")
def test_the_math_text_is_made_again_byte_for_byte(tmp_path):
    assert math_text.main(["--benchmarks", str(math_text.SHARED_BENCHMARKS), "--out", str(tmp_path)]) == 0
    for name in MATH_SPLITS:
        assert (tmp_path / name).read_bytes() == (ASSETS / "text" / name).read_bytes(), name


def test_the_latex_teacher_loads_offline_by_its_shipped_name(tokenizers):
    from vocagno.teacher.model import load_teacher
    from vocagno.core.tokenization import load_tokenizer, shipped_model_dir

    folder = shipped_model_dir("tiny-latex-teacher")
    assert (ASSETS / "models" / "tiny-latex-teacher" / "model.safetensors").stat().st_size <= 8_000_000
    assert load_tokenizer("tiny-latex-teacher").get_vocab() == tokenizers["deepseek-llm"].get_vocab()
    assert (folder / "tokenizer.json").exists()
    teacher = load_teacher("tiny-latex-teacher", "float32")
    assert teacher.config.model_type == "llama" and teacher.config.tie_word_embeddings
    assert teacher.config.vocab_size == len(tokenizers["deepseek-llm"]) == 100015


@pytest.mark.slow
def test_each_shipped_teacher_knows_its_own_domain_best(tokenizers):
    """On 25 held-out problems of each domain each teacher beats the other by far. Bits per byte measured (the assets
    README): MATH 2.11 tiny-latex-teacher, 4.37 tiny-math-teacher; GSM8K 3.18 and 1.58."""
    from vocagno.training.metrics import bits_per_byte
    from vocagno.teacher.model import load_teacher

    teachers = {"latex": (load_teacher("tiny-latex-teacher", "float32"), tokenizers["deepseek-llm"]),
                "gsm8k": (load_teacher("tiny-math-teacher", "float32"), tokenizers["mistral"])}
    heldout = {"math": texts("math_heldout_100.jsonl")[:25], "gsm8k": texts("gsm8k_heldout_100.jsonl")[:25]}
    bpb = {(teacher, text): bits_per_byte(model, tokenizer, heldout[text])
           for teacher, (model, tokenizer) in teachers.items() for text in heldout}
    assert bpb["latex", "math"] + 1.5 < bpb["gsm8k", "math"], bpb
    assert bpb["gsm8k", "gsm8k"] + 1.0 < bpb["latex", "gsm8k"], bpb
