"""Tolerances for tests that compare two computations equal in exact arithmetic (the same update with rows
skipped or not, in one process or two, with a prompt shared or not, checkpointed or not).

A tolerance tuned on one CPU is not a contract: another CPU sums in another order (other SIMD widths, other
BLAS kernels, other thread splits). So such a test either runs in float64 (``to_float64``) at a tolerance
derived from float64's rounding, or at a tolerance derived from the computation, or with the float order fixed
(then it compares exactly). The bounds used:

- ``rounding(terms, dtype)``: a sum of ``terms`` values rounded in another order differs by at most
  ``terms · eps`` relative to the sum of their magnitudes (the classic recursive-summation bound), so two
  float orders of a computation whose longest accumulation has ``terms`` terms agree to that relative error.
- ``after_adam(lr, steps, terms, dtype)``: weights after Adam steps. Each Adam step moves a weight by
  lr · m̂/(√v̂ + ε) — at most about lr (Adam's step bound) — and a gradient error Δg moves that step by at most
  lr · |Δg| / ε (the derivative of g/(|g| + ε) is at most 1/ε, at g = 0). With |Δg| ≤ rounding(terms) times a
  gradient of norm ≤ 1 (``max_grad_norm`` clips to 1), two runs' weights are at most
  lr · steps · min(1, terms · eps / ε) apart. In float32 that minimum is 1 (terms · 1.2e-7 > 1e-8): Adam's
  normalisation can turn float-order noise in a cancelling gradient entry into a whole step, so weights after
  Adam are compared in float64, where for 2e4 terms it is under a thousandth of one step (a dropped row moves
  weights by ~lr: such breaks still fail by orders of magnitude; observed float64 differences are ~1e-16).
"""

from __future__ import annotations

import math
import types

import pytest
import torch
from trl.trainer import utils as trl_utils

from marl_cli.policies.regime import Policy

ADAM_EPS = 1e-8
"""TRL's (transformers') AdamW ε."""


def eps(dtype: torch.dtype) -> float:
    """The machine epsilon of ``dtype``."""
    return torch.finfo(dtype).eps


def rounding(terms: int, dtype: torch.dtype = torch.float64) -> float:
    """The relative difference two float orders of a ``terms``-term accumulation may show."""
    return terms * eps(dtype)


def assert_rounding_close(actual: torch.Tensor, expected: torch.Tensor, terms: int, msg: str = "") -> None:
    """``actual`` equals ``expected`` up to ``rounding(terms)`` in their dtype, relative to ``expected``'s largest
    magnitude (standing for the summation bound's Σ|x|; in float64 the bound is ~1e4 times the differences
    observed, room for cancellation)."""
    bound = rounding(terms, expected.dtype) * float(expected.abs().max())
    torch.testing.assert_close(actual, expected, atol=bound, rtol=0, msg=msg or None)


def after_adam(lr: float, steps: int, terms: int, dtype: torch.dtype = torch.float64) -> float:
    """The largest difference float order may make between two runs' weights after ``steps`` Adam steps at
    ``lr`` whose gradients accumulate at most ``terms`` terms (see the module's docstring)."""
    return lr * steps * min(1.0, rounding(terms, dtype) / ADAM_EPS)


def _rotary_float64(self: torch.nn.Module, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """transformers' rotary tables computed in float64 (it computes them in float32 whatever the model's dtype,
    which alone makes the same token at two padded positions differ by ~1e-8 in a float64 model)."""
    freqs = position_ids[..., None].to(torch.float64) * self.inv_freq.to(x.device, torch.float64)
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


class Float64LogProbs:
    """TRL's fused LM head (``ChunkedLogProbFunction``), computed in the hidden states' dtype by plain torch ops:
    TRL's accumulates its online softmax in float32 whatever the inputs' dtype (its outputs are float32)."""

    @staticmethod
    def apply(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
              temperature: float, chunk_size: int, softcap: float | None = None, logit_scale: float = 1.0,
              outputs: tuple[str, ...] = ()) -> tuple[torch.Tensor | None, ...]:
        z = torch.nn.functional.linear(hidden, weight.to(hidden.dtype), bias) * logit_scale
        if softcap:
            z = softcap * torch.tanh(z / softcap)
        z = z / temperature
        log_p = z.log_softmax(-1)
        target = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        before = torch.arange(z.size(-1), device=z.device) < targets.unsqueeze(-1)
        target_z = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return (target,
                -(log_p.exp() * log_p).sum(-1) if "entropy" in outputs else None,
                torch.logsumexp(2 * log_p, -1).detach() if "log_sum_sq_probs" in outputs else None,
                z.mean(-1).detach() if "mean_logits" in outputs else None,
                ((target_z >= z.amax(-1)) & (target_z > z.masked_fill(~before, -math.inf).amax(-1)))
                if "is_top1" in outputs else None)


def _rms_norm_float64(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """transformers' RMSNorm in the input's dtype (it normalises in float32 whatever the model's dtype)."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


FLOAT32_ISLANDS = {"RotaryEmbedding": _rotary_float64, "RMSNorm": _rms_norm_float64}
"""Modules transformers computes in float32 inside a float64 model, by the end of their class name."""


def to_float64(policy: Policy, monkeypatch: pytest.MonkeyPatch | None = None) -> Policy:
    """``policy`` with its model in float64 — rotary tables, RMS norms and TRL's fused head (``Float64LogProbs``;
    patched with ``monkeypatch``, else for the rest of the process) included — computing in float64; returned."""
    (monkeypatch.setattr if monkeypatch else setattr)(trl_utils, "_ChunkedLogProbFunction", Float64LogProbs)
    policy.model.double()
    policy.compute_dtype = torch.float64
    for module in policy.model.modules():
        for suffix, forward in FLOAT32_ISLANDS.items():
            if type(module).__name__.endswith(suffix):
                module.forward = types.MethodType(forward, module)
    return policy
