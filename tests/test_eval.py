"""Evaluation: the grader on gold answers, extraction and equivalence rules, generation end to end, bits per byte."""

import json
import math
import random
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from vocagno.eval.__main__ import load_model, main
from vocagno.eval.benchmarks import BENCHMARKS, load_benchmark, SHIPPED_DATA
from vocagno.eval.grading import extract_answer, extract_choice, is_equivalent, normalize_answer
from vocagno.metrics import BitsPerByte, bits_per_byte

OFFLINE = [b for b in BENCHMARKS if b != "tabmwp"]


@pytest.fixture(scope="module")
def gold_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("gold")
    assert main(["--gold", "--output", str(out)]) == 0
    return out, json.loads((out / "results.json").read_text())


def test_gold_answers_grade_at_least_99_percent(gold_results):
    out, results = gold_results
    for name in OFFLINE:
        rows = [json.loads(line) for line in open(out / f"{name}.jsonl")]
        print(f"{name}: {results[name]:.2f}% of {len(rows)}")
        assert results[name] >= 99.0, name
        assert len(rows) == len(load_benchmark(name, SHIPPED_DATA)) > 0
    assert results["tabmwp"].startswith("unavailable: ")  # said, not skipped silently
    table = (out / "results.md").read_text()
    assert table.splitlines()[0] == "| GSM8K | MATH | SVAMP | ASDiv | MAWPS | TabMWP | MathQA | MMLU-STEM | SAT | AVG |"
    assert "| n/a |" in table


@pytest.mark.parametrize("name", OFFLINE)
def test_shuffled_gold_answers_score_near_chance(name):
    examples = load_benchmark(name, SHIPPED_DATA)
    outputs = [e.gold_output for e in examples]
    random.Random(0).shuffle(outputs)  # each question graded on another question's solution
    accuracy = sum(is_equivalent(e.extract(o), e.gold) for e, o in zip(examples, outputs)) / len(examples)
    chance = {"mathqa": 0.2, "mmlu_stem": 0.25, "sat_math": 0.25}.get(name, 0.0)
    limit = 0.25 if name == "sat_math" else 0.05  # SAT has 32 questions: chance is noisy
    assert accuracy <= chance + limit, accuracy


def test_gold_answers_of_math500_equal_the_boxed_ones():
    # MATH-500 states each answer apart from its solution: the boxed answer and the stated one must grade equal.
    from vocagno.eval.benchmarks import read_test_split
    from vocagno.eval.grading import last_boxed

    rows = read_test_split(SHIPPED_DATA, "math500")
    equal = sum(is_equivalent(normalize_answer(last_boxed(r["solution"])), normalize_answer(r["answer"])) for r in rows)
    print(f"MATH-500: boxed answer equals the stated one for {equal} of {len(rows)}")
    assert len(rows) == 500 and equal / len(rows) >= 0.99


@pytest.mark.parametrize("output, answer", [
    ("So the total is \\boxed{\\frac{1}{\\sqrt{2}}} units.", "\\frac{1}{\\sqrt{2}}"),
    ("First \\boxed{3}, then corrected: \\boxed{4}.", "4"),
    ("She pays 1,250 dollars in all. The answer is 1,250.", "1250"),
    ("He has 5 + 4 = 9 toys left, and 2 more make 11", "11"),
    ("Final Answer: The final answer is $[2,5)$. I hope it is correct.", "[2,5)"),
    ("The answer is 9 (apples).", "9"),
    ("The answer is $18.00.", "18"),
    ("Thus $x = \\boxed{5\\text{ cm}}$.", "5"),
    ("The answer is 45^\\circ.", "45"),
    ("no number here", ""),
])
def test_extraction_follows_the_harness(output, answer):
    assert extract_answer(output) == answer


@pytest.mark.parametrize("output, letter", [
    ("Final Answer: The final answer is (C).", "C"),
    ("... = 855 answer : option d", "D"),
    ("log 12 answer : a", "A"),
    ("(A) is wrong and (B) too; so the answer is (D)", "D"),
    ("nothing", ""),
])
def test_choice_extraction(output, letter):
    assert extract_choice(output) == letter


@pytest.mark.parametrize("prediction, reference, equal", [
    ("0.5", "\\frac{1}{2}", True),
    ("\\frac{2}{4}", "\\frac{1}{2}", True),
    ("2\\sqrt{2}", "\\sqrt{8}", True),
    ("[2,5)", "[2,5)", True),
    ("(2,5]", "[2,5)", False),
    ("\\{1,2\\}", "\\{2,1\\}", True),
    ("18", "18", True),
    ("18.004", "18", True),  # harness: integer references compare with the rounded prediction
    ("17", "18", False),
    ("0.25", "25", True),  # harness: percentage leniency
    ("x^2+2x+1", "(x+1)^2", True),
    ("", "0", False),
    ("Purple", "purple", True),
])
def test_equivalence(prediction, reference, equal):
    assert is_equivalent(normalize_answer(prediction), normalize_answer(reference)) is equal


def tiny_llama(max_positions=2048):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=32000, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1,
                                        max_position_embeddings=max_positions))


def test_a_tiny_random_model_end_to_end(tmp_path, tokenizers):
    model_dir = tmp_path / "model"
    tiny_llama().save_pretrained(model_dir)
    tokenizers["llama2"].save_pretrained(model_dir)
    out = tmp_path / "out"
    assert main(["--model", str(model_dir), "--benchmarks", "gsm8k,math", "--limit", "4", "--batch-size", "3",
                 "--max-new-tokens", "6", "--output", str(out), "--device", "cpu"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results) == {"gsm8k", "math"} and all(0 <= v <= 100 for v in results.values())
    for name in ("gsm8k", "math"):
        rows = [json.loads(line) for line in open(out / f"{name}.jsonl")]
        assert [r["index"] for r in rows] == [0, 1, 2, 3]
        assert all(r["output"] and set(r) >= {"question", "predicted", "gold", "correct"} for r in rows)
    assert "| GSM8K | MATH | AVG |" in (out / "results.md").read_text()


def test_composer_checkpoints_are_exported(tmp_path, tokenizers):
    from composer import Trainer
    from composer.models import HuggingFaceModel

    batch = {"input_ids": torch.randint(0, 32000, (2, 16)), "labels": torch.randint(0, 32000, (2, 16))}
    loader = torch.utils.data.DataLoader([dict(input_ids=x, labels=y) for x, y in zip(batch["input_ids"], batch["labels"])],
                                         batch_size=2)
    student = tiny_llama(64)
    trainer = Trainer(model=HuggingFaceModel(student, tokenizer=tokenizers["llama2"]), train_dataloader=loader,
                      max_duration="1ba", save_folder=str(tmp_path), save_interval="1ba", device="cpu", loggers=[],
                      progress_bar=False)
    trainer.fit()
    model, tokenizer = load_model(str(tmp_path / "ep0-ba1-rank0.pt"), "cpu")
    assert len(tokenizer) == 32000
    for name, tensor in student.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], tensor, msg=name)


class Uniform(torch.nn.Module):
    """A language model that gives every token of a vocabulary of V the same probability."""

    def __init__(self, vocab_size, max_positions=None):
        super().__init__()
        self.vocab_size = vocab_size
        self.config = SimpleNamespace(max_position_embeddings=max_positions)
        self.anchor = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids):
        return SimpleNamespace(logits=torch.zeros(*input_ids.shape, self.vocab_size))


@pytest.mark.parametrize("name, max_positions", [("llama2", None), ("qwen2.5", None), ("llama2", 16), ("qwen2.5", 7)])
def test_bits_per_byte_of_a_uniform_model(tokenizers, math_texts, name, max_positions):
    tokenizer = tokenizers[name]
    texts = math_texts[:5] + ["Résumé: ∫x²dx 😀"]
    vocab = len(tokenizer)
    tokens = sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    got = bits_per_byte(Uniform(vocab, max_positions), tokenizer, texts)  # small windows: every token once
    assert got == pytest.approx(math.log2(vocab) * tokens / n_bytes, rel=1e-6)  # fp32 cross-entropy


def test_bits_per_byte_puts_tokenizers_on_one_scale(tokenizers, math_texts):
    texts = math_texts[:20]
    llama = bits_per_byte(Uniform(len(tokenizers["llama2"])), tokenizers["llama2"], texts)
    qwen = bits_per_byte(Uniform(len(tokenizers["qwen2.5"])), tokenizers["qwen2.5"], texts)
    # Per token, Qwen's uniform model is worse (log2 151,665 > log2 32,000); per byte, its tokens cover more bytes.
    assert 0.7 < qwen / llama < 1.4


def test_bits_per_byte_metric_matches_the_function(tokenizers):
    metric = BitsPerByte()
    logits = torch.zeros(2, 5, 100)
    labels = torch.tensor([[3, 4, 5, 6, -100], [7, 8, -100, -100, -100]])  # shifted, as Composer passes them
    token_bytes = torch.tensor([[9, 2, 3, 1, 4], [9, 5, 6, 0, 0]])  # bytes of each input token
    metric.update({"token_bytes": token_bytes}, logits, labels)
    predicted_bytes = 2 + 3 + 1 + 4 + 5 + 6  # the tokens labels point at: positions 1.. of each row
    assert metric.compute().item() == pytest.approx(6 * math.log2(100) / predicted_bytes)
