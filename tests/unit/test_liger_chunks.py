"""Liger's chunk budget (``chunk_mem_const``) as vocagno.core.kernels passes it, on the CPU: Liger's Triton kernels
need a CUDA GPU, so its function is stood in for by one that records its arguments and computes the per-token
cross-entropy with PyTorch (tests/integration/test_speed_options.py runs the real one, with -m gpu)."""

import sys
import types

import pytest
import torch

from vocagno.core.kernels import check_chunk_mem_const, fused_token_loss, liger_chunk_tokens
from vocagno.core.loss import token_cross_entropy
from vocagno.errors import Refused


@pytest.fixture
def liger(monkeypatch):
    """liger_kernel's two entry points that ``fused_token_loss`` calls, recording their arguments."""
    calls = []

    def losses(hidden, weight, targets, bias):
        logits = hidden @ weight.t() + (0 if bias is None else bias)
        return token_cross_entropy(logits, targets)

    class Function:
        @staticmethod
        def apply(*args):
            calls.append(("function", args))
            return losses(*args[:4]), None, None, None

    class Loss:
        def __init__(self, **options):
            self.options = options

        def __call__(self, weight, hidden, targets, bias=None):
            calls.append(("module", self.options))
            return losses(hidden, weight, targets, bias)

    monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))
    monkeypatch.setitem(sys.modules, "liger_kernel.ops", types.SimpleNamespace(
        LigerFusedLinearCrossEntropyFunction=Function))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", types.SimpleNamespace(
        LigerFusedLinearCrossEntropyLoss=Loss))
    return calls


def test_a_chunk_budget_reaches_ligers_function_as_its_last_argument_and_the_losses_are_the_same(liger):
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 40)
    hidden, targets = torch.randn(12, 16), torch.randint(0, 40, (12,))
    targets[::5] = -100
    default = fused_token_loss(hidden, head, targets)
    budgeted = fused_token_loss(hidden, head, targets, chunk_mem_const=8)
    assert [kind for kind, _ in liger] == ["module", "function"]
    assert liger[0][1] == {"reduction": "none", "ignore_index": -100}  # Liger's default budget, as before
    args = liger[1][1]
    # liger-kernel 0.8.5's LigerFusedLinearCrossEntropyFunction.forward, after ctx: _input, weight, target, bias,
    # ce_weight, ignore_index, lse_square_scale, label_smoothing, reduction, softcap, return_z_loss, accum_dtype,
    # use_token_scaling, return_token_accuracy, return_predicted_tokens, ce_impl, ce_mode, chunk_mem_const
    assert len(args) == 18 and args[1] is head.weight and args[3] is head.bias
    assert args[4:] == (None, -100, 0.0, 0.0, "none", None, False, None, False, False, False, None, None, 8)
    torch.testing.assert_close(budgeted, default, rtol=0, atol=0)
    assert budgeted.dtype == torch.float32 and (budgeted[::5] == 0).all()


@pytest.mark.parametrize("value", [0, -2, 1.5, True, "4"])
def test_a_budget_that_is_not_a_positive_integer_is_refused_before_liger_runs(liger, value):
    with pytest.raises(Refused, match="chunk_mem_const must be a positive integer"):
        fused_token_loss(torch.randn(2, 4), torch.nn.Linear(4, 8), torch.zeros(2, dtype=torch.long), value)
    assert liger == []


def test_a_budget_with_pytorchs_kernels_is_refused_and_none_is_liger_s_default():
    with pytest.raises(Refused, match="teacher.chunk_mem_const is Liger's fused cross-entropy's; with kernels: torch"):
        check_chunk_mem_const("torch", 4, "teacher.chunk_mem_const")
    check_chunk_mem_const("torch", None)
    check_chunk_mem_const("liger", 4)


def test_the_chunk_tokens_follow_ligers_rule():
    """Liger's own: vocab / (budget x hidden) chunks of the tokens, rounded up to a power of two, at most the
    tokens. The H100's profile: Qwen2.5-7B's head (152,064 x 3,584) in chunks of 256 tokens."""
    assert liger_chunk_tokens(8 * 1024, 152_064, 3_584) == 256
    assert liger_chunk_tokens(8 * 2048, 152_064, 3_584) == 512
    assert [liger_chunk_tokens(8 * 1024, 152_064, 3_584, c) for c in (2, 4, 8, 16, 43)] == [512, 1024, 2048, 4096,
                                                                                             8192]
    assert liger_chunk_tokens(100, 1_000, 64, 100) == 100  # one chunk: never more than the tokens
    assert liger_chunk_tokens(1, 152_064, 3_584) == 1
