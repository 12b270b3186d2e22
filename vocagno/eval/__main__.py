"""Evaluate a model on the paper's math benchmarks (few-shot chain of thought, greedy) and in bits per byte.

    python -m vocagno.eval --model TinyLlama/TinyLlama_v1.1 --data-dir ../shared/assets/benchmarks --output results/
    python -m vocagno.eval --model runs/x/ep0-ba100-rank0.pt --benchmarks gsm8k,math --limit 100
    python -m vocagno.eval --model s3://bucket/runs/x          # a save folder's latest checkpoint, sharded or whole
    python -m vocagno.eval --gold --data-dir ../shared/assets/benchmarks        # the grader graded on gold answers
    python -m vocagno.eval --model DIR --bpb held_out.jsonl                       # tokenizer-independent LM quality

The protocol is described in ``vocagno/eval/benchmarks.py``; extraction and grading in ``vocagno/eval/grading.py``.
Writes ``OUTPUT/BENCHMARK.jsonl`` (every prediction with its prompt's question, the output, the extracted and gold
answers) and ``OUTPUT/results.md`` / ``results.json`` (Table 1's columns, GSM8K ... SAT, AVG). A requested benchmark
whose data is missing is reported as such, never skipped silently; the average is over the benchmarks that ran.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm import tqdm

from vocagno.entry import Parser
from vocagno.errors import Refused
from vocagno.training.models import load_model
from vocagno.eval.benchmarks import (
    BENCHMARKS, BITS_PER_BYTE, MAX_NEW_TOKENS, PARTIAL, SHIPPED_DATA, STOP_SEQUENCES, TITLES, BenchmarkUnavailable,
    Example, load_benchmark,
)
from vocagno.eval.grading import is_equivalent
from vocagno.shown import md_text, terminal
from vocagno.doors.untrusted import UntrustedFile, cap
from vocagno.doors.writing import write_atomically


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], batch_size: int, max_new_tokens: int, desc: str) -> list[str]:
    """Greedy continuations, batched with left padding, cut at the stop sequences (and the EOS token)."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))  # similar lengths share a batch
    outputs: list[str] = [""] * len(prompts)
    device = next(model.parameters()).device
    for begin in tqdm(range(0, len(order), batch_size), desc=desc, unit="batch"):
        chosen = order[begin : begin + batch_size]
        # A question's "</s>" or "<|endoftext|>" is text, not the special token (split_special_tokens).
        batch = tokenizer([prompts[i] for i in chosen], return_tensors="pt", padding=True,
                          split_special_tokens=True).to(device)
        generated = model.generate(
            **batch, max_new_tokens=max_new_tokens, do_sample=False, stop_strings=list(STOP_SEQUENCES),
            tokenizer=tokenizer, pad_token_id=tokenizer.pad_token_id,
        )
        texts = tokenizer.batch_decode(generated[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
        for i, text in zip(chosen, texts):
            outputs[i] = _cut(text)
    return outputs


def _cut(text: str) -> str:
    for stop in STOP_SEQUENCES:
        text = text.split(stop)[0]
    return text.rstrip()


def grade(examples: list[Example], outputs: list[str]) -> list[dict]:
    rows = []
    for example, output in zip(examples, outputs):
        predicted = example.extract(output)
        rows.append({
            "index": example.index, "question": example.question, "output": output, "predicted": predicted,
            "gold": example.gold, "correct": is_equivalent(predicted, example.gold), **example.extra,
        })
    return rows


def table(results: dict[str, Any], shown: Callable[[object], str] = md_text) -> str:
    """Markdown in the shape of the paper's Table 1 (accuracy %, a missing benchmark as n/a); a partial score
    (``results["partial"]``) marked ``*``, its reason below the table (through ``shown``: ``md_text`` for a page,
    ``terminal`` for the terminal), and so is the average. The average is over the benchmarks shown."""
    partial = results.get(PARTIAL) or {}
    ran = [results[b] for b in BENCHMARKS if isinstance(results.get(b), float)]
    cells = [(f"{results[b]:.1f}" + ("*" if b in partial else "")) if isinstance(results.get(b), float) else "n/a"
             for b in BENCHMARKS if b in results]
    heads = [TITLES[b] for b in BENCHMARKS if b in results]
    average = (f"{sum(ran) / len(ran):.1f}" + ("*" if partial else "")) if ran else "n/a"
    lines = ["| " + " | ".join(heads + ["AVG"]) + " |", "|" + "---|" * (len(heads) + 1),
             "| " + " | ".join(cells + [average]) + " |"]
    if partial:
        lines += ["", *(f"\\* partial, not the benchmark's score: {TITLES[b]}: {shown(why)}"
                        for b, why in partial.items() if b in TITLES)]
    return "\n".join(lines)


def partial_reasons(examples: list[Example], total: int, max_new_tokens: int) -> list[str]:
    """Why a score of ``examples`` (of the benchmark's ``total``) is not the benchmark's under the protocol, known
    before generating: fewer questions, a shorter generation."""
    reasons = []
    if len(examples) < total:
        reasons.append(f"the first {len(examples):,} of {total:,} questions (--limit)")
    if max_new_tokens < MAX_NEW_TOKENS:
        reasons.append(f"--max-new-tokens {max_new_tokens} (the protocol's: {MAX_NEW_TOKENS})")
    return reasons


def beyond_positions(tokenizer, prompts: list[str], outputs: list[str], positions: int | None) -> int:
    """How many generations ran into the model's positions (``max_position_embeddings``): their prompt and output
    tokens, as ``generate`` tokenized them, reach it, so the model read or wrote past what it was trained for."""
    if positions is None:
        return 0
    return sum(len(tokenizer(p, split_special_tokens=True).input_ids) +
               len(tokenizer(o, add_special_tokens=False, split_special_tokens=True).input_ids) >= positions
               for p, o in zip(prompts, outputs))


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m vocagno.eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="HF name or folder, or a checkpoint of train.py: .pt, sharded folder, save folder, s3://...")
    parser.add_argument("--benchmarks", help="comma-separated, of: " + ",".join(BENCHMARKS) + " (default: all of "
                        "them, none with --bpb alone)")
    parser.add_argument("--data-dir", default=str(SHIPPED_DATA),
                        help="BENCHMARK/test.jsonl(.xz) files (default: the copies shipped in vocagno/assets)")
    parser.add_argument("--output", default="eval_results",
                        help="folder for predictions and the results table (default: %(default)s)")
    parser.add_argument("--limit", type=int, default=0, help="first N questions of each benchmark (0: all)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS,
                        help="the harness's --max_tokens_per_call (default: %(default)s)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--gold", action="store_true", help="grade the gold solutions as if a model wrote them")
    parser.add_argument("--bpb", help="a file the converter reads (.jsonl, .json, .parquet, .arrow, .txt, any of them "
                        ".gz or .zst): the model's bits per byte on its texts")
    parser.add_argument("--bpb-field", default="text",
                        help="the field holding each record's text (default: %(default)s)")
    args = parser.parse_args(argv)
    chosen = args.benchmarks if args.benchmarks is not None else "" if args.bpb else ",".join(BENCHMARKS)
    names = [b.strip() for b in chosen.split(",") if b.strip()]
    unknown = [b for b in names if b not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmarks {unknown}; known: {', '.join(BENCHMARKS)}")
    if not args.gold and not args.model:
        parser.error("--model is needed (or --gold, which grades the gold answers)")
    if args.limit < 0:
        parser.error(f"--limit must be 0 (all) or a positive number of questions, got {args.limit}")
    if args.batch_size < 1 or args.max_new_tokens < 1:
        parser.error(f"--batch-size and --max-new-tokens must be positive, got {args.batch_size}, {args.max_new_tokens}")
    if not Path(args.data_dir).is_dir():
        parser.error(f"--data-dir {args.data_dir} is not a folder (BENCHMARK/test.jsonl files)")
    if args.bpb:
        if not args.model:
            parser.error("--bpb needs --model (the model whose bits per byte it measures)")
        if not Path(args.bpb).is_file():
            parser.error(f"--bpb {args.bpb} is not a file")
        try:
            texts = _read_texts(Path(args.bpb), args.bpb_field)
        except Refused as error:  # a file the converter's reader refuses, or can't take as one
            parser.error(f"--bpb {error}")
        if not texts:
            parser.error(f"--bpb {args.bpb} holds no text")

    model = tokenizer = None
    if args.model:
        try:
            model, tokenizer = load_model(args.model, args.device)
        except Refused as error:  # it names the file and what is wrong with it
            raise Refused(f"--model {error}") from None
    results: dict[str, Any] = {}
    if args.bpb:
        from vocagno.training.metrics import bits_per_byte

        value = bits_per_byte(model, tokenizer, tqdm(texts, desc="bits per byte", unit="doc", dynamic_ncols=True,
                                                     mininterval=1.0))
        print(f"bits per byte on {terminal(args.bpb)} ({len(texts)} texts): {value:.4f}")
        if not names:
            return 0
        results[BITS_PER_BYTE] = {"file": args.bpb, "texts": len(texts), "value": round(value, 6)}

    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    for name in names:
        try:
            examples = load_benchmark(name, args.data_dir)
        except UntrustedFile as error:  # a data folder's file that is refused: no score is made of it
            raise Refused(f"--data-dir {error}") from None
        except BenchmarkUnavailable as error:
            results[name] = f"unavailable: {error}"
            print(f"{TITLES[name]}: NOT EVALUATED, {terminal(results[name])}", file=sys.stderr)
            continue
        total = len(examples)
        if args.limit:
            examples = examples[: args.limit]
        reasons = partial_reasons(examples, total, args.max_new_tokens if not args.gold else MAX_NEW_TOKENS)
        if args.gold:
            outputs = [e.gold_output for e in examples]
        else:
            outputs = generate(model, tokenizer, [e.prompt for e in examples], args.batch_size, args.max_new_tokens,
                               desc=TITLES[name])
            over = beyond_positions(tokenizer, [e.prompt for e in examples], outputs, positions)
            if over:
                reasons.append(f"{over:,} of {len(examples):,} prompts with their outputs reached the model's "
                               f"{positions:,} positions")
        if reasons:
            results.setdefault(PARTIAL, {})[name] = "; ".join(reasons)
            print(f"warning: {TITLES[name]} is scored partially, not as the benchmark is: {'; '.join(reasons)}",
                  file=sys.stderr)
        rows = grade(examples, outputs)
        write_atomically(out / f"{name}.jsonl", "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
        correct = sum(r["correct"] for r in rows)
        results[name] = 100.0 * correct / len(rows)
        print(f"{TITLES[name]}: {results[name]:.2f}% ({correct}/{len(rows)})")
    write_atomically(out / "results.md", table(results) + "\n")
    write_atomically(out / "results.json", json.dumps(results, indent=1))
    print("\n" + table(results, terminal))
    missing = [n for n in names if not isinstance(results.get(n), float)]
    if missing:
        print(f"\nnot evaluated: {', '.join(TITLES[n] for n in missing)} (see above); AVG is over the others")
    if len(missing) == len(names):
        print("error: no benchmark was evaluated", file=sys.stderr)
        return 1
    return 0


def _read_texts(path: Path, field: str = "text") -> list[str]:
    """The texts of ``path`` as the converter reads a corpus file (``vocagno.conversion.sources``: .jsonl, .json,
    .parquet, .arrow, .txt, any of them gzip- or zstd-compressed; a record's ``field``), held within the ``json_bytes``
    cap in all. A record the converter would skip, or a file it can't read to its end, is refused (``UntrustedFile``),
    naming the fields the record has: a score over some of a file's documents is no score of the file."""
    from vocagno.conversion.records import LONE_SURROGATE, TextOf
    from vocagno.conversion.sources import parse_jsonl_line, sources_of

    text_of, limit = TextOf(field), cap("json_bytes")
    (source,) = sources_of([str(path)], "train", text_of)
    texts, held = [], 0
    for number, record in enumerate(source.records(), 1):
        if isinstance(record, bytes):  # a JSON line, parsed where it is used (the converter's workers)
            record = parse_jsonl_line(record, text_of)
        if source.error:
            raise UntrustedFile(f"{path}: refused: {source.error}")
        if record.fields is not None:
            raise UntrustedFile(f"{path}: refused: document {number:,}: {record.problem} (its fields: "
                                f"{record.fields}): name the text's field with --bpb-field")
        if record.text is None:
            raise UntrustedFile(f"{path}: refused: document {number:,}: {record.problem}")
        problem = record.problem or ("a lone surrogate (a JSON escape of U+D800 to U+DFFF, no character)"
                                     if LONE_SURROGATE.search(record.text) else None)
        if problem:
            raise UntrustedFile(f"{path}: refused: document {number:,}: {problem}: bits per byte are of the text as "
                                "written")
        held += len(record.text) + 1  # a record's own overhead counts too: a million empty ones are no text
        if held > limit:
            raise UntrustedFile(f"{path}: refused: more than {limit:,} characters of text, more than the json_bytes "
                                "cap holds at once (raise VOCAGNO_MAX_JSON_BYTES if it is right)")
        if record.text:  # an empty text has no bytes to score
            texts.append(record.text)
    return texts


if __name__ == "__main__":
    from vocagno.entry import run

    run(main)
