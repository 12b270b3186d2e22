"""A finished run becomes a Hugging Face model folder people can load, evaluate and publish.

    python -m vocagno.export runs/x/ep0-ba1000-rank0.pt models/x          # a whole checkpoint
    python -m vocagno.export runs/x/ep0-ba1000 models/x --dtype bfloat16   # a sharded one (a folder of .distcp)
    python -m vocagno.export s3://bucket/runs/x models/x --eval evals/x    # a save folder's latest, with results

CHECKPOINT is any checkpoint of ``train.py`` that ``vocagno.training.checkpoint`` reads. OUT gets safetensors weights (in
the run's precision: bfloat16 for ``amp_bf16``, or ``--dtype``), the config, the tokenizer, a generation config,
and a model card (README.md) stating the recipe: student, teacher, tokenizers, selection, tokens trained, the yaml,
and the ``vocagno.eval`` results of ``--eval DIR``. OUT is written whole or not at all; an existing OUT is refused
unless ``--overwrite``. ``AutoModelForCausalLM.from_pretrained(OUT)`` then gives the checkpoint's logits.
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf as om

from vocagno.entry import Parser
from vocagno.algorithms.vocagno_lm import VocAgnoLM
from vocagno.training.checkpoint import DTYPES, BadCheckpoint, fetch, model_from_checkpoint, recipe, recipe_config
from vocagno.shown import md_code, md_fence, md_text, terminal
from vocagno.doors.untrusted import UntrustedFile, read_json
from vocagno.doors.writing import make_readable, publish, remove, staging, write_atomically

__all__ = ["export", "main", "model_card"]


def export(checkpoint: str, out: str, dtype: str | None = None, overwrite: bool = False,
           eval_dir: str | None = None) -> Path:
    """Write the Hugging Face folder ``out`` for ``checkpoint``; see the module's docstring."""
    out_path = Path(out)
    # A local checkpoint, and the one a save folder's latest leads to: OUT may hold neither.
    sources = set() if "://" in checkpoint else {os.path.realpath(checkpoint),
                                                 os.path.realpath(fetch(checkpoint, os.devnull))}
    _check_out(sources, out_path, overwrite)
    results = _eval_results(eval_dir) if eval_dir else None
    model, tokenizer, state = model_from_checkpoint(checkpoint, "cpu", dtype)
    _fill_generation_config(model, tokenizer)

    # Built in a fresh private folder of this run's own (never one found at a fixed name: a link planted there would
    # be written and chmod-ed through), made readable, and renamed into place: OUT is whole or absent.
    built = staging(out_path)
    try:
        model.save_pretrained(built, safe_serialization=True)
        tokenizer.save_pretrained(built)
        model.generation_config.save_pretrained(built)
        card = model_card(checkpoint, out_path.name, state, model, results, eval_dir)
        write_atomically(built / "README.md", card)
        make_readable(built)  # safetensors writes its file private (0600): published files are not
        _check_out(sources, out_path, overwrite)  # again: OUT may have appeared while the model loaded
        try:
            publish(built, out_path, replace=overwrite)
        except FileExistsError as error:
            raise BadCheckpoint(f"{out_path} exists: give another OUT, or --overwrite to replace it") from error
    except BaseException:
        remove(built)
        raise
    return out_path


def _check_out(sources: set[str], out: Path, overwrite: bool) -> None:
    """Refuse an OUT that exists (unless ``overwrite``), or that holds or lies inside one of the local checkpoint
    paths ``sources``: replacing it would delete the run it is exported from."""
    target = os.path.realpath(out)
    for source in sources:
        if os.path.commonpath([source, target]) in (source, target):
            raise BadCheckpoint(f"{out}: OUT holds or lies inside the checkpoint {source}: give an OUT outside it")
    if (out.exists() or out.is_symlink()) and not overwrite:
        raise BadCheckpoint(f"{out} exists: give another OUT, or --overwrite to replace it")


def _fill_generation_config(model, tokenizer) -> None:
    """Generation stops at the tokenizer's EOS and pads with it when it has no pad token (a Llama tokenizer)."""
    config = model.generation_config
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(config, name, None) is None:
            value = getattr(tokenizer, name)
            setattr(config, name, tokenizer.eos_token_id if value is None and name == "pad_token_id" else value)


def _eval_results(folder: str) -> dict[str, Any]:
    """``FOLDER/results.json`` as ``vocagno.eval`` writes it (``checked_results``), its accuracies as floats."""
    from vocagno.eval.benchmarks import checked_results

    path = Path(folder) / "results.json"
    if not path.is_file():
        raise BadCheckpoint(f"--eval {folder}: no results.json there (python -m vocagno.eval --output writes one)")
    try:
        results = read_json(path)
    except UntrustedFile as error:
        raise BadCheckpoint(f"--eval {error}") from error
    if not isinstance(results, dict):
        raise BadCheckpoint(f"--eval {path}: not vocagno.eval's results (a mapping of benchmarks to scores)")
    try:
        return {**results, **checked_results(results, str(path))}
    except UntrustedFile as error:
        raise BadCheckpoint(f"--eval {error}") from None


# Where the card's parts came from, as the card states it.
RECIPE = "the checkpoint's stored recipe"
COMPUTED = "computed by vocagno.export from the weights"


def model_card(checkpoint: str, folder: str, state: dict[str, Any], model, results: dict[str, Any] | None = None,
               eval_dir: str | None = None) -> str:
    """The README.md of an exported model: what it is, how it was trained (the run's yaml, the checkpoint's
    timestamp), how it scored (``vocagno.eval``'s results), each part saying where it came from. Every string of the
    checkpoint, of ``results`` or of a folder's name is written through ``vocagno.shown``: it renders as its
    characters, never as a heading, a cell, a link, HTML or the end of a fence."""
    from vocagno.eval.__main__ import table

    cfg = recipe_config(state, checkpoint)
    timestamp = (state.get("timestamp") or {}).get("Timestamp") or {}
    if cfg is not None and cfg.get("run_name") is not None:
        name, named_by = cfg.get("run_name"), f"{RECIPE} (run_name)"
    else:
        name, named_by = Path(checkpoint.rstrip("/")).name, "the checkpoint's folder name"
    params = sum(p.numel() for p in model.parameters())
    rows = [("name", md_text(name), named_by),
            ("weights", f"{params:,} parameters, {str(model.dtype).removeprefix('torch.')}", COMPUTED),
            ("trained", f"{_count(timestamp, 'token')} student tokens, {_count(timestamp, 'batch')} batches, "
                        f"{_count(timestamp, 'sample')} samples", "the checkpoint's timestamp"),
            ("checkpoint", md_code(checkpoint, cell=True), "vocagno.export's command line")]
    if cfg is not None:
        rows[1:1] = _recipe_rows(cfg)
    tags, how = _about(cfg, results)
    lines = ["---", "library_name: transformers", f"tags: [{', '.join(tags)}]", "---", "",
             f"# {md_text(name)}", "", f"A causal language model trained with vocagno: {how}.", "",
             "| | | from |", "|---|---|---|", *(f"| {key} | {value} | {source} |" for key, value, source in rows), ""]
    if results is not None:
        where = md_code(f"{eval_dir}/results.json")
        lines += ["## Evaluation", "",
                  f"`python -m vocagno.eval` (few-shot chain of thought, greedy; accuracy %), from {where}:", "",
                  table(results), ""]
    use = "\n".join(["from transformers import AutoModelForCausalLM, AutoTokenizer", "",
                     f"model = AutoModelForCausalLM.from_pretrained({_literal(folder)})",
                     f"tokenizer = AutoTokenizer.from_pretrained({_literal(folder)})"])
    lines += ["## Use", "", md_fence(use, "python"), ""]
    if cfg is not None:
        lines += ["## The run's yaml", "", f"`composer train.py` ran with this (resolved), from {RECIPE}:", "",
                  md_fence(recipe(state), "yaml"), ""]
    else:
        lines += ["The checkpoint holds no recipe (it was not written by vocagno's train.py, or by an older one).", ""]
    return "\n".join(lines)


def _count(timestamp: dict, unit: str) -> str:
    """A count of the checkpoint's timestamp as markdown: a number as it is (digits and commas), anything else
    through ``md_text``."""
    value = timestamp.get(unit, 0)
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else md_text(value)


def _literal(text: str) -> str:
    """``text`` as a Python string literal (JSON's, which Python reads the same): a folder's name in the card's
    code can't end its string."""
    return json.dumps(text, ensure_ascii=False)


# What VocAgnoLM selects by when a yaml leaves it to the defaults: the card states every choice.
VOCAGNO_DEFAULTS = {name: parameter.default for name, parameter in inspect.signature(VocAgnoLM).parameters.items()
                    if name in ("topk_ratio", "aggregation", "unmapped", "selection_scope", "selection", "alignment",
                                "teacher_losses")}


# What each of vocagno's algorithms did to the student, as the card says it, and its tag.
METHODS = {
    "vocagno": ("vocagnolm", "VocAgnoLM (Shin et al., ICML 2025), teacher guided language modeling with a teacher of "
                             "another vocabulary"),
    "uld": ("uld", "Universal Logit Distillation from a teacher of another vocabulary"),
    "kld": ("kld", "KL-divergence distillation from a teacher, on the tokens both vocabularies share"),
    "cross_kd": ("cross-vocabulary-kd", "knowledge distillation from a teacher of another vocabulary, its "
                                        "distributions projected onto the student's tokens of the same text"),
}


def _about(cfg, results: dict[str, Any] | None) -> tuple[list[str], str]:
    """The card's tags and what its first sentence says of the run: from its recipe (the algorithms it trained with)
    and its evaluation (``math`` only where math benchmarks were run), not from the paper's setting."""
    from vocagno.eval.benchmarks import BENCHMARKS

    tags = ["vocagno"]
    if cfg is None:
        how = "the checkpoint holds no recipe, so how is not stated"
    else:
        algorithms = cfg.get("algorithms") if isinstance(cfg.get("algorithms"), DictConfig) else {}
        used = [name for name, options in algorithms.items() if options is not None]
        tags += [METHODS[name][0] for name in used if name in METHODS]
        said = [METHODS[name][1] if name in METHODS else md_text(name) for name in used]
        how = "; ".join(said) if said else "plain continual pretraining, without a teacher"
    if results is not None and any(isinstance(results.get(name), (int, float)) for name in BENCHMARKS):
        tags.append("math")  # vocagno.eval's benchmarks are math word problems and exams
    return tags, how


def _recipe_rows(cfg) -> list[tuple[str, str, str]]:
    """The card's rows stated by the recipe: each value of it as markdown (``md_code`` for a name or a path,
    ``md_text`` for the rest), and where it came from."""
    def at(key: str):
        try:
            return om.select(cfg, key, default=None)
        except Exception:  # a recipe whose node on the way is no mapping: not stated
            return None

    def model_of(where: str) -> str:
        if at(f"{where}.name_or_path"):
            return md_code(at(f"{where}.name_or_path"), cell=True)
        config = at(f"{where}.config")
        config = config if isinstance(config, DictConfig) else {}
        return md_text(f"random init: {config.get('model_type')}, {config.get('num_hidden_layers')} layers of "
                       f"{config.get('hidden_size')}")

    rows = [("student", f"{model_of('model')}, tokenizer {md_code(at('tokenizer.name'), cell=True)}", RECIPE)]
    if at("teacher") is not None:
        rows.append(("teacher", f"{model_of('teacher')}, tokenizer {md_code(at('teacher.tokenizer'), cell=True)}",
                     RECIPE))
    algorithms = at("algorithms")
    algorithms = {k: v for k, v in om.to_container(algorithms).items() if v is not None} \
        if isinstance(algorithms, DictConfig) else {}
    if not algorithms:
        rows.append(("method", "plain continual pretraining (every token)", RECIPE))
    for name, options in algorithms.items():
        options = {**(VOCAGNO_DEFAULTS if name == "vocagno" else {}), **(options if isinstance(options, dict) else {})}
        shown = ", ".join(f"{key} {value}" for key, value in options.items())
        rows.append(("method", md_text(name + (f": {shown}" if shown else "")),
                     RECIPE + (" (VocAgnoLM's defaults where it says nothing)" if name == "vocagno" else "")))
    rows.append(("data", _data(at("train_loader.dataset")), RECIPE))
    rows.append(("precision", md_text(at("precision")), RECIPE))
    return rows


def _data(dataset) -> str:
    """Where the run's samples came from: its dataset, or each stream of a mixture with its weight, as markdown."""
    def where(stream) -> str:
        return md_code(stream.get("remote") or stream.get("local"), cell=True)

    if not isinstance(dataset, DictConfig):
        return md_text(dataset)
    streams = dataset.get("streams")
    if not isinstance(streams, DictConfig) or not streams:
        return where(dataset)
    named = []
    for name, stream in streams.items():
        if not isinstance(stream, DictConfig):
            named.append(md_text(f"{name} {stream}"))
            continue
        weights = ", ".join(f"{key} {stream[key]}" for key in ("proportion", "repeat", "choose") if key in stream)
        named.append(f"{md_text(name)} {where(stream)}" + (f" {md_text(f'({weights})')}" if weights else ""))
    return "mixture: " + ", ".join(named)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m vocagno.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a .pt, a sharded checkpoint folder, or a save folder; local or s3://...")
    parser.add_argument("out", help="the Hugging Face folder to write")
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="the weights' dtype (default: the run's precision)")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT when it exists")
    parser.add_argument("--eval", dest="eval_dir", help="a vocagno.eval --output folder: its results go in the card")
    args = parser.parse_args(argv)
    out = export(args.checkpoint, args.out, args.dtype, args.overwrite, args.eval_dir)
    print(terminal(f"exported {args.checkpoint} to {out}"))
    return 0


if __name__ == "__main__":
    from vocagno.entry import run

    run(main)
