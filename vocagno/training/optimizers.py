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

``fused=True`` (off by default: a GPU to measure) runs each group's update as one fused kernel instead, torch's own
AdamW kernel (``torch._fused_adamw_``: one pass over the weights, the gradients and both moments, where the foreach
form makes about ten), its decay ``param *= 1 - lr x weight_decay`` given ``weight_decay / initial_lr``, which is
Composer's decoupled decay. The same update in another order of rounding: within atol 1e-6, rtol 1e-5 of Composer's
over 20 steps on a CPU (``tests/unit/test_optimizers.py``).

``master_weights=True`` (off by default: fewer casts, a GPU to measure) keeps a float32 master copy of each bfloat16
or float16 parameter in the optimizer's state (``master``): the model holds its weights in the dtype its matmuls use, so
autocast recasts none of them each forward, and the update runs on the masters (float32 moments, the gradient cast to
float32) and is rounded into the parameter after. A float32 parameter is its own master. What it costs: the gradients
are the parameters' dtype, so microbatches add up in bfloat16.

Each parameter's ``step`` is kept as a float32 scalar on the CPU, as ``torch.optim.AdamW`` keeps it when not
capturable, so reading it is no host synchronisation (Composer's lives on the parameter's device and is read with
``.item()`` for every parameter every step). The state keys are Composer's (``step``, ``exp_avg``, ``exp_avg_sq``,
``max_exp_avg_sq``; ``master`` besides with master weights): either optimizer loads the other's state dict; a ``step``
loaded onto a GPU moves to the CPU once, at the first step after the load.
"""

from __future__ import annotations

import math
from collections import defaultdict
from itertools import chain

import torch
from composer.optim import DecoupledAdamW as ComposersDecoupledAdamW

__all__ = ["MultiTensorDecoupledAdamW"]


LOW_PRECISION = (torch.bfloat16, torch.float16)  # the dtypes that get a float32 master with master_weights


class MultiTensorDecoupledAdamW(ComposersDecoupledAdamW):
    """Composer's ``DecoupledAdamW`` (same constructor, defaults, state keys and per-parameter metrics), stepping each
    group's parameters of one device, dtype and step count in a dozen multi-tensor kernels. ``master_weights``: see
    the module's docstring.

    Its class goes by Composer's name (``__name__``, ``__qualname__``): Composer saves and loads an optimizer's state
    under its class's qualified name, and LRMonitor logs ``lr-NAME/groupN``. Under its own, a run resumed with another
    ``optimizer.kernels`` would start Adam again at step 1 (Composer only warns), and the console's lr would go."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                 weight_decay: float = 1e-5, amsgrad: bool = False, master_weights: bool = False, fused: bool = False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
        self.master_weights = master_weights
        # Not torch's group["fused"], which would make load_state_dict move each step count onto the device.
        self.one_kernel = fused

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's, then the masters made to agree with the weights. torch casts every state tensor to its parameter's
        dtype, which would round a master into bfloat16: a master is kept in float32 where it rounds to its weight
        (the state this optimizer saved with the weights it stepped), made again from the weight where it does not (a
        master older than the weights: kept, it would roll them back), and made where the state has none (saved
        without masters); its moments are float32 beside it. Without masters, a saved master is dropped: it would be
        saved again, stale, at every checkpoint."""
        super().load_state_dict(state_dict)
        saved = chain.from_iterable(group["params"] for group in state_dict["param_groups"])
        params = chain.from_iterable(group["params"] for group in self.param_groups)
        for index, param in zip(saved, params):
            given, state = state_dict["state"].get(index, {}), self.state.get(param)
            if state is None:
                continue
            if not (self.master_weights and param.dtype in LOW_PRECISION):
                state.pop("master", None)
                for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):  # as torch's cast left them: the weight's
                    if key in state:
                        state[key] = state[key].to(param.dtype)
                continue
            master = given.get("master")
            fresh = master is None or not torch.equal(master.to(param.device, param.dtype), param)
            state["master"] = param.detach().to(torch.float32, copy=True) if fresh else \
                master.to(param.device, torch.float32, copy=True)
            for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
                if key in state:
                    state[key] = given[key].to(param.device, torch.float32, copy=True)

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
            # (device, dtype, step) -> the lists of one multi-tensor update, and the parameters its masters round into
            buckets: dict[tuple, tuple[list, ...]] = defaultdict(lambda: ([], [], [], [], [], []))
            for p in group["params"]:
                if p.grad is None or not p.requires_grad:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("AdamW does not support sparse gradients")
                state = self.state[p]
                mastered = self.master_weights and p.dtype in LOW_PRECISION
                if mastered and "master" not in state:  # also a state saved without masters
                    state["master"] = p.detach().to(torch.float32, copy=True)
                weights = state["master"] if mastered else p
                if "step" not in state:
                    state["step"] = torch.zeros((), dtype=torch.float)
                    state["exp_avg"] = torch.zeros_like(weights, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(weights, memory_format=torch.preserve_format)
                    if amsgrad:
                        state["max_exp_avg_sq"] = torch.zeros_like(weights, memory_format=torch.preserve_format)
                elif state["step"].device.type != "cpu":
                    state["step"] = state["step"].to("cpu", torch.float)  # a state dict saved by Composer's
                state["step"] += 1
                params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, rounded = buckets[
                    (weights.device, weights.dtype, state["step"].item())]
                params.append(weights)
                grads.append(p.grad.to(weights.dtype))
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
                if amsgrad:
                    max_exp_avg_sqs.append(state["max_exp_avg_sq"])
                if mastered:
                    rounded.append((p, weights))
            update = self.fused_adamw if self.one_kernel else self.multi_tensor_adamw
            for (_, _, step), (*lists, rounded) in buckets.items():
                update(
                    *lists, step=step, amsgrad=amsgrad, beta1=group["betas"][0], beta2=group["betas"][1],
                    lr=group["lr"], initial_lr=group["initial_lr"], weight_decay=group["weight_decay"],
                    eps=group["eps"])
                if rounded:
                    torch._foreach_copy_([p for p, _ in rounded], [master for _, master in rounded])
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

    @staticmethod
    def fused_adamw(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
                    exp_avg_sqs: list[torch.Tensor], max_exp_avg_sqs: list[torch.Tensor], *, step: float,
                    amsgrad: bool, beta1: float, beta2: float, lr: float, initial_lr: float, weight_decay: float,
                    eps: float) -> None:
        """The same update by torch's fused AdamW kernel, for tensors that share one device, dtype and step count."""
        if weight_decay != 0 and not initial_lr:  # Composer decays by weight_decay itself then
            torch._foreach_mul_(params, 1 - weight_decay)
            weight_decay = 0.0
        # The kernel reads the step count where the tensors are; one scalar serves them all (a fill, no copy).
        steps = [torch.full((), step, dtype=torch.float32, device=params[0].device)] * len(params)
        torch._fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs if amsgrad else [], steps, lr=lr,
                            beta1=beta1, beta2=beta2, weight_decay=weight_decay / initial_lr if weight_decay else 0.0,
                            eps=eps, amsgrad=amsgrad, maximize=False)


# Composer's name for the class (see its docstring): the key of its checkpointed state and of LRMonitor's metric.
MultiTensorDecoupledAdamW.__name__ = MultiTensorDecoupledAdamW.__qualname__ = ComposersDecoupledAdamW.__qualname__
# pickle finds a class by its module and __qualname__: under that name, this module's attribute is this class.
DecoupledAdamW = MultiTensorDecoupledAdamW
