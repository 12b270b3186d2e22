"""Evaluation: the grader on gold answers, extraction and equivalence rules, generation end to end, bits per byte."""

import json
import math
import random
import re
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from vocagno.eval.__main__ import main
from vocagno.training.models import load_model
from vocagno.eval.benchmarks import BENCHMARKS, load_benchmark, SHIPPED_DATA
from vocagno.eval.grading import extract_answer, extract_choice, is_equivalent, normalize_answer
from vocagno.training.metrics import BitsPerByte, bits_per_byte

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
        # docs/evaluation.md's figures (vocagno.eval --gold): MathQA loses three rationales that say "the answer is
        # a..." before their last line.
        assert round(results[name], 1) == (99.7 if name == "mathqa" else 100.0), name
        assert len(rows) == len(load_benchmark(name, SHIPPED_DATA)) > 0
    assert results["tabmwp"].startswith("unavailable: ")  # said, not skipped silently
    assert "partial" not in results  # every question, the protocol's generation length
    table = (out / "results.md").read_text()
    assert table.splitlines()[0] == "| GSM8K | MATH | SVAMP | ASDiv | MAWPS | TabMWP | MathQA | MMLU-STEM | SAT | AVG |"
    assert "| n/a |" in table


@pytest.mark.slow
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
    ("(A) is wrong and (B) too; so the answer is (D)", "D"),
    ("The correct choice is b, since 4 > 3.", "B"),
    ("So the answer is (C).\n\nProblem:\nWhich is it?\nThe answer is (D).", "C"),  # text after "Problem:" is cut
    ("The answer is (B), not (A); the answer is (C).", "B"),  # the first one, as the harness reads it
    ("... = 855 answer : option d", ""),  # harness: only "answer is" counts
    ("(A) 1, (B) 2, (C) 3, (D) 4: I would pick (D)", ""),  # a stray "(D)" is no answer
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
    ("18.001", "18", True),  # harness: isclose(reference, prediction, rel_tol=1e-4)
    ("17", "18", False),
    ("0.25", "25", True),  # harness: percentage leniency
    ("x^2+2x+1", "(x+1)^2", True),
    ("", "0", False),
    ("Purple", "purple", True),
])
def test_equivalence(prediction, reference, equal):
    assert is_equivalent(normalize_answer(prediction), normalize_answer(reference)) is equal


@pytest.mark.parametrize("prediction, reference", [
    ("17.6", "18"),  # a rounded number is not the integer answer
    ("18.004", "18"),
    ("3.14", "3.14159"),
    ("0.33", "\\frac{1}{3}"),
    ("x(x+2)", "x(x+1)"),  # a different factor in parentheses
    ("2x", "2x(15x^2-4x+10)"),  # a truncated expression
    ("2x(15x^2-4x+11)", "2x(15x^2-4x+10)"),
])
def test_near_misses_are_graded_wrong(prediction, reference):
    assert not is_equivalent(normalize_answer(prediction), normalize_answer(reference))


def test_wrong_or_missing_letters_are_graded_wrong():
    (example,) = [e for e in load_benchmark("mathqa", SHIPPED_DATA) if e.gold == "C"][:1]
    for output in ("The answer is (B).", "Options (A), (B) and (C) are listed; none is chosen.", ""):
        assert not is_equivalent(example.extract(output), example.gold), output
    assert is_equivalent(example.extract("So the answer is (c)."), example.gold)


def test_parenthesised_parts_of_answers_are_kept():
    assert normalize_answer("2x(15x^2-4x+10)") == "2x(15x^2-4x+10)"
    assert normalize_answer("f(x)") == "f(x)" and normalize_answer("9 (apples)") == "9"
    from vocagno.eval.benchmarks import read_test_split
    from vocagno.eval.grading import last_boxed

    boxed = [last_boxed(row["solution"]) for row in read_test_split(SHIPPED_DATA, "math500")]
    grouped = [b for b in boxed if re.search(r"\([^()]*[0-9+\-*/^\\][^()]*\)\s*$", b)]  # "(1,2)", "x(x+1)"
    assert len(grouped) > 10 and all(normalize_answer(b).endswith(")") for b in grouped)


def test_every_multiple_choice_prompt_lists_its_options():
    """Option strings as the datasets write them ("a ) 1 , b ) 2", Python lists, "A) 1 B) 2", "A. 1 B. 2") all reach
    the prompt, rewritten as the harness's parse_question does."""
    for name in ("mathqa", "mmlu_stem", "sat_math"):
        for example in load_benchmark(name, SHIPPED_DATA):
            options = example.question.split("What of the following is the right choice? Explain your answer.\n")[1]
            assert options.startswith("(A") and ("B)" in options or "B." in options), (name, example.index)
            assert example.prompt.endswith(f"Problem:\n{example.question}\nSolution:")


def test_prompts_are_the_harness_files():
    math = load_benchmark("math", SHIPPED_DATA)
    assert len(math) == 500  # harness math_oai: MATH-500, not all 5,000 problems
    prompt = math[0].prompt
    assert prompt.startswith("Problem:\nFind the domain of the expression $\\\\frac{\\\\sqrt{x-2}}{\\\\sqrt{5-x}}$.}\n")
    assert prompt.count("\n\n\nProblem:\n") == 4
    mathqa = load_benchmark("mathqa", SHIPPED_DATA)[0].prompt
    assert "Explain your answer (a little concise).\n(A) 30, (B) 60" in mathqa  # the harness's exemplars as written
    assert "$$x2 - y2 = 16(x - y)$$" in mathqa


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
    assert set(results) == {"gsm8k", "math", "partial"} and all(0 <= results[b] <= 100 for b in ("gsm8k", "math"))
    for name in ("gsm8k", "math"):
        rows = [json.loads(line) for line in open(out / f"{name}.jsonl")]
        assert [r["index"] for r in rows] == [0, 1, 2, 3]
        assert all(r["output"] and set(r) >= {"question", "predicted", "gold", "correct"} for r in rows)
    assert "| GSM8K | MATH | AVG |" in (out / "results.md").read_text()


def test_scores_of_a_limit_a_short_generation_or_overlong_prompts_are_marked_partial(tmp_path, tokenizers, capsys):
    model_dir = tmp_path / "model"
    tiny_llama(max_positions=128).save_pretrained(model_dir)  # GSM8K's 8-shot prompts are ~900 tokens
    tokenizers["llama2"].save_pretrained(model_dir)
    (tmp_path / "held.jsonl").write_text(json.dumps({"content": "Natalia sold 48 clips in April."}) + "\n")
    out = tmp_path / "out"
    assert main(["--model", str(model_dir), "--benchmarks", "gsm8k", "--limit", "2", "--max-new-tokens", "6",
                 "--output", str(out), "--device", "cpu", "--bpb", str(tmp_path / "held.jsonl"),
                 "--bpb-field", "content"]) == 0
    results = json.loads((out / "results.json").read_text())
    why = ("the first 2 of 1,319 questions (--limit); --max-new-tokens 6 (the protocol's: 1024); 2 of 2 prompts with "
           "their outputs reached the model's 128 positions")
    assert results["partial"] == {"gsm8k": why} and 0 <= results["gsm8k"] <= 100
    assert results["bits_per_byte"]["file"] == str(tmp_path / "held.jsonl") and results["bits_per_byte"]["value"] > 1
    captured = capsys.readouterr()
    assert f"warning: GSM8K is scored partially, not as the benchmark is: {why}" in captured.err
    assert "bits per byte on " in captured.out and re.search(r"bits per byte: 100%.*\| 1/1 ", captured.err)
    table = (out / "results.md").read_text()  # the model card (vocagno.export --eval) shows this table
    assert f"| {results['gsm8k']:.1f}* | {results['gsm8k']:.1f}* |" in table
    assert f"<p>* partial, not the benchmark's score: GSM8K: {why}</p>" in rendered(table)
    assert f"\\* partial, not the benchmark's score: GSM8K: {why}" in captured.out  # the terminal's, unescaped


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


class RunsACommand:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_crafted_checkpoint_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"state": {"model": {}, "x": RunsACommand(marker)}}, tmp_path / "evil.pt")
    with pytest.raises(ValueError, match="evil.pt: refused to load"):
        load_model(str(tmp_path / "evil.pt"), "cpu")
    assert not marker.exists()


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


def test_a_document_longer_than_the_positions_is_scored_in_windows_with_half_a_window_of_context(tokenizers,
                                                                                                 math_texts):
    class Recording(Uniform):
        def forward(self, input_ids):
            windows.append(input_ids[0].tolist())
            return super().forward(input_ids)

    windows, tokenizer = [], tokenizers["llama2"]
    text = math_texts[0]
    tokens = [tokenizer.bos_token_id] + tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(tokens) > 40
    bits_per_byte(Recording(len(tokenizer), max_positions=16), tokenizer, [text])
    assert windows[0] == tokens[:16]  # the first window: all of its tokens scored
    ends = [16 + 8 * k for k in range(1, len(windows))]
    ends[-1] = len(tokens)  # the last window ends at the text's end
    assert [w for w in windows[1:]] == [tokens[end - 16:end] for end in ends]  # 16 tokens, 8 of them context at least
    assert len(windows) == 1 + -(-(len(tokens) - 16) // 8)


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
    metric.update({"token_bytes": token_bytes, "special_tokens": torch.zeros(2, 5, dtype=torch.bool)}, logits, labels)
    predicted_bytes = 2 + 3 + 1 + 4 + 5 + 6  # the tokens labels point at: positions 1.. of each row
    assert metric.compute().item() == pytest.approx(6 * math.log2(100) / predicted_bytes)


@pytest.mark.parametrize("student, text", [
    ("llama2", "x 😀 y"),  # the emoji is four byte-fallback pieces, each spanning the whole character
    ("llama2", "Résumé of 𝔽: ∫x²dx = x³/3 — done 😀👍🏽 and Ω≈Ω. Write </s> to end."),
    ("deepseek-llm", "Byte-level BPE: 中文 😀👍🏽 and x²; <｜end▁of▁sentence｜> is text here."),
])
def test_bits_per_byte_metric_agrees_with_the_function_on_the_same_text(tokenizers, student, text):
    """A one-document row through the converter's packing and the collator, scored by the metric, gives what
    bits_per_byte gives for the document: every byte counted once, the separator not scored."""
    from vocagno.conversion.packer import Encoder, Packer
    from vocagno.data.dataset import TeacherGuidedCollator
    from vocagno.data.shards import tokenizer_info

    tokenizer = tokenizers[student]
    info, teacher = tokenizer_info(tokenizer, student), tokenizer_info(tokenizers["qwen2.5"], "qwen2.5")
    encoded = Encoder(tokenizer, tokenizers["qwen2.5"]).encode([[text]])
    length = len(encoded.student_ids) + 1 + (info.bos_id is not None)  # the document, its separator, a BOS
    (sample,) = Packer(length, info, teacher).add(encoded)
    batch = TeacherGuidedCollator(0, 0)([{k: torch.from_numpy(v.astype("int64")) if k != "text" else v
                                          for k, v in sample.items()}])
    assert batch["token_bytes"].sum() == len(text.encode("utf-8"))
    model = tiny_llama(64) if student == "llama2" else LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64))
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"]).logits
    metric = BitsPerByte()
    shifted = torch.cat([batch["labels"][:, 1:], torch.full((1, 1), -100)], dim=1)  # as HuggingFaceModel passes them
    metric.update(batch, logits, shifted)
    assert metric.compute().item() == pytest.approx(bits_per_byte(model, tokenizer, [text]), abs=1e-4)


def test_bits_per_byte_refuses_a_stride_that_scores_nothing_new(tokenizers):
    with pytest.raises(ValueError, match="stride must be in \\[1, max_length\\).*stride=16, max_length=16"):
        bits_per_byte(tiny_llama(64), tokenizers["llama2"], ["some text"], max_length=16, stride=16)


def test_prompts_keep_special_token_strings_as_text():
    from vocagno.eval.__main__ import generate
    from vocagno.core.tokenization import load_tokenizer

    tokenizer = load_tokenizer("llama2")  # generate() sets padding on it: not the session's shared one
    model, seen = tiny_llama(64), []
    model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["input_ids"]), with_kwargs=True)
    generate(model, tokenizer, ["Question: what do </s> and <s> mean in a prompt?\nAnswer:"], 1, 1, "test")
    prompt = seen[0][0].tolist()
    assert prompt[0] == tokenizer.bos_token_id and tokenizer.eos_token_id not in prompt
    assert tokenizer.bos_token_id not in prompt[1:]


def test_generation_length_defaults_to_the_harness_1024_tokens(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "the harness's --max_tokens_per_call (default: 1024)" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("args, message", [
    (["--gold", "--limit", "-5"], "--limit must be 0 (all) or a positive number"),
    (["--gold", "--batch-size", "0"], "--batch-size and --max-new-tokens must be positive"),
    (["--gold", "--data-dir", "no/such/folder"], "--data-dir no/such/folder is not a folder"),
    (["--model", "m", "--bpb", "EMPTY"], "holds no text"),
    (["--model", "m", "--bpb", "no/such.jsonl"], "--bpb no/such.jsonl is not a file"),
])
def test_bad_arguments_are_refused_with_a_message(args, message, tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("\n")
    args = [str(tmp_path / "empty.jsonl") if a == "EMPTY" else a for a in args]
    with pytest.raises(SystemExit) as exit:
        main(args)
    assert exit.value.code == 2 and message in capsys.readouterr().err


def test_bpb_reads_what_the_converter_reads_and_refuses_what_it_would_skip(tmp_path, capsys):
    """``--bpb`` reads a file as the converter reads a corpus (``vocagno.conversion.sources``): a gzipped or
    zstd-compressed .jsonl, a .parquet and a .txt give the same texts; a record without the field, a file that can't be
    read to its end or of a type the converter doesn't read is refused in one line that says what to do."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    from vocagno.eval.__main__ import _read_texts

    from vocagno.core.tokenization import ASSETS

    texts = [json.loads(line)["text"] for line in open(ASSETS / "text" / "gsm8k_train_500.jsonl", encoding="utf-8")][:5]
    lines = "".join(json.dumps({"id": i, "body": t}) + "\n" for i, t in enumerate(texts)).encode()
    (tmp_path / "held.jsonl.gz").write_bytes(gzip.compress(lines))
    (tmp_path / "held.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
    pq.write_table(pa.Table.from_pylist([{"id": i, "body": t} for i, t in enumerate(texts)]), tmp_path / "held.parquet")
    for name in ("held.jsonl.gz", "held.jsonl.zst", "held.parquet"):
        assert _read_texts(tmp_path / name, "body") == texts, name
    (tmp_path / "one.txt").write_text(texts[0], encoding="utf-8")
    assert _read_texts(tmp_path / "one.txt") == [texts[0]]

    def refusal(*args):
        with pytest.raises(SystemExit) as exit:
            main(["--model", "m", "--bpb", *map(str, args)])
        error = capsys.readouterr().err.strip().splitlines()
        assert exit.value.code == 2 and len(error) == 1 and error[0].startswith("error: --bpb "), error
        return error[0]

    for name in ("held.jsonl.gz", "held.parquet"):  # the field misnamed: the record's fields and the flag
        assert refusal(tmp_path / name).endswith(f"--bpb {tmp_path / name}: refused: document 1: missing text field "
                                                 "'text' (its fields: id, body): name the text's field with --bpb-field")
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(lines)[:60])
    assert f"--bpb {tmp_path / 'cut.jsonl.gz'}: refused: EOFError: " in refusal(tmp_path / "cut.jsonl.gz", "--bpb-field",
                                                                                 "body")
    (tmp_path / "lone.jsonl").write_text('{"text": "a lone surrogate \\ud800 here"}\n')
    assert refusal(tmp_path / "lone.jsonl").endswith("document 1: a lone surrogate (a JSON escape of U+D800 to U+DFFF, "
                                                     "no character): bits per byte are of the text as written")
    (tmp_path / "held.csv").write_text("id,body\n")
    assert "held.csv: unsupported file type (use .jsonl, .json, .parquet, .arrow, .txt, or .gz/.zst)" in refusal(
        tmp_path / "held.csv")


def test_nothing_evaluated_is_a_failure(tmp_path):
    (tmp_path / "data").mkdir()
    assert main(["--gold", "--data-dir", str(tmp_path / "data"), "--benchmarks", "gsm8k,math",
                 "--output", str(tmp_path / "out")]) == 1


def rendered(markdown: str) -> str:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable("table").render(markdown)


# One-line reasons that checked_partial lets through (printable, no "|"), each of which would be markup if written raw.
MARKUP = ["<img src=x onerror=alert(1)>", "[x](javascript:alert(1))", "**b** `c` ~~s~~ _i_", "&lt;b&gt; &#60;",
          "# not a heading", "\\* \\_ ``` end \\x1b", "![i](http://x/i.png)"]


@pytest.mark.parametrize("why", MARKUP)
def test_the_results_table_shows_a_partial_reason_as_its_characters_alone(why):
    import html

    from vocagno.shown import terminal
    from vocagno.eval.__main__ import table

    page = rendered(table({"gsm8k": 12.5, "svamp": 50.0, "partial": {"gsm8k": why}}))
    assert page.count("<table>") == 1 and page.count("<th>") == 3 and page.count("<td>") == 3, page
    below = page.split("</table>")[1].strip()
    assert re.fullmatch("<p>(.*)</p>", below) and "<" not in below[3:-4], below  # one paragraph, no element in it
    # as the terminal shows it: a backslash written is shown doubled, never read as an escape
    assert html.unescape(below[3:-4]) == f"* partial, not the benchmark's score: GSM8K: {terminal(why)}"


def test_an_honest_results_table_reads_as_before():
    from vocagno.eval.__main__ import table

    why = "the first 2 of 1,319 questions (--limit)"
    assert rendered(table({"gsm8k": 12.5, "svamp": 50.0, "partial": {"gsm8k": why}})).endswith(
        f"<p>* partial, not the benchmark's score: GSM8K: {why}</p>\n")


def test_a_results_json_key_that_vocagno_eval_does_not_write_is_refused_naming_it():
    from vocagno.doors.untrusted import UntrustedFile
    from vocagno.eval.benchmarks import checked_results

    honest = {"gsm8k": 10.0, "math": 12, "tabmwp": "unavailable: no tabmwp/test.jsonl",
              "partial": {"gsm8k": "the first 2 of 1,319 questions (--limit)"},
              "bits_per_byte": {"file": "held.jsonl", "texts": 2, "value": 1.2}}
    assert checked_results(honest, "e/results.json") == {"gsm8k": 10.0, "math": 12.0}
    for key, value in (("bogus", 1500.0), ("GSM8K", 10.0), ("avg", 99.0)):
        with pytest.raises(UntrustedFile) as refused:
            checked_results({**honest, key: value}, "e/results.json")
        message = str(refused.value)
        assert "\n" not in message and message.startswith("e/results.json: refused: ") and repr(key) in message
        assert "gsm8k" in message and "partial" in message and "bits_per_byte" in message  # what is accepted
    for value in (True, 1500.0, -1.0, float("nan"), [1], None):
        with pytest.raises(UntrustedFile, match="e/results.json: refused: .*'gsm8k'"):
            checked_results({**honest, "gsm8k": value}, "e/results.json")
