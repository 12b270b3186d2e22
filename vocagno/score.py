"""Score once, train many: vocagno shards written again with the teacher's loss of each of its tokens.

    python -m vocagno.score --shards shards/owm-qwen --teacher Qwen/Qwen2.5-Math-7B-Instruct --out shards/scored
    torchrun --nproc-per-node 8 -m vocagno.score ...         # or composer -n 8 -m vocagno.score ...
    python -m vocagno.score --shards shards/gsm8k_sample_128 --config yamls/tiny.yaml --out shards/tiny-scored

VocAgnoLM needs one scalar per teacher token from the teacher, and it does not depend on the student: scored once
(``TeacherScorer``, exactly as in training: the sample's teacher row as context, chunked cross-entropy), the losses
serve every run on these shards (a Table 3 grid, a top-k sweep, several seeds) with
``algorithms.vocagno.teacher_losses: cached``, and no teacher is loaded then. The output has the input's columns
plus ``teacher_loss`` (float16: 2 bytes per teacher token, 3 significant digits for losses up to 65504; NaN where
undefined: a row's first token), and its ``vocagno.json`` records the teacher (``scored_by``: name, a fingerprint of
its weights, dtype).

How it runs (parts, ranks, resuming, remotes): ``vocagno.teacher.scoring``.

``--top-k K`` stores, from the same forward, the teacher's next-token distribution at each of its positions: its K
most probable tokens' ids and probabilities and the mass outside them (``--top-k-dtype``: float16, or float32), for
ULD and cross-vocabulary KD from the cache (``algorithms.uld`` and ``algorithms.cross_kd`` with ``teacher_losses:
cached``). With ``--config``, K is the yaml's ``algorithms.uld.top_k`` or ``algorithms.cross_kd.top_k`` when the
command line gives none.

    python -m vocagno.score --shards S --teacher tiny-math-teacher --dtype float32 --top-k 32 --out S32

Several teachers (``teachers:``, ``vocagno.teacher.several``) are scored once each, one pass per teacher, each pass reading
the previous one's output: ``--name NAME`` is the teacher's name in the run (with ``--config``, it picks the teacher
of the yaml's ``teachers:``). The teacher whose vocabulary the shards were made with, scored first, fills
``teacher_loss`` as a single teacher does; every other teacher scores its tokens as training makes them from the
student's (``TeacherSide``), into ``teacher_loss.NAME`` with its alignment ``align.NAME`` (per student token, its
``[start, end)`` teacher positions), recorded in ``vocagno.json``'s ``also_scored_by``:

    python -m vocagno.score --shards S --config yamls/tiny_two_teachers.yaml --name math --out S1
    python -m vocagno.score --shards S1 --config yamls/tiny_two_teachers.yaml --name latex --out S2
"""

from __future__ import annotations

from pathlib import Path


from vocagno.entry import Parser
from vocagno.core.kernels import (DEFAULT_KERNELS, KERNELS, check_chunk_mem_const, check_chunk_size, check_kernels,
                                  check_on_gpu)
from vocagno.core.loss import CHUNK_SIZE
from vocagno.data.outroots import Output
from vocagno.data.shards import DISTRIBUTION_DTYPES, ShardMetadata, check_teacher_name
from vocagno.errors import Refused
from vocagno.teacher.config import LOADED_DTYPE
from vocagno.teacher.scoring import BATCH_TOKENS, rank_and_world, score, scoring_device
from vocagno.teacher.teacher import Teacher
from vocagno.training.config import load_config, scoring_teacher

__all__ = ["main", "yaml_top_k"]

CACHED_DISTILLATION = ("uld", "cross_kd")  # the algorithms that train from cached distributions


def yaml_top_k(cfg) -> int | None:
    """The ``top_k`` a yaml's distillation algorithm (``uld``, ``cross_kd``) asks its cached distributions to have, if
    it names one; two that differ are refused."""
    wanted = {}
    for name in CACHED_DISTILLATION:
        section = (cfg.get("algorithms") or {}).get(name)
        if section is not None and section.get("top_k") is not None:
            wanted[name] = section.get("top_k")
    if len(set(wanted.values())) > 1:
        raise Refused(f"the yaml's algorithms ask for distributions of different top_k ({wanted}): give --top-k")
    return next(iter(wanted.values()), None)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m vocagno.score", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", required=True, help="a local folder of vocagno shards (the converter's)")
    teacher = parser.add_mutually_exclusive_group(required=True)
    teacher.add_argument("--teacher", help="the teacher: a Hugging Face name or folder")
    teacher.add_argument("--config", help="a training yaml: its teacher: section (a config-built teacher included)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of --config's yaml")
    parser.add_argument("--out", required=True, help="the scored shards' out-root: a folder, or a remote (s3://...)")
    parser.add_argument("--local-root", help="the local working folder for a remote --out")
    parser.add_argument("--dtype", default=LOADED_DTYPE, help="the --teacher's dtype (a yaml's says its own)")
    parser.add_argument("--chunk-size", type=int,
                        help=f"the --teacher's tokens per chunk of its LM head (default {CHUNK_SIZE}; not with "
                             "--kernels liger, which chooses its own)")
    parser.add_argument("--chunk-mem-const", type=int,
                        help="with --kernels liger: the bound on a chunk's logits in multiples of the hidden states' "
                             "size (Liger's default 1; a yaml's teacher.chunk_mem_const)")
    parser.add_argument("--batch-tokens", type=int, default=BATCH_TOKENS,
                        help="padded teacher tokens per scoring batch")
    parser.add_argument("--device", help="default: this rank's GPU (LOCAL_RANK), else the CPU")
    parser.add_argument("--name", help="the teacher's name in a set of teachers (the run's teachers:); with --config, "
                                       "which of the yaml's teachers: to score")
    parser.add_argument("--teacher-tokenizer", help="the --teacher's tokenizer, when its folder has none")
    parser.add_argument("--kernels", choices=KERNELS, default=DEFAULT_KERNELS,
                        help="the --teacher's kernels: liger's fused ones need a CUDA GPU (a yaml's teacher.kernels)")
    parser.add_argument("--compile", action="store_true",
                        help="compile the --teacher's decoder layers (a yaml's teacher.compile_config)")
    parser.add_argument("--top-k", type=int,
                        help="store the teacher's distributions too: its K most probable next tokens at each position "
                             "(with --config, default the yaml's algorithms.uld.top_k or algorithms.cross_kd.top_k)")
    parser.add_argument("--top-k-dtype", choices=DISTRIBUTION_DTYPES, default="float16",
                        help="the stored probabilities' dtype (float16: 2 bytes a value)")
    args = parser.parse_args(argv)
    if args.name is not None:
        try:
            check_teacher_name(args.name, "--name")
        except ValueError as error:
            parser.error(str(error))
    if args.overrides and not args.config:
        parser.error(f"overrides {args.overrides} need --config")
    if args.top_k is not None and args.top_k < 1:
        parser.error(f"--top-k must be at least 1, got {args.top_k}")
    try:
        check_chunk_size(args.kernels, args.chunk_size, None, ("--chunk-size", "--kernels liger"))
        check_chunk_mem_const(args.kernels, args.chunk_mem_const, "--chunk-mem-const")
    except Refused as error:
        parser.error(str(error))
    if args.config and (args.kernels != DEFAULT_KERNELS or args.compile or args.chunk_size is not None
                        or args.chunk_mem_const is not None):
        parser.error("--kernels, --compile, --chunk-size and --chunk-mem-const are the --teacher's: with --config, "
                     "give teacher.kernels=liger, teacher.compile_config={}, teacher.chunk_size=N or "
                     "teacher.chunk_mem_const=N as overrides")
    try:
        ShardMetadata.read(args.shards)  # what a folder that holds no vocagno shards lacks, and what to do
    except (FileNotFoundError, Refused) as error:
        parser.error(f"--shards {error}")
    if not (Path(args.shards) / "index.json").exists():
        parser.error(f"--shards {args.shards} holds no index.json: its conversion has not finished (run the same "
                     "conversion command again to finish it)")
    device = scoring_device(args.device)
    top_k = args.top_k
    if args.config:
        cfg = load_config(args.config, args.overrides)
        chosen = scoring_teacher(cfg, args.config, args.name, device)
        if top_k is None:
            top_k = yaml_top_k(cfg)
    else:
        check_kernels(args.kernels, "--kernels")  # before a teacher of minutes loads
        check_on_gpu(args.kernels, device, "--kernels")
        chosen = Teacher(args.teacher, args.name, args.teacher_tokenizer, args.dtype, chunk_size=args.chunk_size,
                         kernels=args.kernels, compile_config={} if args.compile else None,
                         chunk_mem_const=args.chunk_mem_const)
    rank, world = rank_and_world()
    samples = score(args.shards, Output(args.out, args.local_root), chosen, device, args.batch_tokens, rank, world,
                    top_k, args.top_k_dtype)
    print(f"rank {rank} of {world}: {samples} samples scored with {chosen.label} into {args.out}")
    return 0


if __name__ == "__main__":
    from vocagno.entry import run

    run(main)
