"""What a credit method is to the training loop: a reshaping of the turn rewards before the algorithm's
advantages, and/or of the advantages, token by token, after them.

A method registers itself beside its functions: ``CREDITS.register(name, schema=...)(Credit(...))`` (its settings
are the ``credit`` group's keys: ``credit=hicra credit.alpha=0.3``). ``credit=none`` (the default) leaves both
as the algorithm makes them. The hooks get the run (``training.build.Run``: its policies, tokenizers, env) so a
method can score with a policy or read its tokens; this package imports nothing of ``training``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from marl_cli.config.registry import Registry
from marl_cli.core.samples import Sample

Hook = Callable[[list[Sample], Any, Any], dict[str, float]]
"""``(rows, credit config, run) -> statistics``: rewrites the rows in place (rewards, or token advantages)."""


@dataclass(frozen=True)
class Credit:
    """A credit method's hooks, either or both.

    Args:
        rewards: before the advantages: sets each row's ``reward`` (e.g. IGPO's information gain per turn).
        advantages: after them: sets rows' ``advantage`` or ``token_advantages`` (IGPO's discounted sums, HICRA's
            planning-token amplification).
        references: the rollout records each row's correct answer (``Sample.reference``) for the hooks.
    """

    rewards: Hook | None = None
    advantages: Hook | None = None
    references: bool = False


CREDITS: Registry[Credit] = Registry("credit.name", "credit")
CREDITS.register("none")(Credit())


def _run_hook(hook: Hook | None, rows: list[Sample], cfg: Any, run: Any) -> dict[str, float]:
    return {} if hook is None else {f"credit/{k}": v for k, v in hook(rows, cfg.credit, run).items()}


def shape_rewards(rows: list[Sample], cfg: Any, run: Any) -> dict[str, float]:
    """The selected method's reward hook over ``rows`` (``cfg`` is the run config); its statistics as
    ``credit/<key>``."""
    return _run_hook(CREDITS.get(cfg.credit.name).rewards, rows, cfg, run)


def shape_advantages(rows: list[Sample], cfg: Any, run: Any) -> dict[str, float]:
    """The selected method's advantage hook over ``rows``; its statistics as ``credit/<key>``."""
    return _run_hook(CREDITS.get(cfg.credit.name).advantages, rows, cfg, run)
