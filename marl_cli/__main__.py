"""``python -m marl_cli`` is the ``marl`` command (a rollout worker the run spawns imports this module again, as
``__mp_main__``, without running it)."""

from marl_cli.cli.main import main

if __name__ == "__main__":
    main()
