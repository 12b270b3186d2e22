"""The training yaml: its keys (llm-foundry's; the model sections' are ``vocagno.teacher.config``'s typed ones), how
it is read (``base:`` variants, command-line overrides, values checked before anything runs), and the teachers its
sections name (``yaml_teacher``). Used by ``train.py`` and by the scoring pass, which builds the teacher a yaml names
(``python -m vocagno.score --config``).
"""

from __future__ import annotations

import inspect
import os
import re
import weakref
from pathlib import Path
from typing import Any, Callable, Iterable

from omegaconf import DictConfig
from omegaconf import OmegaConf as om

from vocagno.core.kernels import KERNELS, check_on_gpu
from vocagno.errors import Refused
from vocagno.teacher.config import ModelConfig, TeacherConfig, check_names, is_dtype
from vocagno.training.sections import LoaderConfig, OptimizerConfig, SchedulerConfig, SelectionReportConfig

__all__ = ["SCHEMA", "load_config", "published_yaml", "keyword_names", "plain", "yaml_teacher", "scoring_teacher",
           "scoring_teachers"]

# The keys a yaml may hold; a nested dict names the keys of that section, None leaves a section free-form. The
# defaults are the typed sections' (vocagno.training.sections, vocagno.teacher.config).
LOADER_KEYS = dict.fromkeys(LoaderConfig.keys())
SCHEMA: dict[str, Any] = {
    "variables": None,
    "run_name": None,
    "seed": None,
    "tokenizer": {"name": None},
    "model": dict.fromkeys(ModelConfig.keys()),
    "teacher": dict.fromkeys(TeacherConfig.keys()),
    "teachers": None,  # several teachers: NAME -> teacher:'s keys (checked by builders.set_of_teachers)
    "train_loader": LOADER_KEYS,
    "eval_loader": LOADER_KEYS,
    "optimizer": dict.fromkeys(OptimizerConfig.keys()),
    "scheduler": dict.fromkeys(SchedulerConfig.keys()),
    "algorithms": None,
    "precision": None,
    "compile_config": None,  # torch.compile's options for the student (Composer's); null: not compiled
    "fsdp_config": None,
    "max_duration": None,
    "global_train_batch_size": None,
    "device_train_microbatch_size": None,
    "device_eval_batch_size": None,
    "eval_interval": None,
    "eval_subset_num_batches": None,
    "save_folder": None,
    "save_interval": None,
    "save_num_checkpoints_to_keep": None,
    "save_overwrite": None,
    "autoresume": None,
    "loggers": None,  # names checked by build_loggers
    "callbacks": None,
    "progress_bar": None,
    "console_log_interval": None,
    "dist_timeout": None,
    # After training: what the teacher keeps of held-out shards with canaries (vocagno.selection), with the student.
    "selection_report": dict.fromkeys(SelectionReportConfig.keys()),
}
REQUIRED = ("run_name", "seed", "tokenizer", "model", "train_loader", "optimizer", "optimizer.lr", "scheduler",
            "scheduler.t_warmup", "max_duration", "global_train_batch_size", "device_train_microbatch_size")


def load_config(yaml_path: str, overrides: list[str]) -> DictConfig:
    layers = [*_layers(Path(yaml_path)), ("the command line", om.from_dotlist(overrides))]
    try:
        cfg = om.merge(*(layer for _, layer in layers))
    except TypeError as error:  # omegaconf: a list given where the base has a mapping, or the other way round
        raise ValueError(f"{yaml_path}: a key given as another kind of value than its base gives it "
                         f"({error})") from None
    _check_keys(cfg, SCHEMA, "")
    teachers = cfg.get("teachers")
    for name in teachers or ():
        if isinstance(teachers[name], DictConfig):  # else builders.set_of_teachers names what it needs
            _check_keys(teachers[name], SCHEMA["teacher"], f"teachers.{name}.")
    missing = [key for key in REQUIRED if om.select(cfg, key, throw_on_resolution_failure=False) is None]
    if missing:
        raise ValueError(f"{yaml_path}: missing required keys: {', '.join(missing)}")
    _drop_foreign_conversions(cfg, layers)
    unresolved = om.to_container(cfg, resolve=False)
    om.resolve(cfg)
    _record_environment(cfg, unresolved)
    _check_values(cfg)
    _check_weight_decay(cfg.optimizer)
    return cfg


# An interpolation that reads the environment, and the names of the variables it reads.
_ENVIRONMENT = re.compile(r"\$\{\s*oc\.env\s*:\s*([^,}\s]*)")


def _leave_out_environment(node: Any) -> Any:
    """A plain (unresolved) yaml with every value that reads the environment replaced by a mark naming what it reads."""
    if isinstance(node, dict):
        return {key: _leave_out_environment(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_leave_out_environment(value) for value in node]
    names = _ENVIRONMENT.findall(node) if isinstance(node, str) else []
    return f"<left out: read from the environment ({', '.join(names)})>" if names else node


def _leaves(node: Any, where: tuple = ()) -> Iterable[tuple[tuple, Any]]:
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else None
    if items is None:
        yield where, node
        return
    for key, value in items:
        yield from _leaves(value, (*where, key))


# For each config load_config made, by id: the values published_yaml leaves out, by their path, each with the mark it
# shows instead. Kept beside the config, which stays resolved for the run, and dropped with it.
_LEFT_OUT: dict[int, dict[tuple, Any]] = {}


def _record_environment(cfg: DictConfig, unresolved: dict) -> None:
    """Record which of ``cfg``'s resolved values came from the environment, read directly or built on one (a copy of a
    section that holds one included): each value whose resolution with the environment's values left out differs."""
    if not _ENVIRONMENT.search(str(unresolved)):
        return
    try:
        marked = om.create(_leave_out_environment(unresolved))
        om.resolve(marked)
        shown = dict(_leaves(om.to_container(marked, resolve=False)))
    except Exception:  # a resolver that can't take a mark: every value built by interpolation is left out
        shown = {where: "<left out: built by an interpolation that reads the environment>"
                 for where, value in _leaves(unresolved) if isinstance(value, str) and "${" in value}
    left_out = {where: shown.get(where, "<left out: read from the environment>")
                for where, value in _leaves(om.to_container(cfg, resolve=False)) if shown.get(where, value) != value}
    if left_out:
        _LEFT_OUT[id(cfg)] = left_out
        weakref.finalize(cfg, _LEFT_OUT.pop, id(cfg), None)


def published_yaml(cfg: DictConfig) -> str:
    """The run's yaml as its checkpoints carry it (``RunRecipe``), and so as an exported model card shows it: resolved,
    but every value read from the environment (``${oc.env:NAME}``: a token, a key, a bucket) left out and named
    instead, as ``<left out: read from the environment (NAME)>``, and every value built on one (``${hf_token}``,
    ``s3://${oc.env:B}/x``, a copy of a section that holds one) with it. A checkpoint is a file people share, and a
    card is published. The run itself reads the values (``cfg`` stays resolved)."""
    plain = om.to_container(cfg, resolve=True)
    for where, mark in _LEFT_OUT.get(id(cfg), {}).items():
        node = plain
        try:
            for key in where[:-1]:
                node = node[key]
            node[where[-1]]  # noqa: B018 (a path the run's own changes took away is left as it is)
            node[where[-1]] = mark
        except (KeyError, IndexError, TypeError):
            pass
    return om.to_yaml(om.create(plain))


# The yamls of a checkout (yamls/): named in a refusal where a yaml of the same name is not found.
SHIPPED_YAMLS = Path(__file__).resolve().parents[2] / "yamls"

# The most base: links a yaml's chain may follow: the repo's deepest is 2 (tiny_uld.yaml -> tiny.yaml -> none); each is
# a file read and merged, and a chain someone else wrote could be thousands deep, past Python's recursion limit.
MAX_BASE_DEPTH = 32


def _layers(path: Path) -> list[tuple[str, DictConfig]]:
    """A yaml and the yamls its ``base:`` chain names (each a path beside the one naming it), the farthest base first,
    each with its path: merged in that order, a variant says only what differs from its base. A null entry of
    ``algorithms``, ``loggers`` or ``callbacks`` turns the base's off. A chain of more than ``MAX_BASE_DEPTH`` links,
    or one that comes back to a yaml already in it, is refused (``Refused``) naming it."""
    layers: list[tuple[str, DictConfig]] = []
    named = [str(path)]  # the chain as written: the yaml given, then each base: as its yaml gives it
    seen: set[Path] = set()
    while True:
        if path.resolve() in seen:
            raise Refused(f"{layers[-1][0]}: its base: chain comes back to itself: {' -> '.join(named)} (remove "
                          "the base: that closes the loop)")
        if len(layers) > MAX_BASE_DEPTH:
            shown = [*named[:4], "...", *named[-2:]]
            raise Refused(f"{named[0]}: its base: chain names more than {MAX_BASE_DEPTH} bases "
                          f"({' -> '.join(shown)}): make a variant's base: one that holds what its chain merged")
        if not path.is_file():
            shipped = SHIPPED_YAMLS / path.name
            if layers:
                where = (f"; for the shipped one write base: {shipped}" if shipped.is_file() and shipped != path
                         else "")
                raise Refused(f"{layers[-1][0]}: base: {named[-1]} names no yaml file: looked for {path} (a base: is "
                              f"a path beside the yaml that names it){where}")
            where = f" (the shipped one: {shipped})" if shipped.is_file() and shipped.resolve() != path.resolve() else ""
            raise Refused(f"{path}: no such yaml file{where}")
        seen.add(path.resolve())
        cfg = om.load(path)
        base = cfg.pop("base", None)
        layers.append((str(path), cfg))
        if base is None:
            return layers[::-1]
        named.append(str(base))
        path = path.parent / base


def _raw(layer: DictConfig, key: str) -> Any:
    """``key`` (dotted) as one layer writes it, interpolations unresolved; None where the layer leaves it out."""
    node: Any = om.to_container(layer, resolve=False)
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


_REFERENCE = re.compile(r"\$\{([\w.]+)\}")


def _naming(layers: list[tuple[str, DictConfig]], key: str) -> tuple[list[str], int]:
    """The keys that name ``key``'s value (itself, and where its value is only a reference, ``${variables.data}``, what
    it refers to, and so on) and the last layer giving any of them: the one that names it."""
    chain: list[str] = []
    while len(chain) < 16 and key not in chain:  # a chain this long, or a cycle, is no data path
        chain.append(key)
        given = [i for i, (_, layer) in enumerate(layers) if _raw(layer, key) is not None]
        if not given:
            break
        value = _raw(layers[given[-1]][1], key)
        reference = _REFERENCE.fullmatch(value) if isinstance(value, str) else None
        if reference is None:
            break
        key = reference.group(1)
    namer = max((i for i, (_, layer) in enumerate(layers) for k in chain if _raw(layer, k) is not None), default=-1)
    return chain, namer


def _without(layer: DictConfig, keys: list[str]) -> DictConfig:
    """A copy of ``layer`` without ``keys`` (dotted), nothing in it resolved."""
    plain = om.to_container(layer, resolve=False)
    for key in keys:
        *parents, last = key.split(".")
        node = plain
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return om.create(plain)


def _folder(cfg: DictConfig, key: str) -> str | None:
    """``key``'s value as ``cfg`` resolves it, a local path made absolute; None where it doesn't resolve it."""
    value = om.select(cfg, key, throw_on_resolution_failure=False)
    if value is None:
        return None
    return str(value) if "://" in str(value) else os.path.normpath(os.path.abspath(str(value)))


def _drop_foreign_conversions(cfg: DictConfig, layers: list[tuple[str, DictConfig]]) -> None:
    """A loader's ``convert_if_missing`` converts its ``input`` only into the folder the yaml giving that input names
    (``dataset.local``, as that yaml and the ones before it name it; the yamls after it may change the values it is
    made of, ``variables.seq_len``, not name it anew): a variant or override that names another folder does not
    inherit its base's corpus. Where it would, the conversion is replaced by a note the missing-folder error shows
    (``train.py``)."""
    for section in ("train_loader", "eval_loader"):
        if om.select(cfg, f"{section}.convert_if_missing") is None or om.select(cfg, f"{section}.dataset") is None:
            continue
        givers = [i for i, (_, layer) in enumerate(layers) if _raw(layer, f"{section}.convert_if_missing.input")
                  is not None]
        chain, namer = _naming(layers, f"{section}.dataset.local")
        if not givers or namer <= givers[-1]:  # no input: train.py asks for it
            continue
        converter = givers[-1]
        # The folder as the yamls up to the one giving the input name it: the later ones' naming keys left out.
        theirs = om.merge(*(_without(layer, chain) if i > converter else layer for i, (_, layer) in enumerate(layers)))
        folder = _folder(theirs, f"{section}.dataset.local")
        if folder is not None and folder == _folder(cfg, f"{section}.dataset.local"):  # the same folder, named again
            continue
        named = om.select(theirs, f"{section}.dataset.local", throw_on_resolution_failure=False)
        cfg[section].convert_if_missing = {"not_for": (
            f"{layers[converter][0]}'s {section}.convert_if_missing converts its input into {named}, and "
            f"{layers[namer][0]} names another folder")}


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_positive_int(value: Any) -> bool:
    return _is_number(value) and isinstance(value, int) and value > 0


# Values checked before anything runs: a key given with the wrong kind of value is one line naming the key. Booleans
# must be real booleans: the string "false" is truthy, and trust_remote_code: "false" would run a folder's code.
VALUE_CHECKS: dict[str, tuple[Any, str]] = {
    "model.trust_remote_code": (_is_bool, "true or false"),
    "teacher.trust_remote_code": (_is_bool, "true or false"),
    "teacher.check_scored_by": (_is_bool, "true or false"),
    "autoresume": (_is_bool, "true or false"),
    "save_overwrite": (_is_bool, "true or false"),
    "train_loader.drop_last": (_is_bool, "true or false"),
    "optimizer.master_weights": (_is_bool, "true or false"),
    "selection_report.samples": (_is_positive_int, "a positive integer"),
    "selection_report.canaries": (lambda v: _is_number(v) and 0 <= v < 1,
                                  "the share of noise documents, in [0, 1) (0: none)"),
    "eval_loader.drop_last": (_is_bool, "true or false"),
    "train_loader.dataset.shuffle": (_is_bool, "true or false"),
    "model.dtype": (is_dtype, "a torch dtype (float32, bfloat16, float16)"),
    "teacher.dtype": (is_dtype, "a torch dtype (float32, bfloat16, float16)"),
    "model.kernels": (lambda v: v in KERNELS, " or ".join(KERNELS)),
    "teacher.kernels": (lambda v: v in KERNELS, " or ".join(KERNELS)),
    "optimizer.lr": (lambda v: _is_number(v) and v > 0, "a positive number"),
    "optimizer.weight_decay": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
    "global_train_batch_size": (_is_positive_int, "a positive integer"),
    "device_train_microbatch_size": (lambda v: _is_positive_int(v) or v == "auto", "a positive integer or auto"),
    "variables.seq_len": (lambda v: _is_positive_int(v) and v >= 2, "an integer >= 2"),
}


def _check_values(cfg: DictConfig) -> None:
    for key, (valid, expected) in VALUE_CHECKS.items():
        value = om.select(cfg, key)
        if value is not None and not valid(value):
            raise ValueError(f"{key} must be {expected}, got {value!r}")


# Composer's DecoupledAdamW multiplies the weights by (1 - weight_decay * lr / initial_lr) every step: its decay is
# not scaled by the LR as torch's AdamW's is (lr * weight_decay), so AdamW's 0.1 at LR 8e-5 is 8e-6 here.
MAX_DECOUPLED_DECAY = 1e-3


def _check_weight_decay(optimizer: DictConfig) -> None:
    decay = OptimizerConfig.of(optimizer, "optimizer.").weight_decay
    if decay > MAX_DECOUPLED_DECAY:
        raise ValueError(
            f"optimizer.weight_decay={decay} would shrink every weight by {decay:.1%} per step: decoupled_adamw's "
            "decay is not multiplied by the learning rate (torch AdamW's weight_decay=0.1 at lr=8e-5 is "
            f"weight_decay=8e-6 here); values above {MAX_DECOUPLED_DECAY} are refused"
        )


def _check_keys(cfg: DictConfig, schema: dict[str, Any], where: str) -> None:
    check_names(where, cfg, schema)
    for key in cfg:
        if isinstance(schema[key], dict) and isinstance(cfg[key], DictConfig):
            _check_keys(cfg[key], schema[key], f"{where}{key}.")


def keyword_names(function: Callable[..., Any]) -> list[str] | None:
    """The keyword arguments ``function`` (a class: its ``__init__``) takes by name; None where it takes any
    (``**kwargs``), so only its own code can say what it accepts."""
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"]


def plain(value: Any) -> Any:
    """A yaml's mapping as a plain dict (what torch.compile's options must be); any other value as it is."""
    return om.to_container(value) if isinstance(value, DictConfig) else value


def yaml_teacher(cfg: DictConfig, name: str | None = None, source: str = "", device: str | None = None):
    """The ``Teacher`` of a training config's ``teachers:`` entry ``name``, or of its ``teacher:`` section (named
    ``name`` where given), as a run of it builds it (``Teacher.from_config``: a config-built one's weights from the
    yaml's ``seed``), checked before it loads: a named teacher needs its tokenizer (which of a set reads the shards'
    tokens depends on it), and its speed options (and, given a ``device``, its kernels there) are checked. Its
    tokenizer is loaded where the section names one. ``source`` (the scoring pass's yaml) begins each refusal and
    labels a config-built teacher."""
    from vocagno.core.tokenization import load_tokenizer
    from vocagno.teacher.teacher import Teacher

    several = cfg.get("teachers") is not None
    where = f"teachers.{name}" if several else "teacher"
    named = f"{source}: {where}" if source else where
    section = cfg.teachers[name] if several else cfg.teacher
    if name is not None and not section.get("tokenizer"):
        raise Refused(f"{named}: needs its tokenizer")
    config = TeacherConfig.of(section, f"{where}.")
    config.check_speed(named)
    if device is not None:
        check_on_gpu(config.kernels, device, f"{named}.kernels")
    # A teacher alone named without a tokenizer reads the shards' teacher tokens: its folder may hold weights alone.
    tokenizer = load_tokenizer(config.tokenizer) if config.tokenizer else None
    label = f"{source}: {where} (config, seed {cfg.seed})" if source and not config.name_or_path else ""
    return Teacher.from_config(config, name, cfg.seed, tokenizer, label, where=named)


def scoring_teacher(cfg: DictConfig, source: str, name: str | None = None, device: str | None = None):
    """The scoring pass's ``Teacher`` of a loaded training config's ``teacher:`` section (or of its ``teachers:``,
    ``name``'s), as ``train.py`` builds it (``yaml_teacher``); ``source``, the yaml, names it in refusals and labels a
    config-built one. Its speed options are checked (against ``device``, when given) before it loads."""
    from vocagno.data.shards import check_teacher_name

    if cfg.get("teachers") is not None:
        if name not in cfg.teachers:
            raise Refused(f"{source} has teachers: {', '.join(cfg.teachers)}: name the one to score "
                          "(--name)" if name is None else f"{source} has no teachers.{name}")
    elif cfg.get("teacher") is None:
        raise Refused(f"{source} has no teacher: section")
    if name is not None:  # a yaml's key becomes a column and a folder name
        try:
            check_teacher_name(name)
        except ValueError as error:
            raise Refused(f"{source}: {error}") from None
    return yaml_teacher(cfg, name, source, device)


def scoring_teachers(cfg: DictConfig, source: str):
    """A training config's scoring ``Teacher``, or its ``teachers:`` as a list (``scoring_teacher``)."""
    if cfg.get("teachers") is not None:
        return [scoring_teacher(cfg, source, name) for name in cfg.teachers]
    return scoring_teacher(cfg, source)
