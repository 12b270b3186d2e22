"""The nine benchmarks of the paper's Table 1: loading, few-shot chain-of-thought prompts, gold answers.

The protocol is the math evaluation harness's (github.com/ZubinGou/math-evaluation-harness, MIT), which Rho-1 and
ProX used and VocAgnoLM follows:
- Prompts: the harness's own files, shipped verbatim in ``vocagno/assets/benchmarks/prompts`` (doubled backslashes,
  the stray "}" after Minerva's first problem and all), read as ``load_prompt`` does: ``.strip() + "\n\n\n"``.
  GSM8K, SVAMP, ASDiv, MAWPS, TabMWP: ``gsm8k.md`` (8-shot, Wei et al., 2022), query "Question: ...\nAnswer:";
  MATH: ``minerva_math.md`` (4-shot Minerva), MathQA: ``mathqa.md``, MMLU-STEM and SAT: ``mmlu_stem.md``, query
  "Problem:\n...\nSolution:" (harness ``utils.construct_prompt``, "cot").
- MATH is the harness's 500-problem split (``math_oai``, OpenAI's MATH-500, Table 1's "MATH†"), not all 5,000.
- Greedy decoding, up to 1,024 new tokens (``--max_tokens_per_call``); generation stops at "\n\nQuestion:",
  "\n\nProblem:" or the model's EOS (harness ``math_eval.py``, stop words of "cot").
- Questions as the harness builds them (``parser.parse_question``): SVAMP is Body + "." + Question, ASDiv body +
  question, the multiple-choice sets the question, "What of the following is the right choice? Explain your
  answer." and the options as the dataset writes them, rewritten as the harness does; gold answers as
  ``parser.parse_ground_truth``: GSM8K after "####", MATH the last \\boxed{} of the solution, ASDiv without its
  "(...)" groups, SVAMP/MAWPS the number.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from vocagno.eval.grading import extract_answer, extract_choice, last_boxed, normalize_answer
from vocagno.doors.untrusted import UntrustedFile, cap, decompress, read_bytes

__all__ = [
    "BENCHMARKS", "TITLES", "Example", "load_benchmark", "read_test_split", "STOP_SEQUENCES", "BenchmarkUnavailable",
    "SHIPPED_DATA", "checked_partial", "checked_results", "RESULTS_KEYS",
]

BENCHMARKS = ("gsm8k", "math", "svamp", "asdiv", "mawps", "tabmwp", "mathqa", "mmlu_stem", "sat_math")
TITLES = {"gsm8k": "GSM8K", "math": "MATH", "svamp": "SVAMP", "asdiv": "ASDiv", "mawps": "MAWPS", "tabmwp": "TabMWP",
          "mathqa": "MathQA", "mmlu_stem": "MMLU-STEM", "sat_math": "SAT"}
STOP_SEQUENCES = ("\n\nQuestion:", "\n\nProblem:")
MAX_NEW_TOKENS = 1024  # harness: --max_tokens_per_call
SHIPPED_DATA = Path(__file__).resolve().parent.parent / "assets" / "benchmarks"
CHOICE_INSTRUCTION = "What of the following is the right choice? Explain your answer."


@functools.cache
def _demos(name: str) -> str:
    """harness ``load_prompt``: a prompt file, stripped, and three newlines (read once, not once per question)."""
    return (SHIPPED_DATA / "prompts" / f"{name}.md").read_text(encoding="utf-8").strip() + "\n\n\n"


def _prompt(demos: str, query: str) -> str:
    """harness ``construct_prompt``: the demo file's text, then the query."""
    return _demos(demos) + query


def _question_answer(question: str) -> str:
    return _prompt("gsm8k", f"Question: {question}\nAnswer:")


def _problem_solution(demos: str, problem: str) -> str:
    return _prompt(demos, f"Problem:\n{problem}\nSolution:")


def _mathqa_question(row: dict) -> str:
    """harness ``parse_question`` for mathqa: "a ) 12 , b ) 16" becomes "(A) 12, (B) 16" (a Python-list string is
    joined first; ``ast.literal_eval`` where the harness calls ``eval``)."""
    problem = row["problem"][0].upper() + row["problem"][1:]
    options = row["options"].strip()
    if options.startswith("["):
        options = ", ".join(ast.literal_eval(options))
    for ch in "abcde":
        if f"{ch} ) " in options:
            options = options.replace(f"{ch} ) {ch} ) ", f"{ch} ) ").replace(f"{ch} ) ", f"({ch.upper()}) ")
    options = options.replace(" , ", ", ")
    return f"{problem.strip()}\n{CHOICE_INSTRUCTION}\n{options.strip()}"


def _sat_question(row: dict) -> str:
    """harness ``parse_question`` for sat_math: "A) 1 B) 2" becomes "(A) 1 (B) 2"; other formats stay as written."""
    options = "(" + row["options"].strip()
    for ch in "BCD":
        options = options.replace(f" {ch}) ", f" ({ch}) ")
    return f"{row['question'].strip()}\n{CHOICE_INSTRUCTION}\n{options.strip()}"


def _mmlu_question(row: dict) -> str:
    options = ", ".join(f"({label}) {str(option).strip()}" for label, option in zip("ABCD", row["choices"]))
    return f"{row['question'].strip()}\n{CHOICE_INSTRUCTION}\n{options}"


@dataclass
class Example:
    """One benchmark question: the prompt, the gold answer (normalized), and the text a perfect model would write
    under this prompt (the dataset's own solution where it has one), which ``--gold`` grades."""

    benchmark: str
    index: int
    question: str
    prompt: str
    gold: str
    gold_output: str
    multiple_choice: bool = False
    extra: dict = field(default_factory=dict)

    def extract(self, output: str) -> str:
        return extract_choice(output) if self.multiple_choice else extract_answer(output)


# results.json's keys besides the benchmarks': why a score is partial (by benchmark), the --bpb figure.
PARTIAL, BITS_PER_BYTE = "partial", "bits_per_byte"
RESULTS_KEYS = (*BENCHMARKS, PARTIAL, BITS_PER_BYTE)


def checked_partial(results: dict, source: str) -> dict[str, str]:
    """``results.json``'s ``partial`` (``python -m vocagno.eval``'s: why a benchmark's score is partial, one printable
    line each), {} where the scores are whole; anything else is refused (``UntrustedFile``): a model card and a
    report quote these lines."""
    partial = results.get(PARTIAL) or {}
    if not isinstance(partial, dict) or not all(
            name in BENCHMARKS and isinstance(why, str) and len(why) <= 500 and why.isprintable() and "|" not in why
            for name, why in partial.items()):
        raise UntrustedFile(f"{source}: refused: its partial is not vocagno.eval's (benchmarks to one-line reasons)")
    return partial


def checked_results(results: dict, source: str) -> dict[str, float]:
    """The accuracies (%) of ``results.json`` as ``python -m vocagno.eval`` writes it: its benchmarks' numbers, each in
    [0, 100]; a benchmark that did not run is a string (why), ``partial`` and ``bits_per_byte`` are not scores. A key
    it does not write, or a benchmark's value that is no accuracy, is refused (``UntrustedFile``, naming the key, the
    file and what is accepted): a report's or a card's average is over the benchmarks it shows, and a number under
    another name would be shown nowhere and counted nowhere, silently."""
    scores = {}
    for key, value in results.items():
        if key not in RESULTS_KEYS:
            raise UntrustedFile(f"{source}: refused: its key {_named(key)} is none of vocagno.eval's (accepted: the "
                                f"benchmarks {', '.join(BENCHMARKS)}; {PARTIAL}; {BITS_PER_BYTE})")
        if key in BENCHMARKS and not isinstance(value, str):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
                raise UntrustedFile(f"{source}: refused: its {key!r} is {_named(value)}, not an accuracy (a number "
                                    "of 0 to 100, or a string: why it was not evaluated)")
            scores[key] = float(value)
    if not isinstance(results.get(BITS_PER_BYTE, {}), dict):
        raise UntrustedFile(f"{source}: refused: its {BITS_PER_BYTE} is not vocagno.eval's (a mapping)")
    checked_partial(results, source)
    return scores


def _named(value: object) -> str:
    """A value from a file, named in a message: its repr, cut at 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


class BenchmarkUnavailable(Exception):
    """A requested benchmark's data can't be had here (TabMWP offline, a missing file): said in the results."""



def read_test_split(data_dir: Path, name: str) -> list[dict]:
    """``DATA_DIR/NAME/test.jsonl``, or its xz-compressed ``test.jsonl.xz`` (as shipped in ``vocagno/assets``)."""
    path = data_dir / name / "test.jsonl"
    packed = path.with_suffix(".jsonl.xz")
    if os.path.lexists(path):  # within DATA_DIR: a linked benchmark folder leads nowhere else
        data = read_bytes(f"{name}/{path.name}", folder=data_dir, cap_name="json_bytes")
    elif os.path.lexists(packed):
        data = decompress("xz", read_bytes(f"{name}/{packed.name}", folder=data_dir, cap_name="json_bytes"),
                          cap("json_bytes"), str(packed), exact=False)
    else:
        raise BenchmarkUnavailable(f"{path} does not exist")
    rows = []
    for number, line in enumerate(data.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError:  # UnicodeDecodeError too
                raise UntrustedFile(f"{path}: refused: line {number} is not JSON in UTF-8") from None
    return rows


def _number(value) -> str:
    return normalize_answer(f"{float(value):.6f}".rstrip("0").rstrip("."))


def load_benchmark(name: str, data_dir: str | Path) -> list[Example]:
    data_dir = Path(data_dir)
    if name == "gsm8k":
        out = []
        for i, row in enumerate(read_test_split(data_dir, name)):
            solution, answer = row["answer"].split("####")
            worked = re.sub(r"<<.*?>>", "", solution).strip()  # the calculator annotations are no model's text
            out.append(Example(name, i, row["question"], _question_answer(row["question"]), normalize_answer(answer),
                               f" {worked}\nThe answer is {answer.strip()}."))
        return out
    if name == "math":
        out = []
        for i, row in enumerate(read_test_split(data_dir, "math500")):  # harness math_oai: MATH-500, Table 1's MATH
            gold = last_boxed(row["solution"]) or ""
            out.append(Example(name, i, row["problem"], _problem_solution("minerva_math", row["problem"]),
                               normalize_answer(gold),
                               f"\n{row['solution']}",
                               extra={"level": row.get("level"), "type": row.get("type")}))
        return out
    if name == "svamp":
        out = []
        for i, row in enumerate(read_test_split(data_dir, name)):
            body = row["Body"].strip()
            question = f"{body if body.endswith('.') else body + '.'} {row['Question'].strip()}"
            answer = _number(row["Answer"])
            out.append(Example(name, i, question, _question_answer(question), answer,
                               f" {row['Equation'].strip()} = {row['Answer']}. The answer is {row['Answer']}."))
        return out
    if name == "asdiv":
        out = []
        for i, row in enumerate(read_test_split(data_dir, name)):
            question = f"{row['body'].strip()} {row['question'].strip()}"
            gold = re.sub(r"\(.*?\)", "", row["answer"])  # harness parse_ground_truth: "9 (apples)" -> "9"
            out.append(Example(name, i, question, _question_answer(question), normalize_answer(gold),
                               f" {row['formula']}. The answer is {gold.strip()}."))  # as the exemplars end
        return out
    if name == "mawps":
        return [
            Example(name, i, row["input"], _question_answer(row["input"]), _number(row["target"]),
                    f" The answer is {row['target']}.", extra={"type": row.get("type")})
            for i, row in enumerate(read_test_split(data_dir, name))
        ]
    if name == "tabmwp":
        return _load_tabmwp(data_dir)
    if name == "mathqa":
        out = []
        for i, row in enumerate(read_test_split(data_dir, name)):
            letter = row["correct"].upper()
            rationale = row["rationale"].strip('"')
            question = _mathqa_question(row)
            out.append(Example(name, i, question, _problem_solution("mathqa", question), letter,
                               f"\n{rationale}\nFinal Answer: The final answer is ({letter}).",
                               multiple_choice=True))
        return out
    if name == "mmlu_stem":
        out = []
        for i, row in enumerate(read_test_split(data_dir, name)):
            letter = "ABCD"[row["answer"]]
            question = _mmlu_question(row)
            out.append(Example(name, i, question, _problem_solution("mmlu_stem", question), letter,
                               f"\nFinal Answer: The final answer is ({letter}).", multiple_choice=True,
                               extra={"type": row.get("type")}))
        return out
    if name == "sat_math":
        out = []
        for i, row in enumerate(read_test_split(data_dir, name)):
            letter = row["Answer"].strip().upper()
            question = _sat_question(row)
            out.append(Example(name, i, question, _problem_solution("mmlu_stem", question), letter,
                               f"\nFinal Answer: The final answer is ({letter}).", multiple_choice=True))
        return out
    raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")


def _load_tabmwp(data_dir: Path) -> list[Example]:
    """TabMWP (Lu et al., 2023) test split: a local ``tabmwp/test.jsonl`` if there is one, else the Hugging Face hub.
    Not offline here; when neither can be had, ``BenchmarkUnavailable`` says why."""
    try:
        rows = read_test_split(data_dir, "tabmwp")
    except BenchmarkUnavailable:
        try:
            import datasets

            # The harness's 1,000-problem test sample as published on the hub; its schema (PromptPG's fields) is
            # assumed, not checked offline.
            rows = list(datasets.load_dataset("Arietem/tabmwp", data_files="tabmwp.jsonl", split="train"))
        except Exception as error:
            raise BenchmarkUnavailable(f"no {data_dir}/tabmwp/test.jsonl and the hub is out of reach: {error}") from error
    out = []
    for i, row in enumerate(rows):
        title = f'regarding "{row["table_title"]}" ' if row.get("table_title") else ""
        question = f"Read the following table {title}and answer a question:\n{row['table']}\n{row['question']}"
        if row.get("choices"):
            question += f" Please select from the following options: {row['choices']}"
        answer = str(row["answer"])
        out.append(Example("tabmwp", i, question, _question_answer(question), normalize_answer(answer),
                           f" {row.get('solution', '')}\nThe answer is {answer}."))
    return out
