"""Training, in three rooms: the learner (``learner/``: the per-policy update through TRL), where a step's rows come
from (``rows/``), and the loop with its phases (this folder: ``loop``, ``build``, ``hooks``, ``checkpoint``,
``evaluation``, ``warmstart``, ``interrupts``)."""
