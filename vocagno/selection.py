"""What a teacher keeps, on your own data: does it pick the useful tokens before you pay for a run?

    python -m vocagno.selection --shards shards/gsm8k_heldout_mistral_128 --teacher tiny-math-teacher --canaries 0.5
    python -m vocagno.selection --shards DIR --config yamls/tiny.yaml --student runs/tiny/ep0-ba80-rank0.pt \\
        --canaries 0.5 --json selection.json --html selection.html
    torchrun --nproc-per-node 8 -m vocagno.selection ... --work /scratch/selection   # a big teacher: ranks score

``--samples`` rows are drawn from the shards; their text, cut at document ends, is the clean text. ``--canaries F``
adds noise made from it (``vocagno.diagnostics.canaries``: words shuffled, characters scrambled), F of all documents, and the
mixture is converted as the converter converts it (the shards' tokenizers and ``seq_len``), each student token
labelled by the document it comes from. The teacher scores every row (``vocagno.score``: on each rank's GPU, as the
scoring pass does), and so does the same teacher at initialization (the control that knows nothing). The student's
loss of each token is a trained student's (``--student``: a Hugging Face name or folder, or a ``train.py``
checkpoint), or by default that of a student at initialization, ln V for every token, so that the ranking is the
teacher's alone. Each selection variant then keeps its tokens as training would (``vocagno.core.loss``: score = student
loss - aggregated teacher loss, top-k over each global batch of rows, plus the unmapped tokens when included):

    topk               the selection training makes: the yaml's (--config: its top-k ratio, aggregation, unmapped,
                       scope, selection and alignment; else top 40%, max, unmapped included, the batch scope)
    chunk_1/4/16       the paper's chunk-level alignment (Table 2's baseline as reconstructed: the chunk's mean loss)
    random             as many mapped tokens drawn at random
    untrained_teacher  topk's selection with the teacher at initialization

and is measured by its precision (the share of the mapped tokens it keeps that are clean) and recall (the share of
the clean mapped tokens it keeps), against the clean share (what a random selection gets). The report (terminal,
``--json``, ``--html``) gives also the teacher's and the student's mean loss per kind of text and, per document, the
fraction of its tokens the top-k keeps; a mean over no tokens is NaN in the terminal, null in ``--json``. With several
ranks, rank 0 alone reports and writes ``--json`` and ``--html``.

Several teachers (``vocagno.teacher.several``): ``--teacher NAME=MODEL`` (or ``MODEL``, named by its folder's name) given
several times, each folder holding its tokenizer, or ``--config`` with a ``teachers:`` section; ``--combine min|mean``
(default: the yaml's ``algorithms.vocagno.combine``, else min). They score as ``vocagno.score`` does: the first whose
vocabulary is the shards' teacher vocabulary scores the rows' teacher tokens, each other one tokens made from the
text, under its name. Every variant above selects on their combination, but ``untrained_teacher``, which is the first
teacher's control alone. The report adds each teacher's top-k alone (its own losses, the same selection) and its
share of the combination's kept mapped tokens whose reference it gave (``--json``: ``"teachers": {NAME: {"topk":
{"precision", "recall", "kept_share"}, "share"}}``, absent with one teacher), and the page can colour each token by
the teacher that gave its reference:

    python -m vocagno.selection --shards DIR --teacher math=MATH_FOLDER --teacher latex=LATEX_FOLDER --canaries 0.5
    python -m vocagno.selection --shards DIR --config yamls/tiny_two_teachers.yaml --combine mean --canaries 0.5

Several sources: ``--shards`` given several times (each source named by its folder's last part), or ``--config`` and
no ``--shards``: the streams of the yaml's ``train_loader.dataset.streams`` (their ``local`` folders, named by their
names). Every source must be made by the same tokenizers with the same ``seq_len`` (refused naming the one that
differs), and two of one name are refused. ``--samples`` rows are drawn from each source and mixed with canaries as a
run on it alone makes them; the sources' rows, one of each in turn, are scored and ranked together (every top-k over
rows of all sources, as a mixture's batch). The report adds, per source, its rows, mapped tokens, clean share and the
teacher's loss per kind, the combination's top-k over its tokens and, with several teachers, each one's alone and
share (``--json``: ``"sources": {SOURCE: {"rows", "mapped", "clean_share", "teacher_loss", "topk", "teachers": {NAME:
{"topk", "share"}}}}``, absent with one source):

    python -m vocagno.selection --shards heldout/gsm8k --shards heldout/arxiv --teacher math=M1 --teacher latex=M2
"""

from __future__ import annotations

import argparse
import json
import pickle
from pathlib import Path


from vocagno.core.loss import COMBINE
from vocagno.entry import Parser
from vocagno.errors import Refused
from vocagno.diagnostics.canaries import NOISE
from vocagno.data.shards import (COLUMNS, METADATA_FILE, TEACHER_NAME, ShardMetadata, check_teacher_name,
    describe_tokenizer)
from vocagno.doors.writing import write_atomically
from vocagno.shown import terminal
from vocagno.diagnostics.selection.report import Report
from vocagno.diagnostics.selection.settings import Settings
from vocagno.diagnostics.selection.run import run, same_sources
from vocagno.training.config import scoring_teachers
from vocagno.teacher.config import LOADED_DTYPE
from vocagno.teacher.scoring import BATCH_TOKENS, scoring_device
from vocagno.teacher.several import reader_first

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m vocagno.selection", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 2)[2])
    parser.add_argument("--shards", action="append",
                        help="vocagno shards (the converter's, scored or not); several times for several sources, "
                             "each named by its folder's name (default with --config: the streams of its "
                             "train_loader.dataset)")
    teacher = parser.add_mutually_exclusive_group(required=True)
    teacher.add_argument("--teacher", action="append",
                         help="a Hugging Face name or folder, or a shipped model (tiny-math-teacher); several times "
                              "for several teachers: NAME=MODEL or MODEL (named by its folder's name), each MODEL's "
                              "folder holding its tokenizer")
    teacher.add_argument("--config", help="a training yaml: its teacher: (or teachers:) section and its "
                                          "algorithms.vocagno settings")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of --config's yaml")
    parser.add_argument("--teacher-tokenizer", help="the --teacher's tokenizer, when its folder has none (one teacher)")
    parser.add_argument("--combine", choices=("min", "mean"),
                        help="several teachers: how their losses make a token's reference (default: the yaml's, "
                             "else min)")
    parser.add_argument("--dtype", default=LOADED_DTYPE, help="the --teacher's dtype (a yaml's says its own)")
    parser.add_argument("--student", help="a Hugging Face name or folder, or a train.py checkpoint (.pt); unset, a "
                                          "student at initialization (a flat loss)")
    parser.add_argument("--samples", type=int, default=64, help="rows drawn from the shards")
    parser.add_argument("--canaries", type=float, help="add noise documents, this fraction of all, in (0, 1)")
    parser.add_argument("--noise", default=",".join(NOISE), help=f"kinds of noise, of {', '.join(NOISE)}")
    parser.add_argument("--seed", type=int, default=0, help="the rows drawn, the noise, the random control")
    parser.add_argument("--json", help="write the report as JSON here")
    parser.add_argument("--html", help="write a page of the first rows here: tokens coloured by teacher loss")
    parser.add_argument("--html-rows", type=int, default=12, help="rows on the --html page")
    parser.add_argument("--work", help="a folder for the rows and their scores (needed with several ranks)")
    parser.add_argument("--batch-tokens", type=int, default=BATCH_TOKENS,
                        help="padded teacher tokens per scoring batch")
    parser.add_argument("--device", help="default: this rank's GPU (LOCAL_RANK), else the CPU")
    args = parser.parse_args(argv)
    report = _main(args)
    if report is None:
        return 0
    if args.json:
        write_atomically(args.json, json.dumps(report.as_json(), indent=1, allow_nan=False) + "\n")
        print(f"wrote {terminal(args.json)}")
    if args.html:
        write_atomically(args.html, report.page(f"What the teacher keeps: {', '.join(args.shards or report.sources)}"))
        print(f"wrote {terminal(args.html)}")
    print(f"({report.seconds:.0f} s)")
    print(report.table())  # it ends with the verdict
    return 0


def _main(args: argparse.Namespace) -> Report | None:
    from vocagno.teacher.scoring import rank_and_world
    from vocagno.teacher.teacher import NoTokenizer, Teacher

    if args.samples < 1:
        raise Refused(f"--samples must be at least 1, got {args.samples}")
    if args.canaries is not None and not 0 < args.canaries < 1:
        raise Refused(f"--canaries is the fraction of noise documents, in (0, 1), got {args.canaries}")
    noise = tuple(k for k in args.noise.split(",") if k)
    if not noise or set(noise) - set(NOISE):
        raise Refused(f"--noise takes kinds of {', '.join(NOISE)}, got {args.noise!r}")
    if args.overrides and not args.config:
        raise Refused(f"overrides {args.overrides} need --config")
    rank, world = rank_and_world()
    if world > 1 and args.work is None:
        raise Refused(f"{world} ranks need one --work folder they all reach")
    cfg = None
    if args.config:
        from vocagno.training.config import load_config

        try:
            cfg = load_config(args.config, args.overrides)
        except (ValueError, OSError, KeyError) as error:
            raise Refused(f"{error.__class__.__name__}: {str(error).splitlines()[0] if str(error) else ''}") from error
    sources = _sources(args.shards, cfg, args.config)
    metadata = same_sources({name: _read_shards(folder, name if len(sources) > 1 else None)
                              for name, folder in sources.items()})
    try:
        combine = args.combine or COMBINE
        if cfg is not None:
            settings = Settings.from_config(cfg)
            chosen = scoring_teachers(cfg, args.config)
            if isinstance(chosen, list):
                combine = args.combine or ((cfg.get("algorithms") or {}).get("vocagno") or {}).get("combine", COMBINE)
        elif len(args.teacher) > 1:
            if args.teacher_tokenizer:
                raise Refused("--teacher-tokenizer is for one --teacher: several take each one's folder's tokenizer")
            settings = Settings()
            chosen = [Teacher(model, name, dtype=args.dtype) for name, model in _named_teachers(args.teacher).items()]
        else:
            settings = Settings()
            chosen = Teacher(_split_teacher(args.teacher[0])[1], tokenizer=args.teacher_tokenizer, dtype=args.dtype)
        chosen = reader_first(chosen if isinstance(chosen, list) else [chosen], metadata)
        chosen[0].check_reads(metadata)  # the reader reads the shards' teacher tokens
        for other in chosen[1:]:  # each other reads its own tokens, made from the text
            try:
                other.check_reads(metadata, own_tokens=True)
            except NoTokenizer:
                raise
            except ValueError as error:
                raise Refused(str(error)) from None
        student, student_name = None, ""
        if args.student:
            from vocagno.training.checkpoint import BadCheckpoint
            from vocagno.training.models import load_model

            try:
                student, tokenizer = load_model(args.student, "cpu")
            except BadCheckpoint as error:  # it names the file and what is wrong with it
                raise Refused(f"--student {error}") from error
            metadata.check_tokenizers(student=describe_tokenizer(tokenizer, "student"))
            student_name = args.student
    except NoTokenizer as error:  # how this command gives a teacher its tokenizer
        how = ("add --teacher-tokenizer NAME_OR_FOLDER" if not args.config and len(args.teacher) == 1 else
               "give it as teachers.NAME.tokenizer in a yaml, with --config YAML (several --teacher take each one's "
               "folder's tokenizer)" if not args.config else "give it as its tokenizer: key in the yaml")
        raise Refused(f"{error}: {how}") from None
    except Refused:
        raise  # one line already
    except (ValueError, OSError, KeyError, RuntimeError, pickle.UnpicklingError) as error:
        raise Refused(f"{error.__class__.__name__}: {str(error).splitlines()[0] if str(error) else ''}") from error
    device = scoring_device(args.device)
    return run({name: str(folder) for name, folder in sources.items()}, chosen, settings, student=student,
               student_name=student_name, samples=args.samples, canaries=args.canaries or 0.0, noise=noise,
               seed=args.seed, device=device, work=args.work,
               batch_tokens=args.batch_tokens, rank=rank, world=world, page_rows=args.html_rows, combine=combine)


def _split_teacher(value: str) -> tuple[str | None, str]:
    """A ``--teacher`` value as (its NAME or None, its MODEL): ``NAME=MODEL`` only where NAME is a teacher's name (a
    path may hold "=": ``/ckpt/lr=3e-4/teacher``)."""
    name, _, model = value.partition("=")
    return (name, model) if model and TEACHER_NAME.fullmatch(name) else (None, value)


def _named_teachers(values: list[str]) -> dict[str, str]:
    """``--teacher`` values (``NAME=MODEL`` or ``MODEL``, named by its last path part) as name -> model, each name
    checked and given once."""
    named = {}
    for value in values:
        name, model = _split_teacher(value)
        name = name or Path(model.rstrip("/")).name
        try:
            check_teacher_name(name, "--teacher")
        except ValueError as error:
            raise Refused(f"{error} (give it one: --teacher NAME={model})") from error
        if name.lower() in {n.lower() for n in named}:
            raise Refused(f"two teachers are named {name!r}: name them apart (--teacher NAME=MODEL)")
        named[name] = model
    return named


def _sources(shards: list[str] | None, cfg, config: str | None) -> dict[str, Path]:
    """The sources, name -> folder: each ``--shards`` folder, named by its last path part, or without ``--shards``
    the streams of ``--config``'s ``train_loader.dataset.streams`` (each its ``local``, and ``split`` under it),
    named by their names; refused without either, or when two share a name."""
    if shards:
        named = [(Path(folder.rstrip("/")).name or folder, Path(folder)) for folder in shards]
    else:
        streams = None if cfg is None else ((cfg.get("train_loader") or {}).get("dataset") or {}).get("streams")
        if not streams:
            raise Refused("--shards is needed" + (f": {config} has no train_loader.dataset.streams to take as sources"
                                                    if config else ""))
        named = []
        for name, stream in streams.items():
            if not stream or not stream.get("local"):
                raise Refused(f"{config}: stream {name!r} has no local folder to read (download it, or give --shards)")
            named.append((str(name), Path(stream.local) / stream.split if stream.get("split") else Path(stream.local)))
    sources = {}
    for name, folder in named:
        same = [n for n in sources if n.lower() == name.lower()]
        if same:
            raise Refused(f"two sources are named {name!r} ({sources[same[0]]} and {folder}): each --shards source is "
                          "named by its folder's last part: give folders of distinct names")
        sources[name] = folder
    return sources


def _read_shards(folder: Path, source: str | None = None) -> ShardMetadata:
    """The shards' metadata, refusing a folder that holds no vocagno shards with offsets (naming its ``source``)."""
    if source is not None:
        try:
            return _read_shards(folder)
        except Refused as error:
            raise Refused(f"source {source!r}: {error}") from None
    if not folder.is_dir() or not any(folder.iterdir()):
        try:
            ShardMetadata.read(folder)
        except FileNotFoundError as error:  # no such folder, or an empty one: what to do
            raise Refused(f"--shards {error}") from None
    if not (folder / "index.json").exists():
        raise Refused(f"--shards {folder} holds no index.json: not a shard folder")
    if not (folder / METADATA_FILE).exists():
        raise Refused(f"--shards {folder} holds no {METADATA_FILE}: not vocagno shards (a token MDS has no text or "
                      "offsets to align; convert the corpus with conversion/convert_dataset.py)")
    from vocagno.data.shard_index import read_index

    index = read_index(folder)  # every count and name checked before the shards are read
    missing = sorted(set(COLUMNS) - {c for info in index["shards"][:1] for c in info.get("column_names", [])})
    if missing or not index["shards"]:
        raise Refused(f"--shards {folder}: its shards lack the columns {', '.join(missing) or 'of any sample'}: "
                      "convert the corpus with conversion/convert_dataset.py")
    try:
        return ShardMetadata.read(folder)
    except ValueError as error:
        raise Refused(str(error)) from error


if __name__ == "__main__":
    from vocagno import entry

    entry.run(main)
