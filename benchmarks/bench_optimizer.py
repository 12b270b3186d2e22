"""The optimizer step: Composer's ``DecoupledAdamW`` (one tensor at a time) against
``vocagno.training.optimizers.MultiTensorDecoupledAdamW`` (the same update in multi-tensor kernels, or with
``fused=True`` in torch's fused AdamW kernel).

    python benchmarks/bench_optimizer.py [--hidden 64] [--layers 22] [--steps 50] [--device cpu]

The parameters have TinyLlama-1.1B's layout (22 layers of 9 tensors, the embedding, the final norm and the LM head:
201 tensors), at a width of ``--hidden`` (TinyLlama's own: 2048). Prints each optimizer's milliseconds per step (the
median of ``--steps`` after 5 warm-up steps, the three taking their steps in turn; gradients fixed, set once) and the
ratio of Composer's to each of ours.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch
from composer.optim import DecoupledAdamW

from vocagno.training.optimizers import MultiTensorDecoupledAdamW


def tinyllama_shapes(hidden: int, layers: int, vocab: int) -> list[tuple[int, ...]]:
    """TinyLlama's parameter shapes scaled to ``hidden``: 4 KV heads of 32 query heads, an MLP of 5.5x."""
    kv, inter = hidden // 8, hidden * 11 // 4
    layer = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden), (inter, hidden), (inter, hidden),
             (hidden, inter), (hidden,), (hidden,)]
    return [(vocab, hidden)] + layer * layers + [(hidden,), (vocab, hidden)]


def ms_per_step(optimizer_classes, shapes, steps: int, device: torch.device) -> list[float]:
    """Each optimizer's median milliseconds per step over its own copy of the parameters, their steps taken in turn
    (one of each, then again), so that a machine busy with something else slows both alike."""
    optimizers = []
    for optimizer_class in optimizer_classes:
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(shape, device=device)) for shape in shapes]
        for p in params:
            p.grad = torch.randn_like(p)
        optimizers.append(optimizer_class(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=1e-5))
    times = [[] for _ in optimizers]
    for i in range(steps + 5):
        for opt, taken in zip(optimizers, times):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            opt.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i >= 5:
                taken.append(time.perf_counter() - start)
    return [1000 * statistics.median(taken) for taken in times]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    shapes = tinyllama_shapes(args.hidden, args.layers, args.vocab)
    numel = sum(torch.Size(s).numel() for s in shapes)
    fused = functools.partial(MultiTensorDecoupledAdamW, fused=True)
    composer, ours, one = ms_per_step([DecoupledAdamW, MultiTensorDecoupledAdamW, fused], shapes, args.steps, device)
    print(f"{len(shapes)} parameters, {numel:,} weights, {device} ({torch.get_num_threads()} threads)")
    print(f"composer DecoupledAdamW:                  {composer:8.3f} ms/step")
    print(f"MultiTensorDecoupledAdamW:                {ours:8.3f} ms/step  ({composer / ours:.2f}x)")
    print(f"MultiTensorDecoupledAdamW(fused=True):    {one:8.3f} ms/step  ({composer / one:.2f}x)")


if __name__ == "__main__":
    main()
