"""Make the shipped MATH text (``vocagno/assets/text/math_*``) from MATH's test split, without MATH-500.

    python experiments/math_text.py                    # reads ../shared/assets/benchmarks, writes vocagno/assets/text

MATH-500 (OpenAI PRM800K's split, what evaluation scores) and the 100 problems of ``math_test_100.jsonl`` (kept for
alignment tests) are removed from the 5,000 MATH test problems, matched on the problem text with surrounding
whitespace stripped; the remaining 4,413 are ordered by the sha256 of that text (a fixed shuffle that needs no random
number generator) and cut into

* ``math_heldout_100.jsonl``: the first 100, held-out text for bits per byte;
* ``math_train_500.jsonl``: the next 500, a student corpus;
* ``math_teacher.jsonl.gz``: the other 3,813, the pretraining text of the shipped ``tiny-latex-teacher``.

Each split keeps MATH's order; each document is one JSON line ``{"text": "Problem: {problem}\\nSolution: {solution}"}``,
as the GSM8K files are. The gzip file has no timestamp, so running this again gives the same bytes.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from vocagno.eval.benchmarks import read_test_split  # noqa: E402

TEXT = REPO / "vocagno" / "assets" / "text"
SHARED_BENCHMARKS = REPO.parent / "shared" / "assets" / "benchmarks"
HELDOUT, STUDENT = 100, 500


def problem_key(problem: str) -> str:
    return problem.strip()


def document(row: dict) -> str:
    return json.dumps({"text": f"Problem: {row['problem']}\nSolution: {row['solution']}"}) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--benchmarks", type=Path, default=SHARED_BENCHMARKS,
                        help="a folder with math/test.jsonl and math500/test.jsonl")
    parser.add_argument("--out", type=Path, default=TEXT)
    args = parser.parse_args(argv)
    problems = read_test_split(args.benchmarks, "math")
    math500 = {problem_key(row["problem"]) for row in read_test_split(args.benchmarks, "math500")}
    with open(TEXT / "math_test_100.jsonl", encoding="utf-8") as f:
        alignment_only = {problem_key(json.loads(line)["problem"]) for line in f}
    in_math500 = sum(problem_key(row["problem"]) in math500 for row in problems)
    if in_math500 != len(math500):
        raise SystemExit(f"{in_math500} of MATH-500's {len(math500)} problems found in MATH test: not the same text")
    kept = [row for row in problems if problem_key(row["problem"]) not in math500 | alignment_only]
    by_hash = sorted(range(len(kept)), key=lambda i: hashlib.sha256(problem_key(kept[i]["problem"]).encode()).digest())
    splits = {"math_heldout_100.jsonl": by_hash[:HELDOUT], "math_train_500.jsonl": by_hash[HELDOUT:HELDOUT + STUDENT],
              "math_teacher.jsonl.gz": by_hash[HELDOUT + STUDENT:]}
    args.out.mkdir(parents=True, exist_ok=True)
    for name, chosen in splits.items():
        data = "".join(document(kept[i]) for i in sorted(chosen)).encode("utf-8")
        path = args.out / name
        if name.endswith(".gz"):
            with open(path, "wb") as raw, gzip.GzipFile(name[:-3], "wb", 9, raw, mtime=0) as packed:
                packed.write(data)
        else:
            path.write_bytes(data)
        print(f"{path}: {len(chosen)} problems, sha256 {hashlib.sha256(path.read_bytes()).hexdigest()}")
    print(f"removed {in_math500} MATH-500 problems and {len(problems) - len(kept) - in_math500} more of "
          f"math_test_100.jsonl ({len(problems) - len(kept)} in all); {len(kept)} kept")
    return 0


if __name__ == "__main__":
    from vocagno import entry

    entry.run(main)  # a refusal: one line, exit 2
