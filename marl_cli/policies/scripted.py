"""Scripted roles: a registered non-LLM actor acts for a role (``policy.scripted.<role>=<actor>``), so a team can
be trained against a fixed partner (the environment's oracle, a partner that never helps).

An actor is a callable ``(workflow, role, state) -> str``: the completion ``role`` answers in ``state`` (the team
state its stage starts in, the one a model's prompt would show), in the workflow's answer format
(``workflow.format_answer``). The rollout engine calls it where a model would generate (``Rollout._generate_stage``,
no generate call) and plays its answer through the workflow like any completion, so the role's rewards, metrics,
evaluation and logged rows are as for any role. Its rows carry no token ids and the pseudo-policy
``scripted:<actor>``, which no trainer has: nothing trains them, nothing is warm-started or checkpointed for them.

Built-in actors: ``oracle`` (the workflow's ``demonstration``: the environment's oracle in the workflow's answer
format; where it has none, an empty answer, which scores as the row's format failure, so the role's
``format_failure`` rate counts those turns), ``empty`` (always answers nothing: a partner that never helps) and, for
a seat of ``workflow=game``, the game's bots (``GAME_BOTS``: ``random``, ``first_legal``, ``mcts``, ``minimax``). A
plug-in (a module in ``MARL_PLUGINS`` or the ``marl.plugins`` entry points) registers its own::

    from marl_cli.policies.scripted import ACTORS

    @ACTORS.register("always_right")
    def always_right(workflow, role, state):
        return workflow.format_answer("R")

``check_scripted`` (run with every regime's checks, ``policies.roles.check_regime``) refuses, in one line before any
model is built, a scripted role the workflow lacks, an actor no one registered, a team with no role left to a model,
a role both scripted and assigned a policy (``policy.assignment``), and decoupled trainers (``trainer.role``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from omegaconf import OmegaConf

from marl_cli.config.errors import ConfigError
from marl_cli.config.registry import PLUGIN_ENV, Registry

PREFIX = "scripted:"
"""A scripted role's pseudo-policy is ``scripted:<actor>``: its routing and its rows' ``policy``."""


class Team(Protocol):
    """What an actor may ask of the workflow it acts in (``workflows.base.Workflow`` has it all)."""

    roles: list[str]

    def demonstration(self, role: str, state: Any) -> str | None: ...

    def format_answer(self, answer: str) -> str: ...


Actor = Callable[[Team, str, Any], str]
"""``(workflow, role, state) -> text``: the completion ``role`` answers in the team state ``state``."""

ACTORS: Registry[Actor] = Registry("policy.scripted")
"""Scripted actors by name; an actor registers itself with ``@ACTORS.register(name)``."""


@ACTORS.register("oracle")
def oracle(workflow: Team, role: str, state: Any) -> str:
    """The workflow's demonstration (the env's oracle, as the role answers it); empty where it has none."""
    return workflow.demonstration(role, state) or ""


@ACTORS.register("empty")
def empty(workflow: Team, role: str, state: Any) -> str:
    """Nothing: a partner that never helps (each of its turns is a format failure the workflow scores)."""
    return ""


GAME_BOTS = ("random", "first_legal", "mcts", "minimax")
"""Players a game env offers (``bot_move``: ``envs/games.py``'s random and first_legal, OpenSpiel's MCTS and minimax):
a seat of ``workflow=game`` they can fill."""


def _game_bot(bot: str) -> Actor:
    def act(workflow: Team, role: str, state: Any) -> str:
        return workflow.format_answer(workflow.env.bot_move(state.env, bot) or "")  # type: ignore[attr-defined]

    act.__doc__ = f"The game's {bot} player: its move in the position, in the workflow's answer format."
    return act


for _bot in GAME_BOTS:
    ACTORS.register(_bot)(_game_bot(_bot))


class NoTokens:
    """The tokenizer of a scripted pseudo-policy, for the readable rows (``tracking.completions``): its rows have
    no token ids, so they read as empty."""

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        return ""


def policy_name(actor: str) -> str:
    """The pseudo-policy of a role scripted by ``actor``."""
    return PREFIX + actor


def is_scripted(policy: str) -> bool:
    """Whether ``policy`` (a routing value, a row's ``policy``) is a scripted actor, not a model."""
    return policy.startswith(PREFIX)


def scripted_actor(policy: str) -> Actor | None:
    """The actor behind the pseudo-policy ``policy``; None for a model's policy."""
    return ACTORS.get(policy.removeprefix(PREFIX)) if is_scripted(policy) else None


def scripted_roles(policy_cfg: Any) -> dict[str, str]:
    """Role → the name of the actor that acts for it (``policy.scripted``; empty when the config has none)."""
    table = OmegaConf.select(policy_cfg, "scripted", default=None) if OmegaConf.is_config(policy_cfg) else \
        getattr(policy_cfg, "scripted", None)
    return dict(table or {})


def scripted_routing(policy_cfg: Any) -> dict[str, str]:
    """Role → its pseudo-policy ``scripted:<actor>``, for each scripted role (what ``Rollout.routing`` adds)."""
    return {role: policy_name(actor) for role, actor in scripted_roles(policy_cfg).items()}


def check_scripted(cfg: Any) -> None:
    """The scripted roles are the workflow's, each actor is registered, a model is left to act and train, and no
    scripted role is assigned a policy or split across decoupled trainers: one line each."""
    scripted = scripted_roles(cfg.policy)
    if not scripted:
        return
    roles = list(cfg.workflow.roles)
    unknown = sorted(set(scripted) - set(roles))
    if unknown:
        raise ConfigError(f"policy.scripted names roles {unknown} that the workflow lacks; roles: {roles}")
    for role, actor in scripted.items():
        if actor not in ACTORS:
            raise ConfigError(f"policy.scripted.{role}={actor!r}: no scripted actor of that name; choose from: "
                              f"{', '.join(ACTORS.names())} (a plug-in's? name its module in {PLUGIN_ENV})")
        if actor in GAME_BOTS and cfg.workflow.name != "game":
            raise ConfigError(f"policy.scripted.{role}={actor} plays a game's seat; workflow={cfg.workflow.name} is "
                              "not a game (use workflow=game with env=openspiel or env=pettingzoo)")
    if set(roles) <= set(scripted):
        raise ConfigError(f"policy.scripted scripts every role {roles}: no model is left to act or train "
                          "(leave at least one role to a policy)")
    assigned = sorted(set(cfg.policy.assignment or {}) & set(scripted))
    if assigned:
        raise ConfigError(f"policy.assignment gives the scripted roles {assigned} a policy; a role is scripted "
                          "(policy.scripted) or acts through a policy, not both")
    role = OmegaConf.select(cfg, "trainer.role", default="all")
    if role != "all":
        raise ConfigError(f"trainer.role={role}: decoupled trainers exchange the roles' policies; run scripted roles "
                          f"({sorted(scripted)}) with trainer.role=all")
