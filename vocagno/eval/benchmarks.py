"""The nine benchmarks of the paper's Table 1: loading, few-shot chain-of-thought prompts, gold answers.

The protocol is the math evaluation harness's (github.com/ZubinGou/math-evaluation-harness, MIT), which Rho-1 and
ProX used and VocAgnoLM follows:
- GSM8K, SVAMP, ASDiv, MAWPS, TabMWP: the 8-shot GSM8K chain-of-thought exemplars of Wei et al. (2022), harness
  ``prompts/cot/gsm8k.md``; the query is "Question: ...\\nAnswer:" (harness ``utils.construct_prompt``, "cot").
- MATH: the 4-shot Minerva prompt (Lewkowycz et al., 2022), harness ``prompts/cot/minerva_math.md``; the query is
  "Problem:\\n...\\nSolution:". The harness file stores the exemplars with doubled backslashes and a stray "}" after
  the first problem; we use the exemplars as Minerva published them.
- MathQA: the harness's 4-shot ``prompts/cot/mathqa.md``; MMLU-STEM and SAT: its 4-shot ``prompts/cot/mmlu_stem.md``
  (the Minerva problems as multiple choice). Options are listed "(A) ..., (B) ...".
- Greedy decoding; generation stops at "\\n\\nQuestion:", "\\n\\nProblem:" or the model's EOS (harness
  ``math_eval.py``, stop words of "cot").
- Questions as the harness builds them (``parser.parse_question``): SVAMP is Body + "." + Question, ASDiv body +
  question; gold answers as ``parser.parse_ground_truth``: GSM8K after "####", MATH the last \\boxed{} of the
  solution, ASDiv without its "(unit)", SVAMP/MAWPS the number.
"""

from __future__ import annotations

import json
import lzma
import re
from dataclasses import dataclass, field
from pathlib import Path

from vocagno.eval.grading import extract_answer, extract_choice, last_boxed, normalize_answer

__all__ = [
    "BENCHMARKS", "TITLES", "Example", "load_benchmark", "read_test_split", "STOP_SEQUENCES", "BenchmarkUnavailable",
    "SHIPPED_DATA",
]

BENCHMARKS = ("gsm8k", "math", "svamp", "asdiv", "mawps", "tabmwp", "mathqa", "mmlu_stem", "sat_math")
TITLES = {"gsm8k": "GSM8K", "math": "MATH", "svamp": "SVAMP", "asdiv": "ASDiv", "mawps": "MAWPS", "tabmwp": "TabMWP",
          "mathqa": "MathQA", "mmlu_stem": "MMLU-STEM", "sat_math": "SAT"}
STOP_SEQUENCES = ("\n\nQuestion:", "\n\nProblem:")

GSM8K_EXEMPLARS = [
    ("There are 15 trees in the grove. Grove workers will plant trees in the grove today. After they are done, there "
     "will be 21 trees. How many trees did the grove workers plant today?",
     "There are 15 trees originally. Then there were 21 trees after some more were planted. So there must have been "
     "21 - 15 = 6. The answer is 6."),
    ("If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are in the parking lot?",
     "There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5. The answer is 5."),
    ("Leah had 32 chocolates and her sister had 42. If they ate 35, how many pieces do they have left in total?",
     "Originally, Leah had 32 chocolates. Her sister had 42. So in total they had 32 + 42 = 74. After eating 35, they "
     "had 74 - 35 = 39. The answer is 39."),
    ("Jason had 20 lollipops. He gave Denny some lollipops. Now Jason has 12 lollipops. How many lollipops did Jason "
     "give to Denny?",
     "Jason started with 20 lollipops. Then he had 12 after giving some to Denny. So he gave Denny 20 - 12 = 8. The "
     "answer is 8."),
    ("Shawn has five toys. For Christmas, he got two toys each from his mom and dad. How many toys does he have now?",
     "Shawn started with 5 toys. If he got 2 toys each from his mom and dad, then that is 4 more toys. 5 + 4 = 9. The "
     "answer is 9."),
    ("There were nine computers in the server room. Five more computers were installed each day, from monday to "
     "thursday. How many computers are now in the server room?",
     "There were originally 9 computers. For each of 4 days, 5 more computers were added. So 5 * 4 = 20 computers "
     "were added. 9 + 20 is 29. The answer is 29."),
    ("Michael had 58 golf balls. On tuesday, he lost 23 golf balls. On wednesday, he lost 2 more. How many golf balls "
     "did he have at the end of wednesday?",
     "Michael started with 58 golf balls. After losing 23 on tuesday, he had 58 - 23 = 35. After losing 2 more, he "
     "had 35 - 2 = 33 golf balls. The answer is 33."),
    ("Olivia has $23. She bought five bagels for $3 each. How much money does she have left?",
     "Olivia had 23 dollars. 5 bagels for 3 dollars each will be 5 x 3 = 15 dollars. So she has 23 - 15 dollars left. "
     "23 - 15 is 8. The answer is 8."),
]

# (problem, solution, final answer, choices for the multiple-choice version, letter)
MINERVA_EXEMPLARS = [
    ("Find the domain of the expression $\\frac{\\sqrt{x-2}}{\\sqrt{5-x}}$.",
     "The expressions inside each square root must be non-negative. Therefore, $x-2 \\ge 0$, so $x\\ge2$, and "
     "$5 - x \\ge 0$, so $x \\le 5$. Also, the denominator cannot be equal to zero, so $5-x>0$, which gives $x<5$. "
     "Therefore, the domain of the expression is $\\boxed{[2,5)}$.",
     "[2,5)", ["[-5,-2)", "[2,5)", "[-2,-5)", "[5,2)"], "B"),
    ("If $\\det \\mathbf{A} = 2$ and $\\det \\mathbf{B} = 12,$ then find $\\det (\\mathbf{A} \\mathbf{B}).$",
     "We have that $\\det (\\mathbf{A} \\mathbf{B}) = (\\det \\mathbf{A})(\\det \\mathbf{B}) = (2)(12) = "
     "\\boxed{24}.$",
     "24", ["14", "4", "2", "24"], "D"),
    ("Terrell usually lifts two 20-pound weights 12 times. If he uses two 15-pound weights instead, how many times "
     "must Terrell lift them in order to lift the same total weight?",
     "If Terrell lifts two 20-pound weights 12 times, he lifts a total of $2\\cdot 12\\cdot20=480$ pounds of weight. "
     "If he lifts two 15-pound weights instead for $n$ times, he will lift a total of $2\\cdot15\\cdot n=30n$ pounds "
     "of weight. Equating this to 480 pounds, we can solve for $n$: \\begin{align*}\n30n&=480\\\\\n\\Rightarrow\\qquad "
     "n&=480/30=\\boxed{16}\n\\end{align*}",
     "16", ["12", "20", "16", "15"], "C"),
    ("If the system of equations\n\n\\begin{align*}\n6x-4y&=a,\\\\\n6y-9x &=b.\n\\end{align*}has a solution $(x, y)$ "
     "where $x$ and $y$ are both nonzero, find $\\frac{a}{b},$ assuming $b$ is nonzero.",
     "If we multiply the first equation by $-\\frac{3}{2}$, we obtain\n\n$$6y-9x=-\\frac{3}{2}a.$$Since we also know "
     "that $6y-9x=b$, we have\n\n$$-\\frac{3}{2}a=b\\Rightarrow\\frac{a}{b}=\\boxed{-\\frac{2}{3}}.$$",
     "-\\frac{2}{3}", ["$-\\frac{2}{3}$", "$\\frac{2}{3}$", "$\\frac{1}{3}$", "$\\frac{4}{9}$"], "A"),
]

# harness prompts/cot/mathqa.md: (problem, options, solution, letter); solutions shortened to their reasoning.
MATHQA_EXEMPLARS = [
    ("An old man distributed all the gold coins he had to his two sons into two different numbers such that the "
     "difference between the squares of the two numbers is 16 times the difference between the two numbers . how "
     "many coins did the old man have ?", ["24", "26", "30", "16", "40"],
     "Let the sons receive $x$ and $y$ coins. Then $x^2 - y^2 = 16(x - y)$, so $(x + y)(x - y) = 16(x - y)$. Since "
     "$x \\neq y$, $x + y = 16$: the old man had 16 coins.", "D"),
    ("The speed of a car increases by 2 kms after every one hour . if the distance travelling in the first one hour "
     "was 30 kms . what was the total distance traveled in 12 hours ?",
     ["252 kms", "152 kms", "492 kms", "752 kms", "152 kms"],
     "The hourly distances form an arithmetic sequence with first term 30 and difference 2. Over 12 hours the total "
     "is $\\frac{12}{2} \\times (2 \\times 30 + 11 \\times 2) = 6 \\times 82 = 492$ kms.", "C"),
    ("A reduction of 25 % in the price of oil enables a house wife to obtain 5 kgs more for rs . 600 , what is the "
     "reduced price for kg ?", ["30", "60", "70", "80", "20"],
     "Let the original price be $P$ per kg. Then $\\frac{600}{0.75P} - \\frac{600}{P} = 5$, so $\\frac{200}{P} = 5$ "
     "and $P = 40$. The reduced price is $0.75 \\times 40 = 30$ rupees.", "A"),
    ("A lady builds 9 cm length , 12 cm width , and 3 cm height box using 3 cubic cm cubes . what is the minimum "
     "number of cubes required to build the box ?", ["107", "108", "109", "110", "111"],
     "The box's volume is $9 \\times 12 \\times 3 = 324$ cubic cm; each cube is 3 cubic cm, so $324 / 3 = 108$ cubes "
     "are needed.", "B"),
]

CHOICE_INSTRUCTION = "What of the following is the right choice? Explain your answer."


def _options(choices: list[str]) -> str:
    return ", ".join(f"({'ABCDE'[i]}) {c}" for i, c in enumerate(choices))


def _gsm8k_prompt(question: str) -> str:
    shots = "".join(f"Question: {q}\nAnswer: {a}\n\n\n" for q, a in GSM8K_EXEMPLARS)
    return f"{shots}Question: {question}\nAnswer:"


def _math_prompt(problem: str) -> str:
    shots = "".join(
        f"Problem:\n{p}\nSolution:\n{s}\nFinal Answer: The final answer is ${a}$. I hope it is correct.\n\n\n"
        for p, s, a, _, _ in MINERVA_EXEMPLARS
    )
    return f"{shots}Problem:\n{problem}\nSolution:"


def _choice_prompt(problem: str, choices: list[str], exemplars: list[tuple[str, list[str], str, str]]) -> str:
    shots = "".join(
        f"Problem:\n{p}\n{CHOICE_INSTRUCTION}\n{_options(c)}\nSolution:\n{s}\nFinal Answer: The final answer is ({x}).\n\n\n"
        for p, c, s, x in exemplars
    )
    return f"{shots}Problem:\n{problem}\n{CHOICE_INSTRUCTION}\n{_options(choices)}\nSolution:"


_MMLU_EXEMPLARS = [(p, c, s, x) for p, s, _, c, x in MINERVA_EXEMPLARS]


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


class BenchmarkUnavailable(Exception):
    """A requested benchmark's data can't be had here (TabMWP offline, a missing file): said in the results."""


SHIPPED_DATA = Path(__file__).resolve().parent.parent / "assets" / "benchmarks"


def read_test_split(data_dir: Path, name: str) -> list[dict]:
    """``DATA_DIR/NAME/test.jsonl``, or its xz-compressed ``test.jsonl.xz`` (as shipped in ``vocagno/assets``)."""
    path = data_dir / name / "test.jsonl"
    packed = path.with_suffix(".jsonl.xz")
    if path.exists():
        opened = open(path, encoding="utf-8")
    elif packed.exists():
        opened = lzma.open(packed, "rt", encoding="utf-8")
    else:
        raise BenchmarkUnavailable(f"{path} does not exist")
    with opened as f:
        return [json.loads(line) for line in f if line.strip()]


def _number(value) -> str:
    return normalize_answer(f"{float(value):.6f}".rstrip("0").rstrip("."))


def load_benchmark(name: str, data_dir: str | Path) -> list[Example]:
    data_dir = Path(data_dir)
    if name == "gsm8k":
        out = []
        for i, row in enumerate(read_test_split(data_dir, name)):
            solution, answer = row["answer"].split("####")
            worked = re.sub(r"<<.*?>>", "", solution).strip()  # the calculator annotations are no model's text
            out.append(Example(name, i, row["question"], _gsm8k_prompt(row["question"]), normalize_answer(answer),
                               f" {worked}\nThe answer is {answer.strip()}."))
        return out
    if name == "math":
        out = []
        for i, row in enumerate(read_test_split(data_dir, name)):
            gold = last_boxed(row["solution"]) or ""
            out.append(Example(name, i, row["problem"], _math_prompt(row["problem"]), normalize_answer(gold),
                               f"\n{row['solution']}",
                               extra={"level": row.get("level"), "type": row.get("type")}))
        return out
    if name == "svamp":
        out = []
        for i, row in enumerate(read_test_split(data_dir, name)):
            body = row["Body"].strip()
            question = f"{body if body.endswith('.') else body + '.'} {row['Question'].strip()}"
            answer = _number(row["Answer"])
            out.append(Example(name, i, question, _gsm8k_prompt(question), answer,
                               f" {row['Equation'].strip()} = {row['Answer']}. The answer is {row['Answer']}."))
        return out
    if name == "asdiv":
        out = []
        for i, row in enumerate(read_test_split(data_dir, name)):
            question = f"{row['body'].strip()} {row['question'].strip()}"
            out.append(Example(name, i, question, _gsm8k_prompt(question), normalize_answer(row["answer"]),
                               f" {row['formula']}. The answer is {row['answer']}."))
        return out
    if name == "mawps":
        return [
            Example(name, i, row["input"], _gsm8k_prompt(row["input"]), _number(row["target"]),
                    f" The answer is {row['target']}.", extra={"type": row.get("type")})
            for i, row in enumerate(read_test_split(data_dir, name))
        ]
    if name == "tabmwp":
        return _load_tabmwp(data_dir)
    if name == "mathqa":
        out = []
        for i, row in enumerate(read_test_split(data_dir, name)):
            # "a ) 12 , b ) 16 , ...": a letter and ")" open an option at the start or after a comma
            choices = [c.strip(" ,") for c in re.split(r"(?:^|,)\s*[a-e]\s*\)\s*", row["options"].strip())[1:]]
            letter = row["correct"].upper()
            rationale = row["rationale"].strip('"')
            out.append(Example(name, i, row["problem"], _choice_prompt(row["problem"], choices, MATHQA_EXEMPLARS),
                               letter, f"\n{rationale}\nFinal Answer: The final answer is ({letter}).",
                               multiple_choice=True))
        return out
    if name == "mmlu_stem":
        out = []
        for i, row in enumerate(read_test_split(data_dir, name)):
            letter = "ABCD"[row["answer"]]
            out.append(Example(name, i, row["question"], _choice_prompt(row["question"], row["choices"], _MMLU_EXEMPLARS),
                               letter, f"\nFinal Answer: The final answer is ({letter}).", multiple_choice=True,
                               extra={"type": row.get("type")}))
        return out
    if name == "sat_math":
        out = []
        for i, row in enumerate(read_test_split(data_dir, name)):
            choices = [c.strip() for c in re.split(r"(?:^|\s)[A-D]\)\s*", row["options"].strip())[1:]]
            letter = row["Answer"].strip().upper()
            out.append(Example(name, i, row["question"], _choice_prompt(row["question"], choices, _MMLU_EXEMPLARS),
                               letter, f"\nFinal Answer: The final answer is ({letter}).", multiple_choice=True))
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
        out.append(Example("tabmwp", i, question, _gsm8k_prompt(question), normalize_answer(answer),
                           f" {row.get('solution', '')}\nThe answer is {answer}."))
    return out
