"""What a run will do, said at its start in batches and tokens: its length, warm-up, evaluations and checkpoints, from
the yaml's durations in whatever unit they were given (a bare number is epochs to Composer: said so)."""

from __future__ import annotations

import math
from typing import Any

from vocagno.training.sections import LoaderConfig, RunConfig

__all__ = ["batches_of", "plan_line"]


def batches_of(value: Any, batches_an_epoch: int, batch_samples: int, seq_len: int, total: int | None = None,
               key: str = "max_duration") -> int:
    """``value`` (Composer's duration: ``80ba``, ``2ep``, ``1000sp``, ``1e6tok``, ``0.1dur``, or a bare number of
    epochs) in batches; ``dur`` is a fraction of ``total`` batches."""
    from composer.core import Time, TimeUnit

    try:
        time = Time.from_input(value, TimeUnit.EPOCH) if not isinstance(value, str) else Time.from_timestring(value)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{key}: {value!r} is no duration (80ba, 2ep, 1000sp, 1000000tok)") from error
    unit, amount = time.unit, time.value
    if unit == TimeUnit.EPOCH:
        return int(amount * batches_an_epoch)
    if unit == TimeUnit.BATCH:
        return int(amount)
    if unit == TimeUnit.SAMPLE:
        return math.ceil(amount / batch_samples)
    if unit == TimeUnit.TOKEN:
        return math.ceil(amount / (batch_samples * seq_len))
    if unit == TimeUnit.DURATION and total is not None:
        return math.ceil(amount * total)
    raise ValueError(f"{key}: {value!r}: a unit vocagno can't count in batches ({unit.value})")


def plan_line(cfg: Any, samples: int, seq_len: int) -> str:
    """One line: how many batches (and tokens) the run trains, its warm-up, when it evaluates and saves. ``samples``:
    the training shards' samples; ``seq_len``: student tokens a sample."""
    batch = int(cfg.global_train_batch_size)
    drop_last = LoaderConfig.of(cfg.train_loader, "train_loader.").drop_last
    run = RunConfig.of(cfg)
    an_epoch = samples // batch if drop_last else math.ceil(samples / batch)
    total = batches_of(cfg.max_duration, an_epoch, batch, seq_len)
    said = [f"training {total:,} batches of {batch} samples x {seq_len} student tokens ({total * batch * seq_len:,} "
            f"tokens; {an_epoch:,} batches an epoch of {samples:,} samples)"]
    if isinstance(cfg.max_duration, (int, float)) and not isinstance(cfg.max_duration, bool):
        said.append(f"max_duration {cfg.max_duration} is {cfg.max_duration} epochs: a number without a unit is "
                    f"epochs to Composer (write {cfg.max_duration}ba for batches)")
    warmup = (cfg.get("scheduler") or {}).get("t_warmup")
    if warmup is not None:
        said.append(f"warm-up {batches_of(warmup, an_epoch, batch, seq_len, total, 'scheduler.t_warmup'):,} batches")
    if cfg.get("eval_loader") is not None:
        every = batches_of(run.eval_interval, an_epoch, batch, seq_len, total, "eval_interval")
        said.append(f"held-out bits per byte every {every:,} batches" if every else "no held-out evaluation")
    if cfg.get("save_folder"):
        every = batches_of(run.save_interval, an_epoch, batch, seq_len, total, "save_interval")
        said.append(f"a checkpoint every {every:,} batches into {cfg.save_folder}")
    return "; ".join(said)
