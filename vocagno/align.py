"""Show how a student tokenizer's tokens map onto a teacher tokenizer's tokens for some text.

    python -m vocagno.align --student llama2 --teacher qwen2.5 --text "Résumé: ∫x²dx = x³/3"
    python -m vocagno.align --student TinyLlama/TinyLlama_v1.1 --teacher Qwen/Qwen2.5-Math-7B-Instruct --file a.txt

Tokenizers are local folders, the shipped copies (llama2, codellama, mistral, qwen2.5, deepseek-llm) or Hugging Face
names. Prints each student token with its teacher tokens and IoU/IoS, the unmapped tokens, the corpus figures, the
vocabulary overlap of the pair, and the mean IoU/IoS at token level and of chunk-level alignment per number of chunks
(``vocagno.core.alignment.chunk_overlap``: the data of the paper's Figures 3 and 6).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vocagno.entry import Parser
from vocagno.core.alignment import align, alignment_quality, chunk_overlap, vocab_overlap
from vocagno.core.tokenization import encode_with_offsets, load_tokenizer
from vocagno.shown import terminal
from vocagno.doors.untrusted import UntrustedFile, read_bytes


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m vocagno.align", description=__doc__.split("\n\n")[0])
    parser.add_argument("--student", required=True, help="student tokenizer: folder, shipped name or HF name")
    parser.add_argument("--teacher", required=True, help="teacher tokenizer: folder, shipped name or HF name")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="the text to align")
    source.add_argument("--file", type=Path, help="a UTF-8 text file to align")
    parser.add_argument(
        "--no-special-tokens", action="store_true", help="don't add the tokenizers' own specials (BOS, ...)"
    )
    parser.add_argument("--max-rows", type=int, default=200, help="print at most this many student tokens (0: all)")
    parser.add_argument("--chunks", default="1,4,16,64,256",
                        help="numbers of chunks whose chunk-level IoU/IoS to print (the paper's Figures 3 and 6)")
    args = parser.parse_args(argv)

    try:
        text = args.text if args.text is not None else \
            read_bytes(args.file, cap_name="document_bytes").decode("utf-8")
    except (OSError, UnicodeDecodeError, UntrustedFile) as error:
        parser.error(f"--file {args.file}: {error.strerror if isinstance(error, OSError) else error}")
    student, teacher = load_tokenizer(args.student), load_tokenizer(args.teacher)
    add_special = not args.no_special_tokens
    s_ids, s_offsets = encode_with_offsets(student, text, add_special_tokens=add_special)
    t_ids, t_offsets = encode_with_offsets(teacher, text, add_special_tokens=add_special)
    start, end = align(s_offsets, t_offsets)
    iou, ios = alignment_quality(s_offsets, t_offsets, start, end)
    s_pieces = student.convert_ids_to_tokens(s_ids.tolist())
    t_pieces = teacher.convert_ids_to_tokens(t_ids.tolist())

    rows = len(s_ids) if args.max_rows <= 0 else min(len(s_ids), args.max_rows)
    print(f"{'#':>5}  {'student token':<22} {'text':<16} {'teacher tokens':<40} {'IoU':>5} {'IoS':>5}")
    for i in range(rows):
        s, e = s_offsets[i]
        # a tokenizer's pieces (its tokenizer.json's, from elsewhere) shown as escapes; the student's and the text
        # through repr, which escapes them too
        teacher_tokens = terminal(" ".join(f"{j}:{t_pieces[j]}" for j in range(start[i], end[i])) or "(unmapped)")
        quality = f"{iou[i]:5.2f} {ios[i]:5.2f}" if start[i] < end[i] else f"{'-':>5} {'-':>5}"
        print(f"{i:>5}  {s_pieces[i]!r:<22} {text[s:e]!r:<16} {teacher_tokens:<40} {quality}")
    if rows < len(s_ids):
        print(f"... {len(s_ids) - rows} more (--max-rows 0 prints all)")

    mapped = start < end
    nonempty = s_offsets[:, 0] < s_offsets[:, 1]
    print("\n" + terminal(f"student {args.student}: {len(s_ids)} tokens; teacher {args.teacher}: {len(t_ids)} tokens"))
    print(f"mapped: {mapped.sum()} of {len(s_ids)} student tokens ({_share(mapped.sum(), len(s_ids))})")
    print(f"unmapped, empty span (specials): {int((~nonempty).sum())}")
    overlapless = np.flatnonzero(nonempty & ~mapped)
    print(f"unmapped, overlapping no teacher token: {len(overlapless)}")
    for i in overlapless:
        s, e = s_offsets[i]
        print(f"  #{i} {s_pieces[i]!r} over {text[s:e]!r} (chars {s}:{e}): the teacher's tokens skip these characters")
    if mapped.any():
        print(f"mean IoU {np.nanmean(iou):.3f}; IoS = 1 for {int((ios[mapped] == 1).sum())} of {mapped.sum()} mapped")
        print(f"teacher tokens per mapped student token: {(end - start)[mapped].mean():.2f}")
    print(f"vocabulary overlap: {vocab_overlap(student, teacher)}")
    if mapped.any():
        print(f"token level: mean IoU {np.nanmean(iou):.3f}, mean IoS {np.nanmean(ios):.3f}")
    for n in (int(c) for c in args.chunks.split(",") if c):
        chunk_iou, chunk_ios = chunk_overlap(s_offsets, t_offsets, n)
        print(f"{n:>4} chunks:  mean IoU {chunk_iou:.3f}, mean IoS {chunk_ios:.3f}")
    return 0


def _share(part, whole) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def command() -> None:
    """The ``vocagno-align`` command: ``main`` with one-line errors."""
    from vocagno.entry import run

    run(main)


if __name__ == "__main__":
    command()
