"""A save folder made fit for ``autoresume``: a checkpoint whose save was cut short (and the latest link to it)
removed, anything else that is wrong refused; local, or in an object store."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from vocagno.shown import terminal
from vocagno.doors.writing import remove
from vocagno.training.checkpoint.files import (
    LATEST, METADATA, WHOLE, SHARDED, BadCheckpoint, IncompleteCheckpoint, _latest_target, _only_shards, latest_key,
    _missing_shards, _store, _listing, _check_saved, _reason,
)
from vocagno.training.checkpoint.state import check_objects, _check_remote_objects


def repair(folder: str) -> None:
    """Make a save folder resumable after a kill or a full disk during a save: a checkpoint whose save was positively
    cut short (``IncompleteCheckpoint``: a whole file that is an empty or unfinished zip, whose directory comes last;
    a sharded folder holding nothing, or only shards without their ``.metadata``, which comes last) is removed, and
    the latest points to the newest complete checkpoint (one saved whole just before the kill included: Composer
    would otherwise refuse to resume before it). Any other checkpoint that can't be read or is refused stops the
    repair with a ``BadCheckpoint`` naming it, and stays where it is. Local folders: each rank's
    ``latest-rank{r}.pt`` symlink; object stores: ``latest-rank0.pt.symlink``."""
    if "://" in folder:
        _repair_remote(folder)
        return
    newest: dict[int, tuple[tuple[int, int], Path]] = {}
    for path in sorted(Path(folder).glob("ep*-ba*")):
        whole, sharded = WHOLE.fullmatch(path.name), SHARDED.fullmatch(path.name)
        if path.is_symlink() or not (whole and path.is_file() or sharded and path.is_dir()):
            continue
        try:
            _check_saved(path)
        except IncompleteCheckpoint as incomplete:
            print(f"removing {terminal(path)}: an incomplete checkpoint (its save was interrupted): "
                  f"{terminal(incomplete)}", flush=True)
            remove(path)
            continue
        except (BadCheckpoint, OSError) as error:
            raise BadCheckpoint(f"{_reason(error, path)}: autoresume can't tell that this checkpoint's save was cut "
                                f"short, so it stops and leaves it in place (move it out of {folder} to resume "
                                "without it)") from error
        epoch, batch, rank = map(int, (whole or sharded).groups() + ((0,) if sharded else ()))
        if (batch, epoch) > newest.get(rank, ((-1, -1), None))[0]:
            newest[rank] = ((batch, epoch), path)
    # What Composer loads next, each rank its latest (repointed here, or whatever else left one): checked first.
    latests = {Path(folder) / f"latest-rank{rank}.pt": path for rank, (_, path) in newest.items()}
    for latest in sorted(Path(folder).glob("latest-rank*.pt")):
        latests.setdefault(latest, None)
    for latest, path in latests.items():
        try:
            check_objects(path or _latest_target(latest))
        except (BadCheckpoint, OSError) as error:
            raise BadCheckpoint(f"{_reason(error, path or latest)}: autoresume stops before Composer loads it, and "
                                "leaves it in place") from error
    for latest, path in latests.items():
        if path is not None and not (latest.is_symlink() and os.readlink(latest) == path.name):
            latest.unlink(missing_ok=True)
            latest.symlink_to(path.name)


def _repair_remote(uri: str) -> None:
    store, prefix = _store(uri)
    names = set(_listing(store, uri, prefix + "/"))
    complete, incomplete = [], []
    for checkpoint in sorted({name[len(prefix) + 1:].split("/")[0] for name in names}):
        whole, sharded = WHOLE.fullmatch(checkpoint), SHARDED.fullmatch(checkpoint)
        if whole and int(whole.group(3)) == 0 and f"{prefix}/{checkpoint}" in names:
            complete.append(((int(whole.group(2)), int(whole.group(1))), checkpoint))
        elif sharded:
            key = f"{prefix}/{checkpoint}"
            shards = {name for name in names if name.startswith(key + "/")}
            if not _only_shards(name[len(key) + 1:] for name in shards - {f"{key}/{METADATA}"}):
                raise BadCheckpoint(f"{uri}/{checkpoint}: holds objects a sharded save does not write: autoresume "
                                    "can't tell that its upload was cut short, so it stops and leaves it in place")
            # Each rank uploads its own files, in no set order: .metadata without a shard it names is an upload cut
            # short here, where on a local disk (.metadata written after every shard) it is not.
            done = f"{key}/{METADATA}" in shards
            if done:
                with tempfile.TemporaryDirectory() as tmp:
                    store.download_object(f"{key}/{METADATA}", f"{tmp}/{METADATA}")
                    try:
                        done = not _missing_shards(Path(tmp) / METADATA, lambda name: f"{key}/{name}" in shards)
                    except BadCheckpoint as error:
                        raise BadCheckpoint(f"{uri}/{checkpoint}: {str(error).split(': ', 1)[-1]}: autoresume "
                                            "stops and leaves it in place") from error
            (complete if done else incomplete).append(((int(sharded.group(2)), int(sharded.group(1))), checkpoint))
    if incomplete:
        # Composer would fail on the resumed run's first save to the same name (the objects exist, save_overwrite
        # is off): they must go, and deleting objects is not part of Composer's ObjectStore interface.
        names_left = ", ".join(f"{uri}/{name}" for _, name in incomplete)
        if not hasattr(getattr(store, "client", None), "delete_object"):
            raise BadCheckpoint(f"incomplete checkpoints (their upload was interrupted): {names_left}: delete them "
                                "to resume, or set save_overwrite: true")
        for _, name in incomplete:
            print(f"removing {terminal(f'{uri}/{name}')}: an incomplete checkpoint (its upload was interrupted)",
                  flush=True)
            for key in sorted(n for n in names if n.startswith(f"{prefix}/{name}/")):
                store.client.delete_object(Bucket=store.bucket, Key=store.get_key(key))
    # Composer's autoresume downloads a plain latest-rank{r}.pt object before it looks for its .symlink: not Composer's
    # to upload, and it would be loaded unchecked.
    planted = sorted(name for name in names if re.fullmatch(rf"{re.escape(prefix)}/latest-rank\d+\.pt", name))
    if planted:
        raise BadCheckpoint(f"{uri}: {', '.join(planted)}: a latest object Composer's autoresume would load before "
                            "its .symlink; Composer uploads none: autoresume stops (delete it to resume)")
    link = f"{prefix}/{LATEST}.symlink"
    scheme, _, rest = uri.partition("://")
    bucket = f"{scheme}://{rest.split('/', 1)[0]}"
    with tempfile.TemporaryDirectory(prefix="vocagno-repair-") as tmp:
        old = None
        if link in names:
            old = latest_key(store, link, Path(tmp) / "old", bucket)
        newest = f"{prefix}/{max(complete)[1]}" if complete else old
        if newest is None:
            return
        try:  # what Composer downloads and loads next: its objects downloaded and checked first
            _check_remote_objects(store, bucket, newest, Path(tmp) / "check")
        except (BadCheckpoint, OSError) as error:
            raise BadCheckpoint(f"{_reason(error, Path(newest))}: autoresume stops before Composer loads it, and "
                                "leaves it in place") from error
        if newest != old:
            Path(f"{tmp}/new").write_text(newest)
            store.upload_object(link, f"{tmp}/new")
