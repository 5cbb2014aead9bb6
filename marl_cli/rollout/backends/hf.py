"""The ``hf`` rollout backend: transformers' ``generate`` in this process."""

from __future__ import annotations

from typing import Any

from marl_cli.rollout.backends.base import BACKENDS, Generator


@BACKENDS.register("hf")
def hf_backend(cfg: Any) -> Generator:
    """transformers' ``generate`` in this process, on the policy's own device."""
    from marl_cli.rollout.generation import HFGenerator

    return HFGenerator()
