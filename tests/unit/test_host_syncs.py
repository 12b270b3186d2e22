"""VocAgnoLM's step makes the host wait for the device nowhere: the cached and online steps, in each selection scope,
read no tensor on the host, make no tensor of a data-dependent shape, make no tensor from host data, copy nothing
between host and device and mix no host tensor into the device's work.

A CPU has no device to wait for, so the device here is PyTorch's "meta" device: the microbatches and the student live
there, as Composer moves them to a GPU (a microbatch at a time, after BEFORE_TRAIN_BATCH; the whole batch stays on the
host until then), and ``HostReads`` (a dispatch mode over every op the step runs) refuses what would wait for a GPU
or fail on one. Reading a meta tensor raises by itself. The events run in Composer's order; AFTER_TRAIN_BATCH, where
the step's counts are read once for the loggers, is left out. Last, the teacher's forward timed on a GPU without a
wait (``VocAgnoLM.teacher_timing``), with CUDA's events stood in for."""

from __future__ import annotations

import contextlib
import traceback
from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch
from composer.core import Event, Precision
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from vocagno.algorithms.step_metrics import StepMetrics
from vocagno.algorithms.vocagno_lm import VocAgnoLM
from vocagno.data.batch import ALIGN_END, ALIGN_START, STREAM, TEACHER_ATTENTION_MASK, TEACHER_INPUT_IDS, TEACHER_LOSS
from vocagno.teacher.model import TeacherScorer

aten = torch.ops.aten
HOST = torch.device("cpu")
DEVICE = torch.device("meta")  # stands in for the GPU
DATA_DEPENDENT = {aten.nonzero.default, aten.masked_select.default, aten._unique2.default, aten.unique_dim.default,
                  aten.unique_consecutive.default, aten.repeat_interleave.Tensor}


def _where() -> str:
    """The innermost line of vocagno's own code on the stack."""
    frames = [f for f in traceback.extract_stack() if "/vocagno/" in f.filename and "/tests/" not in f.filename]
    return f"{frames[-1].filename.split('/vocagno/', 1)[1]}:{frames[-1].lineno}" if frames else "?"


class HostReads(TorchDispatchMode):
    """Refuses, naming vocagno's line: a tensor read on the host (``item``, ``bool``, ``int``, ``float``: aten's
    ``_local_scalar_dense``), an op whose output shape depends on the data (``nonzero``, masks as indices), a tensor
    made from host data (``torch.tensor``: on a GPU, a copy that waits), a copy between host and device, and an op
    that mixes a host tensor (other than a 0-dim scalar, which PyTorch passes by value) or a host generator into the
    device's work (on a GPU: an error or a copy)."""

    generators = True  # whether a generator's device is checked

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        why = self._why(func, args, kwargs)
        if why:
            raise AssertionError(f"{why}: {func} at vocagno/{_where()}")
        return func(*args, **kwargs)

    @staticmethod
    def _why(func, args, kwargs) -> str | None:
        if func is aten._local_scalar_dense.default:
            return "a tensor read on the host"
        if func in DATA_DEPENDENT:
            return "an output shape that depends on the data"
        if func is aten.lift_fresh.default:
            return "a tensor made from host data"
        flat = [*args, *kwargs.values()]
        flat += [t for a in args if isinstance(a, (list, tuple)) for t in a]
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        if func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default) and any(
                t is not None and t.dtype == torch.bool for t in args[1]):
            return "a mask as an index (its output shape depends on the data)"
        devices = {t.device.type for t in tensors if t.dim() > 0}
        wanted = kwargs.get("device")
        if func in (aten._to_copy.default, aten.copy_.default) and wanted is not None and tensors and \
                torch.device(wanted).type != tensors[0].device.type:
            return "a copy between host and device"
        if func is aten.copy_.default and len({t.device.type for t in tensors}) > 1:
            return "a copy between host and device"
        if len(devices) > 1:
            return f"host and device tensors in one op ({sorted(devices)})"
        generator = kwargs.get("generator") if HostReads.generators else None
        target = torch.device(wanted) if wanted is not None else tensors[0].device if tensors else HOST
        if generator is not None and generator.device.type != target.type:
            return "a generator of another device"
        return None


@contextlib.contextmanager
def no_host_reads(monkeypatch):
    """``HostReads``, and what it does not see refused too: ``tolist``/``numpy``, which read a tensor without an op
    of aten's, and ``torch.tensor`` given a device, which copies below the dispatch modes."""

    def refuse(what):
        def refused(*args, **kwargs):
            raise AssertionError(f"{what} at vocagno/{_where()}")
        return refused

    with monkeypatch.context() as patch:
        for name in ("tolist", "numpy", "__array__"):
            patch.setattr(torch.Tensor, name, refuse(f"a tensor read on the host: Tensor.{name}"))
        # made on the host and copied, out of the dispatch mode's sight when given a device
        for name in ("tensor", "as_tensor", "from_numpy"):
            patch.setattr(torch, name, refuse(f"a tensor made from host data: torch.{name}"))
        with HostReads():
            yield


class Student(torch.nn.Module):
    """A causal LM's shape without a framework's own host reads: ``forward(batch)`` -> logits ``[B, N, V]``."""

    def __init__(self, vocab: int = 50):
        super().__init__()
        with torch.device(DEVICE):
            self.embed, self.head = torch.nn.Embedding(vocab, 16), torch.nn.Linear(16, vocab)

    def forward(self, batch):
        return self.head(torch.tanh(self.embed(batch["input_ids"])))


def cached_batch(rows: int = 8, n: int = 24, m: int = 30, streams: bool = False) -> dict[str, torch.Tensor]:
    """A batch as the loader gives scored shards' rows (on the host): student tokens and labels, each token's teacher
    range (a few unmapped), the teacher's tokens and its cached losses (NaN at its first position and its padding)."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (rows, n), generator=generator)
    labels = ids.clone()
    labels[-1, n - 5 :] = -100  # a padded row
    start = torch.arange(n).expand(rows, n) * m // n
    end = (start + 1 + torch.randint(0, 2, (rows, n), generator=generator)).clamp(max=m)
    end[:, ::7] = start[:, ::7]  # unmapped
    loss = torch.rand(rows, m, generator=generator) * 4
    loss[:, 0] = float("nan")
    teacher_mask = torch.ones(rows, m, dtype=torch.long)
    teacher_mask[-1, m - 4 :] = 0
    loss[-1, m - 4 :] = float("nan")
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels, ALIGN_START: start,
             ALIGN_END: end, TEACHER_INPUT_IDS: torch.randint(0, 90, (rows, m), generator=generator),
             TEACHER_ATTENTION_MASK: teacher_mask, TEACHER_LOSS: loss}
    if streams:
        batch[STREAM] = torch.arange(rows) % 2
    return batch


class OnDevice:
    """Composer's device, moving to ``DEVICE`` (as Composer's GPU moves a batch: without waiting, so not refused)."""

    def batch_to_device(self, batch):
        with _disable_current_modes():
            return {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    def tensor_to_device(self, tensor):
        with _disable_current_modes():
            return tensor.to(DEVICE)


def split(batch, size):
    """Composer's split of a dict batch into microbatches (``split_batch``: every tensor along its rows)."""
    rows = batch["input_ids"].shape[0]
    return [{k: v[i : i + size] if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            for i in range(0, rows, size)]


def a_step(algorithm: VocAgnoLM, batch, microbatch: int, streams=None):
    """One training step's events of ``algorithm`` in Composer's order, with the microbatches on ``DEVICE``; the
    microbatches' loss dicts."""
    state = SimpleNamespace(batch=batch, device_train_microbatch_size=microbatch, device=OnDevice(),
                            precision=Precision.FP32, precision_config=None, model=Student(),
                            rank_zero_seed=0, timestamp=SimpleNamespace(batch=3), outputs=None, loss=None,
                            train_dataloader=SimpleNamespace(dataset=SimpleNamespace(stream_names=streams)))
    logger, losses = None, []
    algorithm.apply(Event.AFTER_DATALOADER, state, logger)
    whole = state.batch
    algorithm.apply(Event.BEFORE_TRAIN_BATCH, state, logger)
    for piece in split(whole, microbatch):
        state.batch = state.device.batch_to_device(piece)
        algorithm.apply(Event.BEFORE_FORWARD, state, logger)
        state.outputs = state.model(state.batch)
        algorithm.apply(Event.AFTER_FORWARD, state, logger)
        algorithm.apply(Event.AFTER_LOSS, state, logger)
        losses.append(state.loss)
    return losses


@pytest.mark.parametrize("scope", ["batch", "microbatch", "sequence"])
def test_a_cached_step_reads_nothing_on_the_host_and_copies_nothing(monkeypatch, scope):
    algorithm = VocAgnoLM(teacher="tiny-math-teacher", teacher_losses="cached", selection_scope=scope)
    batch = cached_batch()
    with no_host_reads(monkeypatch):
        losses = a_step(algorithm, batch, microbatch=4)
    assert len(losses) == 2 and all(loss["total"].device == DEVICE for loss in losses)


@pytest.mark.parametrize("scope", ["batch", "microbatch"])
def test_a_random_selection_draws_on_the_device_from_a_generator_there(monkeypatch, scope):
    """The control draws its tokens where the scores are, from a generator made there (one on the host would be
    refused by the GPU's ``torch.rand``). A generator can't be made on the meta device: one of the CPU's stands in,
    and the generator's device is checked where it is made, not where it draws."""
    made, real = [], torch.Generator

    def generator(device="cpu"):
        made.append(torch.device(device))
        return real("cpu" if torch.device(device) == DEVICE else device)

    algorithm = VocAgnoLM(teacher="tiny-math-teacher", teacher_losses="cached", selection_scope=scope,
                          selection="random")
    batch = cached_batch()
    monkeypatch.setattr(torch, "Generator", generator)
    monkeypatch.setattr(HostReads, "generators", False)
    with no_host_reads(monkeypatch):
        losses = a_step(algorithm, batch, microbatch=4)
    assert made == [DEVICE] and len(losses) == 2


class Teacher(torch.nn.Module):
    """A causal LM's surface as ``TeacherScorer`` reads it (``base_model``'s hidden states, the LM head), without a
    framework's own host reads."""

    def __init__(self, vocab: int = 90):
        super().__init__()
        with torch.device(DEVICE):
            self.embed, self.head = torch.nn.Embedding(vocab, 16), torch.nn.Linear(16, vocab, bias=False)

    @property
    def base_model(self):
        return lambda input_ids, attention_mask, use_cache: SimpleNamespace(
            last_hidden_state=torch.tanh(self.embed(input_ids)))

    def get_output_embeddings(self):
        return self.head


@pytest.mark.parametrize("scope", ["microbatch", "sequence", "batch"])
def test_an_online_step_reads_nothing_on_the_host_and_copies_nothing(monkeypatch, scope):
    """The teacher scores each microbatch on the device (its LM head in chunks of 7 tokens, so several)."""
    algorithm = VocAgnoLM(teacher=Teacher(), selection_scope=scope)
    algorithm.scorer = TeacherScorer(Teacher(), chunk_size=7)
    batch = cached_batch()
    del batch[TEACHER_LOSS]
    with no_host_reads(monkeypatch):
        losses = a_step(algorithm, batch, microbatch=4)
    assert len(losses) == 2 and all(loss["total"].device == DEVICE for loss in losses)


def test_a_mixtures_step_counts_its_streams_on_the_device(monkeypatch):
    """A mixture's per-stream counts are made where the microbatches are (the whole batch, at BEFORE_TRAIN_BATCH, is
    still on the host): on a GPU, counts on the host would take the device's rows in an error, and the ranks' sum over
    NCCL needs them on the device."""
    algorithm = VocAgnoLM(teacher="tiny-math-teacher", teacher_losses="cached", selection_scope="microbatch")
    batch = cached_batch(streams=True)
    with no_host_reads(monkeypatch):
        a_step(algorithm, batch, microbatch=4, streams=["one", "two"])
    assert algorithm._metrics.streams.device == DEVICE


def test_step_metrics_sums_its_microbatches_on_their_device_and_logs_the_shares():
    """StepMetrics on the host: the counts of two microbatches add up, logged as shares once."""
    metrics = StepMetrics()
    state = SimpleNamespace(batch={STREAM: torch.tensor([0, 1, 1])},
                            train_dataloader=SimpleNamespace(dataset=SimpleNamespace(stream_names=["a", "b"])))
    metrics.start(state)
    assert metrics.per_stream
    metrics.add(torch.tensor([0, 1]), {"row_counts": torch.tensor([[4.0, 2.0], [3.0, 3.0]])})
    metrics.add(torch.tensor([1]), {"row_counts": torch.tensor([[2.0, 1.0]])})
    logged = {}
    metrics.log(state, SimpleNamespace(log_metrics=logged.update), ["teacher"])
    assert logged == {"vocagno/stream_share/a": 1 / 3, "vocagno/stream_share/b": 2 / 3,
                      "vocagno/kept_fraction/a": 0.5, "vocagno/kept_fraction/b": 0.8}


class OnGpu(torch.Tensor):
    """A CPU tensor that says it is on a GPU (and so does every tensor made from it), for the timing's GPU paths."""

    @property
    def is_cuda(self):
        return True


class CudaEvent:
    """``torch.cuda.Event``, as a CPU has none: each records in turn; 5 ms between a start and its end."""

    made: ClassVar[list] = []

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.recorded = self.synchronized = False
        CudaEvent.made.append(self)

    def record(self):
        self.recorded = True

    def synchronize(self):
        self.synchronized = True

    def elapsed_time(self, end):
        assert self.recorded and end.recorded
        return 5.0


@pytest.mark.parametrize("timing", ["wall", "device"])
def test_the_teachers_forward_is_timed_by_events_without_a_wait_or_by_the_wall_clock_after_one(monkeypatch, timing):
    """``device``: CUDA events around each microbatch's teacher forward, read once at BATCH_END (the last one waited
    for there, when Composer has read the step's loss already); no synchronisation inside the step. ``wall``: the
    host's clock, after a synchronisation each microbatch (the default)."""
    waits, logged = [], {}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: waits.append(args))
    monkeypatch.setattr(torch.cuda, "Event", CudaEvent)
    monkeypatch.setattr(CudaEvent, "made", [])
    algorithm = VocAgnoLM(teacher=Teacher(), selection_scope="microbatch")
    algorithm.teacher_timing = timing
    scorer = TeacherScorer(Teacher().to_empty(device="cpu"))
    algorithm.scorer = lambda ids, mask: scorer(ids, mask).as_subclass(OnGpu)
    batch = {k: v.as_subclass(OnGpu) for k, v in cached_batch().items() if k != TEACHER_LOSS}
    for begin in (0, 4):
        assert algorithm._teacher_loss({k: v[begin : begin + 4] for k, v in batch.items()}).shape == (4, 30)
    algorithm.apply(Event.BATCH_END, SimpleNamespace(), SimpleNamespace(log_metrics=logged.update))
    if timing == "device":
        assert waits == [] and [e.synchronized for e in CudaEvent.made] == [False] * 3 + [True]
        assert logged["vocagno/teacher_forward_seconds"] == pytest.approx(0.010)
    else:
        assert len(waits) == 2 and CudaEvent.made == []
        assert 0 < logged["vocagno/teacher_forward_seconds"] < 60
    assert algorithm._teacher_events == () and algorithm._teacher_seconds == 0.0


def test_an_unknown_teacher_timing_is_refused_at_fit_start():
    algorithm = VocAgnoLM(teacher=Teacher(), selection_scope="microbatch")
    algorithm.teacher_timing = "gpu"
    with pytest.raises(ValueError, match=r"teacher_timing must be one of \('wall', 'device'\), got 'gpu'"):
        algorithm.apply(Event.FIT_START, SimpleNamespace(), None)


def test_a_process_group_of_one_left_up_gathers_nothing(monkeypatch):
    """One process in a group of one (a run before it in the same process left it up): the batch scope makes no
    collective, as with no group (all_gather on this device was refused in the whole suite, where an earlier test had
    brought one up)."""
    import torch.distributed as torch_dist

    ours = not torch_dist.is_initialized()  # else an earlier test's group of one is up: the case itself
    if ours:
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(_free_port()))
        torch_dist.init_process_group("gloo", rank=0, world_size=1)
    assert torch_dist.get_world_size() == 1
    try:
        algorithm = VocAgnoLM(teacher="tiny-math-teacher", teacher_losses="cached", selection_scope="batch")
        batch = cached_batch()
        with no_host_reads(monkeypatch):
            losses = a_step(algorithm, batch, microbatch=4)
        assert len(losses) == 2
    finally:
        if ours:
            torch_dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
