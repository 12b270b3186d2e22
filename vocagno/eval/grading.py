"""Answer extraction, normalization and equivalence, following the math evaluation harness that Rho-1 and ProX used
(github.com/ZubinGou/math-evaluation-harness, MIT; ``parser.py`` and ``grader.py``), with HF's ``math-verify`` deciding
whether two LaTeX answers are equal instead of the harness's hand-written sympy rules.

Where this differs from the harness, the comment next to the rule says so.
"""

from __future__ import annotations

import math
import re

from math_verify import parse as mv_parse
from math_verify import verify as mv_verify

__all__ = ["extract_answer", "extract_choice", "normalize_answer", "is_equivalent", "last_boxed"]

_NUMBER = re.compile(r"-?\d*\.?\d+")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; None if there is none."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start:].split("box", 1)[1].lstrip("ed")
    if not rest.startswith("{"):
        # harness: "\boxed 5" without braces takes what follows up to a "$"
        return rest.split("$")[0].strip() or None
    depth = 0
    for i, char in enumerate(rest):
        depth += char == "{"
        depth -= char == "}"
        if depth == 0:
            return rest[1:i]
    return None  # unbalanced: an unfinished generation


def extract_answer(output: str) -> str:
    """The final answer of a chain of thought, in the harness's order: the last ``\\boxed{}``, else what follows the
    last "The final answer is" / "The answer is", else the last number. Then normalized (``normalize_answer``)."""
    boxed = last_boxed(output)
    if boxed is not None:
        answer = boxed
    elif "final answer is" in output:
        # Minerva's format ("Final Answer: The final answer is $x$. I hope it is correct."), an addition to the
        # harness's rules for the 4-shot Minerva prompt, whose exemplars end this way.
        answer = output.rsplit("final answer is", 1)[1].split("I hope it is correct")[0]
    elif "he answer is" in output:
        answer = output.rsplit("he answer is", 1)[1]
    else:
        numbers = _NUMBER.findall(output.replace(",", ""))
        answer = numbers[-1] if numbers else ""
    answer = answer.strip()
    answer = re.sub(r"\n\s*", "", answer)
    answer = answer.lstrip(":").rstrip("./").strip()
    return normalize_answer(answer)


def extract_choice(output: str) -> str:
    """A multiple-choice letter as the harness's ``extract_multi_choice_answer`` reads it: in the text before any
    "Problem:", with "choice is" read as "answer is", the first "answer is (x)" / "answer is x" (case-insensitive).
    Uppercase; "" when there is none (graded wrong, like the harness's 'placeholder'): a letter elsewhere in the text
    ("(D)" in a list of options) is no answer."""
    text = output.split("Problem:", 1)[0].replace("choice is", "answer is").lower()
    found = re.search(r"answer is \(?([abcde])\)?", text)
    return found.group(1).upper() if found else ""


# Units and words the harness strips from answers (parser.py ``unit_texts``, mostly MathQA's); a shorter list of the
# ones that occur in our datasets' answers and in model outputs, as whole words only.
_UNITS = (
    "degrees", "degree", "dollars", "dollar", "cents", "cent", "miles", "mile", "mph", "km", "kg", "meters", "meter",
    "cm", "inches", "inch", "feet", "foot", "hours", "hour", "minutes", "minute", "seconds", "second", "days", "day",
    "years", "year", "units", "unit", "percent", "sq", "square", "cubic",
)
_UNIT_RE = re.compile(r"(^|\W)(" + "|".join(_UNITS) + r")(?=$|\W)")


def normalize_answer(answer: str) -> str:
    """The harness's ``strip_string`` in spirit: drop spacing, units, ``\\text{}``, dollar and percent signs, ``\\left``
    / ``\\right``, ``dfrac``/``tfrac``, trailing zeros of decimals, and a leading "x =". Values are not rewritten
    beyond that: deciding equality is ``is_equivalent``'s job (math-verify)."""
    s = str(answer).strip().replace("\n", "").rstrip(".")
    s = s.replace("\\!", "").replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = re.sub(r"\^\s*\{?\\circ\}?", "", s)
    without_text_unit = re.sub(r"\\text\{.*?\}$", "", s).strip()
    if without_text_unit:  # harness: a trailing \text{...} is a unit ("5\text{ cm}")
        s = without_text_unit
    s = re.sub(r"\\(?:text|mbox|mathrm)\{(.*?)\}", r"\1", s)
    # A trailing unit word in parentheses ("9 (apples)", ASDiv's style): the harness strips unit words (``unit_texts``)
    # and then ignores brackets. Only words of two or more letters go: "x(x+1)" and "f(x)" stay whole.
    s = re.sub(r"\s*\((?:\s*[A-Za-z]{2,})+\s*\)\s*$", "", s) or s
    s = _UNIT_RE.sub(r"\1", s).strip() or s
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = re.sub(r"^[a-zA-Z]\s*=\s*", "", s)  # "x = 5" -> "5" (harness: any "lhs=" of at most 2 characters)
    s = re.sub(r"(\d),(\d{3})(?!\d)", r"\1\2", s)  # thousands separators: "1,000" -> "1000"
    s = re.sub(r"(\d+)\.0*(?=$|[^\d])", r"\1", s)  # "5.00" -> "5"
    s = s.replace(" ", "")
    if s.startswith("."):
        s = "0" + s
    return s


def _as_float(s: str) -> float | None:
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return None


def _numeric_equal(prediction: float, reference: float) -> bool:
    """harness grader.numeric_equal (current): relative tolerance 1e-4, no rounding (an integer reference does not
    accept a rounded prediction: "17.6" is not "18")."""
    return math.isclose(reference, prediction, rel_tol=1e-4)


def is_equivalent(prediction: str, reference: str) -> bool:
    """Whether a normalized predicted answer equals the reference.

    1. Both numbers: the harness's numeric rule, including its percentage leniency (the reference, /100 or x100).
    2. Same string, ignoring case (harness).
    3. Else math-verify on both as LaTeX (fractions, radicals, intervals, sets, tuples, matrices, expressions).
       The harness used sympy's ``parse_latex`` and ``simplify`` here; math-verify also compares intervals and sets
       as such (the harness stripped brackets, so ``(2,5)`` equalled ``[2,5]``: here it does not).
    """
    if not prediction:
        return False
    p, r = _as_float(prediction), _as_float(reference)
    if p is not None and r is not None:
        return any(_numeric_equal(p, candidate) for candidate in (r / 100, r, r * 100))
    if prediction.lower() == reference.lower():
        return True
    try:
        gold = mv_parse(f"${reference}$", parsing_timeout=5)
        guess = mv_parse(f"${prediction}$", parsing_timeout=5)
        return bool(gold and guess and mv_verify(gold, guess, timeout_seconds=5))
    except Exception:  # math-verify refuses some inputs (timeouts, unparsable LaTeX): not equal
        return False
