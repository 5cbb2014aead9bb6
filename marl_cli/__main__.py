"""``python -m marl_cli`` is the ``marl`` command."""

from marl_cli.cli.main import main

main()
