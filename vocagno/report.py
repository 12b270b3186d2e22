"""The paper's tables from several runs' evaluations, and plots of accuracy against a swept option.

    python -m vocagno.report evals/cpt evals/kld-llemma evals/vocagno-qwen ...            # a table, rows = runs
    python -m vocagno.report evals/qwen-topk20 evals/qwen-topk40 ... --plot topk.png --x-label "top-k ratio (%)"
    python -m vocagno.report --miniature miniature/miniature.json --plot bpb.png   # experiments/miniature.py's result

Each RUN folder is a ``python -m vocagno.eval --output`` folder (its ``results.json``); its row is named by its path
below the folder all the runs are in (``evals/cpt evals/qwen``: ``cpt``, ``qwen``; ``a/cpt b/cpt``: two rows).
Prints a markdown table in the shape of the paper's Tables 1-3: the nine benchmarks (few-shot CoT accuracy, %) and
their average, and the average's gain relative to the baseline row (``--baseline``, default the one run whose folder
name holds "cpt"), as the paper states "+46% over CPT". ``--plot`` draws the average against the number right after
``--x-key`` in each run's folder name (default ``topk``: ``qwen2.5-topk20-seed1`` -> 20; ``--x-key chunk``:
``chunk16`` -> 16), for the top-k sweep and the chunk counts of Table 2 (Figures 3/6); a run without it (the CPT
baseline) is a dashed line.
``--miniature`` prints the miniature's table instead (held-out bits per byte over seeds, each method against plain)
and plots bits per byte against the top-k ratio.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
from pathlib import Path

from vocagno.entry import Parser
from vocagno.eval.benchmarks import BENCHMARKS, TITLES, checked_partial, checked_results
from vocagno.shown import md_text, terminal
from vocagno.doors.untrusted import UntrustedFile, read_json
from vocagno.doors.writing import save_figure

__all__ = ["read_run", "run_names", "results_table", "sweep", "miniature_table", "main"]


def read_run(folder: Path) -> dict[str, float]:
    """A run's accuracies per benchmark (those evaluated) from its ``results.json``; a key ``vocagno.eval`` does not
    write is refused (``checked_results``)."""
    return checked_results(_results(folder), str(folder / "results.json"))


def _results(folder: Path) -> dict:
    path = folder / "results.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: give folders written by python -m vocagno.eval --output")
    results = read_json(path)
    if not isinstance(results, dict):
        raise UntrustedFile(f"{path}: refused: not a mapping of benchmark names to accuracies")
    return results


def run_names(folders: list[Path]) -> list[str]:
    """Each run's name: its folder's path below the folder all the runs' folders are in."""
    absolute = [Path(os.path.abspath(folder)) for folder in folders]
    common = os.path.commonpath([folder.parent for folder in absolute])
    return [folder.relative_to(common).as_posix() for folder in absolute]


def _average(results: dict[str, float]) -> float:
    """The mean of a run's accuracies: its benchmarks', every one of which the table shows (``checked_results`` let
    no other number in)."""
    shown = [results[b] for b in BENCHMARKS if b in results]
    return sum(shown) / len(shown) if shown else float("nan")


def results_table(runs: dict[str, dict[str, float]], baseline: str | None,
                  partial: dict[str, dict[str, str]] | None = None) -> str:
    """Markdown: a row per run, a column per benchmark any run has, AVG, and the AVG's gain over ``baseline``'s.

    The average is over the benchmarks the run has; a run missing some of the columns says so in its AVG cell
    (its average is not comparable with the others'). A partial score (``partial``: run -> benchmark -> why) is
    marked ``*``. Run names (folder names) are written through ``md_text``: a ``|`` in one adds no cell."""
    partial = partial or {}
    columns = [b for b in BENCHMARKS if any(b in r for r in runs.values())]
    base_avg = _average(runs[baseline]) if baseline else None
    head = "| run | " + " | ".join(TITLES[b] for b in columns) + " | AVG |" + (
        f" vs {md_text(baseline)} |" if baseline else "")
    lines = [head, "|---" * (len(columns) + 2 + bool(baseline)) + "|"]
    for name, results in runs.items():
        cells = [f"{results[b]:.1f}" + ("*" if b in partial.get(name, {}) else "") if b in results else "-"
                 for b in columns]
        average = f"{_average(results):.1f}" + ("*" if partial.get(name) else "") + (
            "" if all(b in results for b in columns) else " (partial)")
        row = f"| {md_text(name)} | " + " | ".join(cells) + f" | {average} |"
        if base_avg:
            row += f" {100 * (_average(results) - base_avg) / base_avg:+.1f}% |"
        lines.append(row)
    return "\n".join(lines)


def sweep(runs: dict[str, dict[str, float]], x_key: str) -> tuple[list[tuple[float, str]], list[str]]:
    """The plot's points, ``(x, run)`` sorted by x, for the runs whose folder name holds a number right after
    ``x_key`` (``qwen2.5-topk20-seed1``, ``topk``: 20); the other runs (the CPT baseline), drawn as dashed lines."""
    points, levels = [], []
    for name in runs:
        found = re.search(rf"{re.escape(x_key)}(\d+(?:\.\d+)?)", Path(name).name)
        if found:
            points.append((float(found.group(1)), name))
        else:
            levels.append(name)
    return sorted(points), levels


def plot(runs: dict[str, dict[str, float]], path: Path, x_key: str, x_label: str) -> str:
    """AVG against the number after ``x_key`` in each run's name (``sweep``); what it placed where, in words."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    placed, dashed = sweep(runs, x_key)
    figure, axes = plt.subplots(figsize=(5, 3.5))
    axes.plot([x for x, _ in placed], [_average(runs[name]) for _, name in placed], marker="o")
    for name in dashed:
        axes.axhline(_average(runs[name]), linestyle="--", color="gray")
        axes.annotate(name, (placed[0][0] if placed else 0, _average(runs[name])), va="bottom")
    axes.set_xlabel(x_label)
    axes.set_ylabel("average accuracy (%)")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    save_figure(figure, path, dpi=150)
    return (f"x is the number after {x_key!r} in each run's name: "
            + (", ".join(f"{name} at {x:g}" for x, name in placed) or "no run has one")
            + (f"; without it, a dashed line each: {', '.join(dashed)}" if dashed else ""))


def _spread(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else float("nan")


def _plus_minus(values: list[float]) -> str:
    return f" ± {statistics.stdev(values):.4f}" if len(values) > 1 else ""


def _what_topk_implies(ratio: float, clean: float) -> str:
    """What a top-k of ``ratio`` can keep of a corpus whose mapped tokens are ``clean`` clean at best."""
    if ratio < clean:
        return (f"A top {ratio:.0%} is below the clean share: at best it keeps clean tokens only, {ratio / clean:.0%} "
                "of them; a top-k at the clean share can keep exactly the clean tokens.")
    return (f"A top {ratio:.0%} is above the clean share: it must keep some junk, at least "
            f"{(ratio - clean) / ratio:.0%} of what it keeps.")


def miniature_table(result: dict) -> str:
    """``experiments/miniature.py``'s result as markdown (its names, a file's, through ``md_text``): held-out bits per
    byte per method (mean ± sd over seeds),
    the selection precision of the selecting methods, and each method against plain over the same seeds: the mean
    paired difference ± the paired differences' sd, and whether it lies beyond twice that sd (lower is better)."""
    bpb, plain = result["bits_per_byte"], result["bits_per_byte"]["plain"]
    lines = [
        f"Held-out bits per byte (GSM8K problems 501-600) of students trained on problems 1-500 plus "
        f"{result['junk']:.0%} word-shuffled copies: {md_text(result['size'])} size, {md_text(result['steps'])} steps, "
        f"seeds {md_text(', '.join(map(str, result['seeds'])))}, {md_text(result['device'])}; clean share of the "
        f"corpus {result['clean_share']:.3f}. Teacher ({md_text(result['teacher'])}): "
        f"{result['teacher_bits_per_byte']:.4f}.",
        _what_topk_implies(0.4, result["clean_share"]),
        "",
        "| method | bits/byte (mean ± sd) | selection precision | vs plain: mean paired diff ± sd | beyond 2 sd |",
        "|---|---|---|---|---|",
    ]
    for method, values in bpb.items():
        precision = result["selection_precision"].get(method)
        row = f"| {md_text(method)} | {statistics.mean(values):.4f}{_plus_minus(values)} | "
        row += f"{precision:.3f} | " if precision is not None else "- | "
        if method in ("plain", "init"):
            lines.append(row + "- | - |")
            continue
        differences = [a - b for a, b in zip(values, plain)]
        mean, sd = statistics.mean(differences), _spread(differences)
        beyond = "n/a (one seed)" if len(differences) < 2 else (
            ("yes, lower" if mean < 0 else "yes, higher") if abs(mean) > 2 * sd else "no")
        lines.append(row + f"{mean:+.4f}{_plus_minus(differences)} | {beyond} |")
    return "\n".join(lines)


def plot_miniature(result: dict, path: Path) -> None:
    """Bits per byte (mean, sd bars) against the share of tokens trained on: plain (all: 1.0), VocAgnoLM's top-k
    ratios, and the random 40% beside them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = {"plain": 1.0, "vocagno_40": 0.4, "vocagno_clean": result["clean_share"], "random_40": 0.4}
    figure, axes = plt.subplots(figsize=(5, 3.5))
    guided = sorted((ratios[m], m) for m in ("vocagno_40", "vocagno_clean", "plain") if m in result["bits_per_byte"])
    for style, methods in (("o-", guided), ("s", [(0.4, "random_40")] * ("random_40" in result["bits_per_byte"]))):
        xs = [x for x, _ in methods]
        ys = [statistics.mean(result["bits_per_byte"][m]) for _, m in methods]
        errors = [0 if len(v) < 2 else statistics.stdev(v) for v in (result["bits_per_byte"][m] for _, m in methods)]
        axes.errorbar(xs, ys, yerr=errors, fmt=style, capsize=3, label="top-k (1.0: plain)" if style == "o-"
                      else "random")
    axes.set_xlabel("share of the mapped tokens trained on (top-k ratio)")
    axes.set_ylabel("held-out bits per byte")
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    save_figure(figure, path, dpi=150)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m vocagno.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, help="python -m vocagno.eval --output folders")
    parser.add_argument("--miniature", type=Path, help="experiments/miniature.py's miniature.json, instead of runs")
    parser.add_argument("--baseline", help="the run the gains are relative to, by its name in the table (default: "
                                           "the one whose folder is named *cpt*)")
    parser.add_argument("--plot", type=Path, help="write a PNG of AVG against the number after --x-key in each run's "
                                                  "folder name")
    parser.add_argument("--x-key", default="topk", help="the plot's x: the number right after this in a run's "
                                                       "folder name (topk20 -> 20; chunk for chunk16)")
    parser.add_argument("--x-label", default="top-k ratio (%)", help="the plot's x axis")
    args = parser.parse_args(argv)
    if args.miniature is not None:
        if args.runs or not args.miniature.is_file():
            parser.error("--miniature takes one miniature.json (experiments/miniature.py's) and no runs")
        try:
            result = read_json(args.miniature)
        except UntrustedFile as error:
            parser.error(error)
        try:
            print(miniature_table(result))
        except (KeyError, TypeError, ValueError, AttributeError, statistics.StatisticsError) as error:
            parser.error(f"{args.miniature}: refused: not experiments/miniature.py's result ({error!r})")
        if args.plot:
            plot_miniature(result, args.plot)
            print(terminal(f"wrote {args.plot}"))
        return 0
    if not args.runs:
        parser.error("give python -m vocagno.eval --output folders, or --miniature")
    names = run_names(args.runs)
    if len(set(names)) < len(names):
        parser.error(f"a run is given twice: {', '.join(sorted({n for n in names if names.count(n) > 1}))}")
    # A folder without results.json, or one refused, ends the command in one line (vocagno.entry).
    results = {name: _results(folder) for name, folder in zip(names, args.runs)}  # each read once
    runs = {name: checked_results(one, str(folder / "results.json"))
            for (name, one), folder in zip(results.items(), args.runs)}
    partial = {name: checked_partial(one, str(folder / "results.json"))
               for (name, one), folder in zip(results.items(), args.runs)}
    for name, reasons in partial.items():
        if reasons:
            print(terminal(f"warning: {name}: partial scores, marked *: " + "; ".join(
                f"{TITLES.get(b, b)}: {why}" for b, why in reasons.items())), file=sys.stderr)
    named_cpt = [name for name in runs if "cpt" in Path(name).name.lower()]
    if args.baseline is None and len(named_cpt) > 1:
        parser.error(f"two or more runs are named *cpt* ({', '.join(named_cpt)}): choose one with --baseline")
    baseline = args.baseline or next(iter(named_cpt), None)
    if baseline is not None and baseline not in runs:
        parser.error(f"--baseline {baseline} is not one of the runs: {', '.join(runs)}")
    print(results_table(runs, baseline, partial))
    if args.plot:
        placed = plot(runs, args.plot, args.x_key, args.x_label)
        print(terminal(f"wrote {args.plot}: {placed}"))
    return 0


if __name__ == "__main__":
    from vocagno.entry import run

    run(main)
