"""A training run from its yaml: ``train(cfg)`` builds the loaders, the student, the algorithms and Composer's
Trainer as the yaml says and fits it (what it builds with is ``vocagno.training``'s); ``command(argv)`` is
``train.py``'s command line, ``train.py`` its face.

The yaml (omegaconf, ``${variables.x}`` interpolation, command-line overrides as dotted keys) has llm-foundry's keys;
unknown or misspelled keys are an error. ``teacher:`` plus ``algorithms: {vocagno: {...}}`` train with the teacher;
``teachers: {NAME: {...}, ...}`` (each with ``teacher:``'s keys) with several (``vocagno.teacher.several``);
without a teacher it is plain continual pretraining (``yamls/cpt_baseline.yaml``). Models are Hugging Face names or
folders (``name_or_path``), or built with random weights from a ``config`` (``model_type`` and its fields).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # before a tokenizer is used and the loader's workers fork

import torch  # noqa: E402
from composer import Evaluator, Trainer  # noqa: E402
from composer.utils import dist, format_name_with_dist, get_device, reproducibility  # noqa: E402
from omegaconf import DictConfig  # noqa: E402
from omegaconf import OmegaConf as om  # noqa: E402
from omegaconf.errors import OmegaConfBaseException  # noqa: E402
from yaml import YAMLError  # noqa: E402

from vocagno.compat import composer as composer_compat  # noqa: E402
from vocagno.compat.streaming_shm import clean_leaked_shared_memory  # noqa: E402
from vocagno.core.fsdp import wrap_per_decoder_layer  # noqa: E402
from vocagno.core.kernels import use_kernels  # noqa: E402
from vocagno.core.loss import COMBINE  # noqa: E402
from vocagno.core.tokenization import load_tokenizer  # noqa: E402
from vocagno.doors.writing import remove  # noqa: E402
from vocagno.entry import INTERRUPTED_EXIT  # noqa: E402
from vocagno.errors import Refused  # noqa: E402
from vocagno.memory import keep_freed_memory  # noqa: E402
from vocagno.shown import terminal  # noqa: E402
from vocagno.training.builders import (  # noqa: E402
    build_algorithms, build_loggers, build_optimizer, build_scheduler, check_sections, check_speed_options,
    plain_section, student_flops_per_batch, student_model)
from vocagno.teacher.config import ModelConfig, build_causal_lm  # noqa: E402
from vocagno.teacher.several import check_one_or_several  # noqa: E402
from vocagno.training.config import load_config, plain, published_yaml, scoring_teachers  # noqa: E402
from vocagno.training.loaders import build_loader, conversion_flags, dataset_locals  # noqa: E402
from vocagno.training.loading import take_checkpoint  # noqa: E402
from vocagno.training.loggers import Narration, RunRecipe  # noqa: E402
from vocagno.training.plan import plan_line  # noqa: E402
from vocagno.training.sections import RunConfig, SelectionReportConfig  # noqa: E402

__all__ = ["MISTAKES", "USAGE", "command", "report_selection", "train"]

MISTAKES = (OmegaConfBaseException, YAMLError)  # a yaml's mistakes, told in one line as the library's refusals are


def train(cfg: DictConfig) -> Trainer:
    """Train as the yaml ``cfg`` (``vocagno.training.config.load_config``'s) says, on this process's rank; returns the
    fitted Trainer. A mistake in the yaml, the shards or a checkpoint is refused (``Refused``, ``ValueError``) before
    anything is trained; Ctrl-C or SIGTERM ends it saying where (``SystemExit(130)``)."""
    check_sections(cfg)
    check_speed_options(cfg)
    if not torch.cuda.is_available():  # the steps' logits and gradients reused, not faulted in again each step
        keep_freed_memory()
    run = RunConfig.of(cfg)
    dist.initialize_dist(get_device(None), timeout=run.dist_timeout)
    composer_compat.install()
    loading, private = take_checkpoint(cfg)  # removed as soon as Composer has loaded it
    clean_leaked_shared_memory(dataset_locals(cfg))  # what a killed run left on them would refuse Streaming
    reproducibility.seed_all(cfg.seed)
    world = dist.get_world_size()
    if cfg.global_train_batch_size % world:
        raise ValueError(f"global_train_batch_size {cfg.global_train_batch_size} is not divisible by {world} ranks")
    device_batch = cfg.global_train_batch_size // world

    student_tok = load_tokenizer(cfg.tokenizer.name)
    check_one_or_several(cfg.get("teacher"), cfg.get("teachers"), yaml=True)
    # Several teachers: the shards' teacher tokens are taken as they are; the algorithm finds the teacher they fit.
    teacher_tok = load_tokenizer(cfg.teacher.tokenizer) if cfg.get("teacher") is not None else None
    flags = conversion_flags(cfg)  # what a missing folder's message suggests converting with
    train_loader = build_loader(cfg.train_loader, student_tok, teacher_tok, device_batch, "train_loader", flags)
    samples = train_loader.dataset.size
    if train_loader.drop_last and samples < cfg.global_train_batch_size:
        # Every epoch would end before its first batch, and training would spin through empty epochs forever.
        raise ValueError(
            f"the training shards ({om.select(cfg, 'train_loader.dataset.local') or 'its streams'}) hold {samples} "
            f"samples, fewer than one global "
            f"batch of {cfg.global_train_batch_size}: convert more text, or lower global_train_batch_size"
        )
    if dist.get_global_rank() == 0:
        try:
            plan = plan_line(cfg, samples, train_loader.dataset.metadata.seq_len)
        except ValueError as error:  # a duration it can't count in batches: Composer's to judge
            plan = f"training for {cfg.max_duration} ({error})"
        print(terminal(plan), flush=True)
    evaluators = []
    if cfg.get("eval_loader") is not None:
        eval_batch = cfg.get("device_eval_batch_size") or cfg.device_train_microbatch_size
        evaluators.append(Evaluator(
            label="eval",
            dataloader=build_loader(cfg.eval_loader, student_tok, teacher_tok, eval_batch, "eval_loader", flags),
            metric_names=["BitsPerByte"],
        ))

    student = build_causal_lm(cfg.model, len(student_tok), cfg.seed)  # the same init for a seed, whatever the method
    student.config.use_cache = False  # no KV cache in training forwards; vocagno.export publishes it turned on
    positions = getattr(student.config, "max_position_embeddings", None)
    seq_len = train_loader.dataset.metadata.seq_len
    if positions is not None and positions < seq_len:
        raise ValueError(f"the shards' samples hold {seq_len} student tokens, but the student (model) has "
                         f"max_position_embeddings={positions}: convert with --seq-len {positions} or less")
    use_kernels(student, ModelConfig.of(cfg.model, "model.").kernels, "model.kernels")
    compile_config = plain(cfg.get("compile_config"))  # Composer compiles the student's forward
    model = student_model(wrap_per_decoder_layer(student), student_tok)
    model.flops_per_batch = student_flops_per_batch(student)  # SpeedMonitor's MFU
    algorithms = build_algorithms(cfg, teacher_tok)

    optimizer = build_optimizer(cfg, model)
    scheduler = build_scheduler(cfg)

    save_folder = cfg.get("save_folder")
    # Composer loads the private copy: as load_path where the run resumes (autoresume's latest replaces whatever
    # load_path would have loaded, as in Composer), else in the load_checkpoint callback's place.
    resuming = loading is not None and loading.key == "autoresume"
    loggers, callbacks = build_loggers(cfg, load_path=None if loading is None or resuming else loading.copy,
                                       resuming=resuming)
    console = plain_section(cfg, "loggers").get("console") is not None
    fsdp = om.to_container(cfg.fsdp_config) if cfg.get("fsdp_config") is not None else None
    trainer = Trainer(
        model=model,
        train_dataloader=train_loader,
        eval_dataloader=evaluators or None,
        eval_interval=run.eval_interval if evaluators else 1,  # none: Composer warns of an interval
        eval_subset_num_batches=run.eval_subset_num_batches,
        optimizers=optimizer,
        schedulers=scheduler,
        algorithms=algorithms,
        max_duration=cfg.max_duration,
        device_train_microbatch_size=cfg.device_train_microbatch_size,
        precision=cfg.get("precision"),
        compile_config=compile_config,
        parallelism_config={"fsdp": fsdp} if fsdp else None,
        save_folder=cfg.get("save_folder"),
        save_interval=run.save_interval,
        save_num_checkpoints_to_keep=run.save_num_checkpoints_to_keep,
        save_overwrite=run.save_overwrite,
        autoresume=False,  # vocagno chose what the run resumes from: load_path, its private copy
        load_path=loading.copy if resuming else None,
        run_name=cfg.run_name,
        loggers=loggers,
        callbacks=[*callbacks, RunRecipe(published_yaml(cfg))],
        log_to_console=False,  # loggers.console: ConsoleLine
        progress_bar=cfg.get("progress_bar", not console),  # not both: they print the same metrics
        seed=cfg.seed,
        device=None,
    )
    composer_compat.promptly_linked(trainer.state.callbacks)
    dist.barrier()  # every rank of the node has loaded the copy
    if private is not None:
        remove(private)
    folder = format_name_with_dist(save_folder, cfg.run_name) if save_folder else None
    narration = Narration(folder)
    trainer.state.callbacks.append(narration)  # after Composer's saver: it says what the saver just saved
    batch = int(trainer.state.timestamp.batch)
    if batch > 0 and dist.get_global_rank() == 0:
        origin = terminal(loading.origin) if loading else "a checkpoint"
        print(f"resuming at batch {batch + 1} from {origin}", flush=True)
    try:
        trainer.fit()
    except FileExistsError as error:  # Composer's saver, in its own words (overwrite=True), before the first batch
        if "may conflict with a future checkpoint" not in str(error):
            raise
        raise Refused(f"save_folder {folder} holds checkpoints past where this run starts "
                      f"({Path(str(error).split(' may conflict')[0]).name}, ...): set autoresume: true to continue "
                      "that run, save_overwrite: true to write over them, or give another save_folder") from None
    except KeyboardInterrupt:
        if dist.get_global_rank() == 0:
            saved = narration.saved()
            where = (f"the last checkpoint saved: {saved[-1]}" if saved else "no checkpoint saved yet" if folder
                     else "no save_folder: no checkpoints")
            print(f"\ninterrupted in batch {int(trainer.state.timestamp.batch) + 1}; {terminal(where)}",
                  file=sys.stderr, flush=True)
        raise SystemExit(INTERRUPTED_EXIT) from None
    if cfg.get("selection_report") is not None and dist.get_global_rank() == 0:
        report_selection(cfg, trainer, fsdp is not None)
    return trainer


def report_selection(cfg: DictConfig, trainer: Trainer, sharded: bool) -> None:
    """The yaml's ``selection_report``: what the run's teacher (or teachers, on their ``combine``) keeps of held-out
    shards (``shards``, default the eval loader's) with canaries, the student just trained ranking with it
    (``vocagno.selection``), printed."""
    from vocagno.diagnostics.selection import Settings, run

    section = SelectionReportConfig.of(cfg.selection_report, "selection_report.")
    shards = section.shards or om.select(cfg, "eval_loader.dataset.local")
    skipped = ("the student is sharded (FSDP): run python -m vocagno.selection --student CHECKPOINT" if sharded else
               "it needs a teacher: or teachers: section" if cfg.get("teacher") is None and cfg.get("teachers") is None
               else "no shards: give selection_report.shards or an eval_loader" if shards is None else None)
    if skipped:
        print(f"selection_report skipped: {terminal(skipped)}", flush=True)
        return
    student = trainer.state.model.model
    combine = ((cfg.get("algorithms") or {}).get("vocagno") or {}).get("combine", COMBINE)
    try:
        report = run(shards, scoring_teachers(cfg, "the run's yaml"), Settings.from_config(cfg), student=student,
                     combine=combine,
                     student_name=f"{cfg.run_name} after {int(trainer.state.timestamp.batch)} batches",
                     samples=section.samples, canaries=section.canaries, seed=cfg.seed,
                     device=str(next(student.parameters()).device))
    except (Refused, OSError) as error:  # the run is done and saved: say why there is no report, end as it would
        print(f"selection_report skipped: {terminal(error)}", flush=True)
        return
    print("\n" + report.table(), flush=True)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM (a launcher's, a scheduler's) ends the run as Ctrl-C does, saying where


USAGE = """usage: composer train.py YAML [KEY=VALUE ...]    (a rank on every GPU of the node)
       python train.py YAML [KEY=VALUE ...]      (one process)

Trains as the yaml says, each KEY=VALUE replacing the yaml's value (a dotted key, as the yaml nests it:
max_duration=100ba, model.name_or_path=TinyLlama/TinyLlama_v1.1, loggers.console=null). The keys, what each does
and its default: {keys}
Example: composer train.py yamls/tiny.yaml max_duration=6ba save_folder=runs/x save_interval=3ba autoresume=true"""


def command(argv: list[str], docs: Path | str = "docs/training.md") -> int:
    """``train.py``'s command line (``argv`` without the program): ``YAML [KEY=VALUE ...]``, or ``--help``, whose
    usage names ``docs``, the page of every key. SIGTERM (a launcher's, a scheduler's) ends the run as Ctrl-C does."""
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE.format(keys=docs))
        return 0
    if not argv:
        raise Refused("usage: composer train.py YAML [KEY=VALUE ...] (python train.py --help says more)")
    signal.signal(signal.SIGTERM, _interrupt)
    train(load_config(argv[0], argv[1:]))
    return 0
