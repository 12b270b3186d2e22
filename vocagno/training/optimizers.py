"""Composer's ``DecoupledAdamW`` in few kernels: the same update, each operation applied to all of a group's tensors
at once (``torch._foreach_*``) instead of one tensor at a time.

Composer's update of each parameter, in its order (``composer.optim.decoupled_weight_decay``), which this one keeps:

    param *= 1 - weight_decay * lr / initial_lr           (the decay follows the schedule, not scaled by lr)
    exp_avg = exp_avg * beta1 + grad * (1 - beta1)
    exp_avg_sq = exp_avg_sq * beta2 + grad * grad * (1 - beta2)
    denom = sqrt(exp_avg_sq) / sqrt(1 - beta2**step) + eps     (max_exp_avg_sq's for amsgrad)
    param += -(lr / (1 - beta1**step)) * exp_avg / denom

On a CPU the parameters come out bit for bit as Composer's (the foreach ops run the same kernels per tensor); on a GPU
the multi-tensor kernels may round a last bit differently (a scalar division Composer's kernel does as a multiplication
by the reciprocal, fused multiply-adds).

Each parameter's ``step`` is kept as a float32 scalar on the CPU, as ``torch.optim.AdamW`` keeps it when not
capturable, so reading it is no host synchronisation (Composer's lives on the parameter's device and is read with
``.item()`` for every parameter every step). The state keys are Composer's (``step``, ``exp_avg``, ``exp_avg_sq``,
``max_exp_avg_sq``): either optimizer loads the other's state dict; a ``step`` loaded onto a GPU moves to the CPU once,
at the first step after the load.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
from composer.optim import DecoupledAdamW

__all__ = ["MultiTensorDecoupledAdamW"]


class MultiTensorDecoupledAdamW(DecoupledAdamW):
    """Composer's ``DecoupledAdamW`` (same constructor, defaults, state keys and per-parameter metrics), stepping each
    group's parameters of one device, dtype and step count in a dozen multi-tensor kernels."""

    @torch.no_grad()  # pyright: ignore[reportUntypedFunctionDecorator]
    def step(self, closure=None):
        """One update of every parameter that has a gradient; ``closure`` as torch's optimizers take it."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if "initial_lr" not in group:
                group["initial_lr"] = group["lr"]
            amsgrad = group["amsgrad"]
            # (device, dtype, step) -> the lists of one multi-tensor update
            buckets: dict[tuple, tuple[list, ...]] = defaultdict(lambda: ([], [], [], [], []))
            for p in group["params"]:
                if p.grad is None or not p.requires_grad:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("AdamW does not support sparse gradients")
                state = self.state[p]
                if "step" not in state:
                    state["step"] = torch.zeros((), dtype=torch.float)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    if amsgrad:
                        state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                elif state["step"].device.type != "cpu":
                    state["step"] = state["step"].to("cpu", torch.float)  # a state dict saved by Composer's
                state["step"] += 1
                params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs = buckets[
                    (p.device, p.dtype, state["step"].item())]
                params.append(p)
                grads.append(p.grad)
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
                if amsgrad:
                    max_exp_avg_sqs.append(state["max_exp_avg_sq"])
            for (_, _, step), lists in buckets.items():
                self.multi_tensor_adamw(
                    *lists, step=step, amsgrad=amsgrad, beta1=group["betas"][0], beta2=group["betas"][1],
                    lr=group["lr"], initial_lr=group["initial_lr"], weight_decay=group["weight_decay"],
                    eps=group["eps"])
        return loss

    @staticmethod
    def multi_tensor_adamw(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
                           exp_avg_sqs: list[torch.Tensor], max_exp_avg_sqs: list[torch.Tensor], *, step: float,
                           amsgrad: bool, beta1: float, beta2: float, lr: float, initial_lr: float,
                           weight_decay: float, eps: float) -> None:
        """Composer's ``DecoupledAdamW.adamw`` for tensors that share one device, dtype and step count."""
        if weight_decay != 0:
            decay_factor = (lr / initial_lr) if initial_lr else 1.0
            torch._foreach_mul_(params, 1 - decay_factor * weight_decay)
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        torch._foreach_mul_(exp_avgs, beta1)
        torch._foreach_add_(exp_avgs, grads, alpha=1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
        if amsgrad:
            torch._foreach_maximum_(max_exp_avg_sqs, exp_avg_sqs)
            denom = torch._foreach_sqrt(max_exp_avg_sqs)
        else:
            denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denom, math.sqrt(bias_correction2))
        torch._foreach_add_(denom, eps)
        torch._foreach_addcdiv_(params, exp_avgs, denom, value=-(lr / bias_correction1))
