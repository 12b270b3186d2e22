"""What a run loads, chosen by vocagno alone: autoresume's latest checkpoint or ``load_checkpoint``'s, copied into a
private folder and checked there before Composer is handed the copy."""

from __future__ import annotations

import atexit
from pathlib import Path
from typing import NamedTuple

from composer.utils import dist, format_name_with_dist, partial_format
from omegaconf import DictConfig

from vocagno.doors.untrusted import reason
from vocagno.doors.writing import remove
from vocagno.errors import Refused
from vocagno.training.builders import plain_section
from vocagno.training.sections import RunConfig
from vocagno.training.checkpoint import BadCheckpoint, has_latest, private_folder, repair, resolve, resolve_remote, take

__all__ = ["LOAD_EVENTS", "Loading", "take_checkpoint"]

# The events of Composer's LoadCheckpoint that come while the Trainer is made, before the private copy goes.
LOAD_EVENTS = ("init", "before_load", "after_load")


class Loading(NamedTuple):
    """The checkpoint a run loads: the key that chose it (``autoresume``, ``callbacks.load_checkpoint.load_path``),
    where it is, and the private copy Composer is handed (its node's, on every rank)."""
    key: str
    origin: str
    copy: str


def take_checkpoint(cfg: DictConfig) -> tuple[Loading | None, Path | None]:
    """The checkpoint this run loads, chosen by vocagno alone as Composer would choose it (autoresume's latest in the
    save folder, repaired first, else ``callbacks.load_checkpoint.load_path``): the first rank resolves it to one
    checkpoint (a save folder's latest followed once) for every node, and each node's first rank copies or downloads
    exactly that into a private folder and checks it there (``take``): Composer loads that copy and nothing else, so
    no file renamed, swapped or planted in a folder or bucket others write is loaded unchecked. Returns the loading
    (None where nothing is loaded) and, on each node's first rank, the private folder to remove once Composer has
    loaded it (removed at exit in any case). A refusal, or any failure to take it, on any rank ends every rank with
    its one line."""
    save_folder = cfg.get("save_folder")
    folder = format_name_with_dist(str(save_folder), cfg.run_name) if save_folder else None
    resumes = bool(RunConfig.of(cfg).autoresume and folder)
    chosen: tuple | None = None
    if dist.get_global_rank() == 0:
        try:
            chosen = _chosen_checkpoint(cfg, folder, resumes)
        except Exception as error:  # noqa: BLE001 (every rank must reach the gather, told why)
            chosen = ("refused", _refusal_line(error, "autoresume" if resumes else "load_path"))
    chosen = dist.all_gather_object(chosen)[0]
    mine, private = None, None
    if chosen is not None and chosen[0] != "refused" and dist.get_local_rank() == 0:
        key, origin = chosen
        try:
            private = private_folder()
            atexit.register(remove, private)
            mine = ("taken", str(take(origin, private)))
        except Exception as error:  # noqa: BLE001
            mine = ("refused", _refusal_line(error, key))
    gathered = dist.all_gather_object(mine)
    refused = chosen[1] if chosen is not None and chosen[0] == "refused" else next(
        (line for state, line in filter(None, gathered) if state == "refused"), None)
    if refused is not None:
        if private is not None:
            remove(private)
        raise Refused(refused)
    if chosen is None:
        return None, None
    leader = gathered[dist.get_global_rank() - dist.get_local_rank()]
    return Loading(chosen[0], chosen[1], leader[1]), private


def _chosen_checkpoint(cfg: DictConfig, folder: str | None, resumes: bool) -> tuple[str, str] | None:
    """(the key that chose it, the one checkpoint it names) of what this run loads, or None. Autoresume's save folder
    is repaired first (once, here: two nodes repairing one folder would race)."""
    if resumes:
        try:
            repair(folder)
        except BadCheckpoint as error:  # it names the checkpoint and why; nothing was deleted
            raise Refused(f"autoresume: {error}") from None
        if has_latest(folder):
            return "autoresume", resolve_remote(folder) if "://" in folder else str(resolve(folder))
    load_checkpoint = plain_section(cfg, "callbacks").get("load_checkpoint") or {}
    load_path = load_checkpoint.get("load_path")
    if load_path is None:
        return None
    event = str(load_checkpoint.get("event", "before_load")).lower()
    if event not in LOAD_EVENTS:
        raise Refused(f"callbacks.load_checkpoint.event: {event}: the checked copy of load_path is loaded while the "
                      f"trainer is made, and removed then: give one of {', '.join(LOAD_EVENTS)}")
    key = "callbacks.load_checkpoint.load_path"
    location = partial_format(str(load_path), run_name=cfg.run_name, rank=0, local_rank=0, node_rank=0)
    try:
        return key, resolve_remote(location) if "://" in location else str(resolve(location))
    except BadCheckpoint as error:
        raise Refused(f"{key}: {error}") from None


def _refusal_line(error: Exception, key: str) -> str:
    """What ends every rank: a refusal's own line, a checkpoint's named by the key that chose it, anything else with
    its type."""
    if isinstance(error, BadCheckpoint):
        return f"{key}: {error}"
    if isinstance(error, Refused):
        return str(error)
    return f"{key}: {reason(error)}"
