"""Loading marl's plug-ins: the built-in environments, workflows, algorithms, critic kinds, credit methods, loss terms,
reward models, policy regimes and rollout backends, then the user's (``marl.plugins`` entry points, ``MARL_PLUGINS``).

The config layer (``marl_cli.config``) sits below every plug-in and imports none of them: its registries,
``register_configs`` and ``check_config`` see what has been loaded. So whatever composes or checks a config
(the CLI, tests, bench) calls ``register_configs`` here first. Every plug-in module stays light when it is
imported (no torch, transformers or trl at module level), so loading them all costs a fraction of a second.
"""

from __future__ import annotations

from marl_cli.config import schema
from marl_cli.config.registry import load_plugins


def load_builtin() -> None:
    """Import the built-in plug-in packages (each module registers its plug-ins)."""
    import marl_cli.algorithms
    import marl_cli.credit
    import marl_cli.critics.kinds
    import marl_cli.envs
    import marl_cli.losses
    import marl_cli.policies.roles
    import marl_cli.rewards
    import marl_cli.rollout.backends
    import marl_cli.workflows  # noqa: F401


def load_all() -> None:
    """The built-in plug-ins, then the user's (``load_plugins``)."""
    load_builtin()
    load_plugins()


def register_configs() -> None:
    """Load every plug-in, then store the schemas and resolvers in Hydra (``config.schema.register_configs``)."""
    load_all()
    schema.register_configs()
