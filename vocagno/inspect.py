"""Look at vocagno shards: one sample's student and teacher tokens and their alignment, and corpus statistics.

    python -m vocagno.inspect --shards shards/gsm8k_sample [--index 3] [--html sample.html] [--max-samples 1000]

The terminal shows the sample's text cut at student token boundaries and at teacher token boundaries, the alignment
of its first student tokens, and statistics over the first ``--max-samples`` samples. ``--html`` writes the sample as a
self-contained page: colored token spans, ids, pieces and IoU on hover, and hovering a student token lights up its
teacher tokens.
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np

from vocagno.entry import Parser
from vocagno.core.alignment import align, alignment_quality, vocab_overlap
from vocagno.data.dataset import TeacherGuidedDataset
from vocagno.core.tokenization import load_tokenizer
from vocagno.shown import html_text, terminal
from vocagno.doors.writing import write_atomically
from vocagno.diagnostics.pages import script_json


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m vocagno.inspect", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", required=True, help="a folder written by conversion/convert_dataset.py")
    parser.add_argument("--index", type=int, default=0, help="the sample to show")
    parser.add_argument("--html", help="also write the sample as an HTML page here")
    parser.add_argument("--max-samples", type=int, default=1000, help="samples the statistics read (0: all)")
    parser.add_argument("--rows", type=int, default=40, help="student tokens in the alignment table")
    args = parser.parse_args(argv)
    return _show(args, parser)


def _show(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    dataset = TeacherGuidedDataset(local=args.shards, batch_size=1)
    meta = dataset.metadata
    if not 0 <= args.index < len(dataset):
        parser.error(f"--index must be in [0, {len(dataset)}), got {args.index}")
    tokenizers = _load_tokenizers(meta.student.name, meta.teacher.name)

    sample = dataset[args.index]
    view = SampleView(sample, tokenizers)
    print(header(args.shards, len(dataset), meta) + "\n")
    print(view.terminal(args.index, args.rows))
    print(statistics(dataset, args.max_samples, tokenizers))
    if args.html:
        write_atomically(args.html, view.html(args.index, f"{meta.student.name} / {meta.teacher.name}"))
        print(f"\nwrote {terminal(args.html)}")
    return 0


def header(shards: str, samples: int, meta) -> str:
    """The folder, its samples and the tokenizers it names (its vocagno.json's names, through ``terminal``)."""
    return (f"{terminal(shards)}: {samples:,} samples of {meta.seq_len} student tokens\n"
            f"student {terminal(meta.student.name)} ({meta.student.vocab_size:,} tokens), teacher "
            f"{terminal(meta.teacher.name)} ({meta.teacher.vocab_size:,} tokens)")


def _load_tokenizers(student: str, teacher: str):
    """The tokenizers named by the shards, for token pieces and the vocabulary overlap; None when not at hand."""
    try:
        return load_tokenizer(student), load_tokenizer(teacher)
    except Exception as error:  # offline without the tokenizers: everything else still works from the shards
        print(terminal(f"(tokenizers not loaded, so no pieces or vocabulary overlap: {error.__class__.__name__}: "
                       f"{error})"))
        return None


class SampleView:
    def __init__(self, sample: dict, tokenizers):
        self.text = sample["text"]
        self.s_ids, self.s_off = sample["student_ids"].numpy(), sample["student_offsets"].numpy()
        self.t_ids, self.t_off = sample["teacher_ids"].numpy(), sample["teacher_offsets"].numpy()
        self.start, self.end = align(self.s_off, self.t_off)
        self.iou, self.ios = alignment_quality(self.s_off, self.t_off, self.start, self.end)
        s_tok, t_tok = tokenizers or (None, None)
        self.s_pieces = self._pieces(s_tok, self.s_ids, self.s_off)
        self.t_pieces = self._pieces(t_tok, self.t_ids, self.t_off)

    def _pieces(self, tokenizer, ids, offsets) -> list[str]:
        if tokenizer is not None:
            return tokenizer.convert_ids_to_tokens(ids.tolist())
        return [self.text[s:e] or "<special>" for s, e in offsets]

    def terminal(self, index: int, rows: int) -> str:
        """The sample for the terminal: its text, pieces and names (the shards') through ``terminal``."""
        lines = [f"sample {index}: {len(self.s_ids)} student tokens, {len(self.t_ids)} teacher tokens, "
                 f"{len(self.text):,} characters"]
        lines += ["", "student tokens (| between tokens, [SEP] an empty-span special):",
                  terminal(_cut(self.text, self.s_off))]
        lines += ["", "teacher tokens:", terminal(_cut(self.text, self.t_off)), "", "alignment:"]
        for i in range(min(rows, len(self.s_ids))):
            mapped = self.start[i] < self.end[i]
            teacher = terminal(" ".join(self.t_pieces[j] for j in range(self.start[i], self.end[i])) or "(unmapped)")
            quality = f"IoU {self.iou[i]:.2f}" if mapped else ""
            lines.append(f"  {i:>4} {terminal(repr(self.s_pieces[i])):<18} -> {teacher:<30} {quality}")
        return "\n".join(lines) + "\n"

    def html(self, index: int, title: str) -> str:
        tokens = {
            "student": [
                {"s": int(s), "e": int(e), "id": int(i), "piece": p, "first": int(a), "last": int(b),
                 "iou": None if a == b else round(float(q), 3)}
                for (s, e), i, p, a, b, q in zip(self.s_off, self.s_ids, self.s_pieces, self.start, self.end, self.iou)
            ],
            "teacher": [{"s": int(s), "e": int(e), "id": int(i), "piece": p}
                        for (s, e), i, p in zip(self.t_off, self.t_ids, self.t_pieces)],
        }
        payload = script_json({"text": self.text, **tokens})
        return _PAGE.replace("__TITLE__", html_text(f"sample {index}: {title}")).replace("__DATA__", payload)



def _cut(text: str, offsets: np.ndarray) -> str:
    out, at = [], 0
    for s, e in offsets.tolist():
        if s == e:
            out.append("[SEP]")
            continue
        if s > at:
            out.append(text[at:s])
        out.append(text[max(s, at):e] + "|")
        at = max(at, e)
    return "".join(out)


def statistics(dataset: TeacherGuidedDataset, max_samples: int, tokenizers) -> str:
    n = len(dataset) if max_samples <= 0 else min(max_samples, len(dataset))
    counts = Counter()
    for k in range(n):
        sample = dataset[k]
        s_off, t_off = sample["student_offsets"].numpy(), sample["teacher_offsets"].numpy()
        start, end = align(s_off, t_off)
        special = s_off[:, 0] == s_off[:, 1]
        mapped = start < end
        counts["student"] += len(s_off)
        counts["teacher"] += len(t_off)
        counts["mapped"] += int(mapped.sum())
        counts["specials"] += int(special.sum())
        counts["unmapped non-special"] += int((~mapped & ~special).sum())
        counts["teacher per mapped"] += int((end - start)[mapped].sum())
        counts["characters"] += len(sample["text"])
    lines = [
        f"statistics over {n:,} samples:",
        f"  mapped student tokens:            {counts['mapped'] / counts['student']:.2%}",
        f"  unmapped specials (BOS, separators): {counts['specials']:,}",
        f"  unmapped others (folded chars):   {counts['unmapped non-special']:,}",
        f"  teacher tokens per student token: {counts['teacher'] / counts['student']:.3f} "
        f"(per mapped one's range: {counts['teacher per mapped'] / max(counts['mapped'], 1):.3f})",
        f"  characters per student token:     {counts['characters'] / counts['student']:.2f}",
    ]
    if tokenizers:
        lines.append(f"  vocabulary overlap:               {vocab_overlap(*tokenizers)}")
    return "\n".join(lines)


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body { font: 15px/1.5 system-ui, sans-serif; margin: 2em; max-width: 70em; color: #222; }
h1 { font-size: 1.2em; } h2 { font-size: 1em; margin-top: 1.5em; color: #555; }
.row { white-space: pre-wrap; font-family: ui-monospace, monospace; line-height: 2.1; word-break: break-all; }
.tok { border-radius: 3px; padding: 1px 0; cursor: default; }
.c0 { background: #dbeafe; } .c1 { background: #fde68a; } .c2 { background: #bbf7d0; } .c3 { background: #fbcfe8; }
.special { background: #444; color: #fff; font-size: 0.75em; padding: 1px 3px; margin: 0 1px; }
.unmapped { outline: 2px solid #dc2626; }
.hot { background: #f97316 !important; color: #fff; }
#info { position: sticky; top: 0; background: #f8fafc; border: 1px solid #cbd5e1; padding: .4em .8em; min-height: 1.5em; }
</style></head><body>
<h1>__TITLE__</h1>
<div id="info">Hover a token: its id, piece, span and IoU; a student token lights up its teacher tokens.</div>
<h2>student tokens</h2><div class="row" id="student"></div>
<h2>teacher tokens</h2><div class="row" id="teacher"></div>
<script>
const data = __DATA__;
function render(role) {
  const box = document.getElementById(role);
  data[role].forEach((t, i) => {
    const span = document.createElement("span");
    span.id = role + i;
    if (t.s === t.e) { span.className = "tok special"; span.textContent = t.piece; }
    else { span.className = "tok c" + (i % 4); span.textContent = data.text.slice(t.s, t.e); }
    if (role === "student" && t.first === t.last && t.s !== t.e) span.classList.add("unmapped");
    span.onmouseenter = () => show(role, i, true);
    span.onmouseleave = () => show(role, i, false);
    box.appendChild(span);
  });
}
function show(role, i, on) {
  const t = data[role][i];
  const teachers = role === "student" ? [...Array(t.last - t.first).keys()].map(k => k + t.first) : [i];
  teachers.forEach(j => document.getElementById("teacher" + j).classList.toggle("hot", on));
  if (role === "student") document.getElementById("student" + i).classList.toggle("hot", on);
  if (!on) return;
  let text = `${role} #${i}  id ${t.id}  piece ${JSON.stringify(t.piece)}  chars [${t.s}, ${t.e})`;
  if (role === "student") text += t.first === t.last ? "  unmapped" :
    `  teacher tokens ${t.first}..${t.last - 1}  IoU ${t.iou}`;
  document.getElementById("info").textContent = text;
}
render("student"); render("teacher");
</script></body></html>
"""


if __name__ == "__main__":
    from vocagno.entry import run

    run(main)
