"""Deep research: answer a multi-hop question using search/open tools (M-GRPO paper setting).

Embedded questions (the default) are generated over a fictional knowledge base (``research_kb``): "What is
the birthplace of the founder of Zorvex Labs?", with the chain's sub-tasks ("founder of Zorvex Labs" →
Mira Tal, "birthplace of Mira Tal" → ...) known exactly, so a sub-agent's result can be judged by rule
(``expert``). Training and warm-start questions come from the train KB (``kb_seed``), evaluation questions
from the eval KB (``kb_seed + 1``, whose names are disjoint from the train KB's), or with
``eval_kb=train`` from the train KB (other question seeds, the same entities and facts). ``env.train``/``env.eval``
may instead name an online source (``research_data``: GAIA, XBench-DeepSearch, WebWalkerQA, a hub id or
a local file); such questions have no known sub-tasks, and their tools go to the web backend (``env.web``).

The env owns the tools (``search``, ``open``) and the judges (``correct``, ``subtask_answer``, ``expert``);
the workflow decides who calls them. An episode takes one action, the final answer: 1.0 when it matches
the gold answer (case, whitespace and trailing punctuation ignored), else 0.0; no answer is a format failure.
"""

from __future__ import annotations

import logging
import random
import re
import threading
from dataclasses import dataclass

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import ResearchConfig
from marl_cli.envs.base import ENVS, WARMSTART_OFFSET, Env, Transition, task_seed
from marl_cli.envs.research_data import load_questions
from marl_cli.envs.research_kb import Hop, KnowledgeBase
from marl_cli.envs.sources import load_splits
from marl_cli.envs.web_search import WebSearch

log = logging.getLogger(__name__)

SPLITS = ("train", "eval")
SEARCH_TOOLS = "Tools: search: <words> lists matching documents; open: <doc id> shows a document;"
"""How ``rules`` describe the two search tools; each agent's rules add the action that ends its work."""
_SUBTASK = re.compile(r"(?:the )?([a-z]+) of (.+)", re.IGNORECASE)


@dataclass(frozen=True)
class ResearchTask:
    """A question, its gold answer and (embedded questions only) its hops; ``split`` picks the KB or source."""

    question: str
    answer: str
    hops: tuple[Hop, ...]
    split: str
    uid: str


@dataclass(frozen=True)
class ResearchState:
    """The task and the final answer once given (None before, or after an unreadable one)."""

    task: ResearchTask
    answer: str | None = None


def normalise_answer(text: str) -> str:
    """``text`` for comparison: case-folded, whitespace collapsed, trailing punctuation dropped."""
    return re.sub(r"[\s.,;:!?]+$", "", " ".join(text.split()).casefold())


@ENVS.register("research", schema=ResearchConfig)
class ResearchEnv(Env):
    """Multi-hop questions over a generated KB (or an online source) with search/open tools."""

    def __init__(self, cfg: ResearchConfig, seed: int = 0, sandbox: object = None):
        super().__init__(cfg, seed, sandbox)
        for key in ("people", "organisations", "cities", "countries"):
            if getattr(cfg, key) < 2:
                raise ConfigError(f"env.{key} must be at least 2, got {getattr(cfg, key)}")
        entities = cfg.people + cfg.organisations + cfg.cities + cfg.countries
        if cfg.min_hops < 1:
            raise ConfigError(f"env.min_hops must be at least 1, got {cfg.min_hops}")
        if not cfg.min_hops <= cfg.max_hops < entities:
            raise ConfigError(f"env.max_hops must lie in [env.min_hops={cfg.min_hops}, {entities - 1}] (a chain "
                              f"never revisits one of the KB's {entities} entities), got {cfg.max_hops}")
        for key, value in (("search_top_k", cfg.search_top_k), ("max_doc_chars", cfg.max_doc_chars),
                           ("web.top_k", cfg.web.top_k), ("web.max_page_chars", cfg.web.max_page_chars)):
            if value < 1:
                raise ConfigError(f"env.{key} must be at least 1, got {value}")
        if cfg.web.timeout_s <= 0:
            raise ConfigError(f"env.web.timeout_s must be positive, got {cfg.web.timeout_s}")
        self.web = WebSearch(cfg.web)
        self.questions = load_splits(cfg, load_questions)
        train, evals = self.questions["train"], self.questions["eval"]
        self.order = None if train is None else random.Random(seed).sample(range(len(train)), len(train))
        if (train is not None or evals is not None) and not cfg.web.url:
            log.warning("an online question source is set but env.web.url is not: every search will fail")
        self._kbs: dict[str, KnowledgeBase] = {}
        self._lock = threading.Lock()

    # --- tasks -------------------------------------------------------------------------------------

    def kb(self, split: str) -> KnowledgeBase:
        """The knowledge base of ``split`` ("train" or "eval"), built on first use."""
        with self._lock:
            if split not in self._kbs:
                cfg = self.cfg
                side = SPLITS.index(split)
                self._kbs[split] = KnowledgeBase.generate(cfg.kb_seed + side, cfg.people, cfg.organisations,
                                                          cfg.cities, cfg.countries, side=side)
            return self._kbs[split]

    def _generated(self, split: str, seed: int) -> ResearchTask:
        try:
            q = self.kb(split).question(random.Random(seed), self.cfg.min_hops, self.cfg.max_hops)
        except ValueError as exc:
            raise ConfigError(f"env.max_hops={self.cfg.max_hops}: {exc}; lower it or enlarge the KB") from exc
        return ResearchTask(q.text, q.answer, q.hops, split, f"{split}-{seed}")

    def task(self, split: str, index: int) -> ResearchTask:
        """Question ``index`` of ``split``: train and warm-start from the train KB/source, eval from the eval one.

        Embedded questions are generated from the task seed; source rows are taken modulo the source's
        length, training (and warm-start) rows in an order shuffled by the run seed, eval rows in file order.
        """
        seed = task_seed(split, index, self.seed)
        side = "eval" if split == "eval" else "train"
        rows = self.questions[side]
        if rows is None:
            return self._generated("train" if self.cfg.eval_kb == "train" else side, seed)
        if split == "eval":
            row = index % len(rows)
        else:
            assert self.order is not None
            row = self.order[(index + (WARMSTART_OFFSET if split == "warmstart" else 0)) % len(rows)]
        question, answer = rows[row]
        return ResearchTask(question, answer, (), side, f"{side}-{row}")

    def make_task(self, seed: int) -> ResearchTask:
        return self._generated("train", seed)

    # --- episode -----------------------------------------------------------------------------------

    def rules(self) -> str:
        return f"{SEARCH_TOOLS} answer: <text> gives the final answer."

    def initial_state(self, task: ResearchTask) -> ResearchState:
        return ResearchState(task)

    def observe(self, state: ResearchState) -> str:
        return f"Question: {state.task.question}"

    def step(self, state: ResearchState, action: str | None) -> Transition:
        if action is None or not action.strip():
            return Transition(ResearchState(state.task), 0.0, done=True, success=False, format_ok=False,
                              info={"correct": 0.0})
        answer = action.strip()
        ok = self.correct(state.task, answer)
        return Transition(ResearchState(state.task, answer), float(ok), done=True, success=ok, format_ok=True,
                          info={"correct": float(ok)})

    def score(self, state: ResearchState) -> float:
        return 1.0 if self.correct(state.task, state.answer) else 0.0

    def oracle(self, state: ResearchState) -> str | None:
        return state.task.answer

    def correct(self, task: ResearchTask, answer: str | None) -> bool:
        """Whether ``answer`` is the gold answer (case, whitespace and trailing punctuation ignored)."""
        gold = normalise_answer(task.answer)
        return answer is not None and bool(gold) and normalise_answer(answer) == gold

    # --- tools -------------------------------------------------------------------------------------

    def _online(self, task: ResearchTask) -> bool:
        return self.questions[task.split] is not None

    def search(self, task: ResearchTask, query: str) -> str:
        """The search observation: "[d17] Zorvex Labs | [d4] Ani Roe" (web: urls as ids), or "no results"."""
        if self._online(task):
            found = self.web.search(query, self.cfg.web.top_k)
            if isinstance(found, str):
                return found
            shown = [f"[{url}] {title}: {snippet}" if snippet else f"[{url}] {title}" for url, title, snippet in found]
        else:
            shown = [f"[{doc}] {title}" for doc, title in self.kb(task.split).search(query, self.cfg.search_top_k)]
        return " | ".join(shown) or "no results"

    def open(self, task: ResearchTask, doc: str) -> str:
        """Document ``doc`` as "[d17] Zorvex Labs: <body>" cut to ``max_doc_chars`` (web: the page's text)."""
        if self._online(task):
            return self.web.open(doc)
        found = self.kb(task.split).by_id.get(doc.strip().strip("[]").strip().lower())
        if found is None:
            return f"no document {' '.join(doc.split())[:100]}"
        return f"[{found.id}] {found.title}: {found.body}"[:self.cfg.max_doc_chars]

    def doc_id(self, task: ResearchTask, title: str) -> str | None:
        """The id of the document titled exactly ``title`` in the task's KB (None for online tasks)."""
        if self._online(task):
            return None
        found = self.kb(task.split).by_title.get(title)
        return found.id if found else None

    # --- sub-task judge ----------------------------------------------------------------------------

    def subtask_answer(self, task: ResearchTask, subtask: str) -> str | None:
        """The exact answer of a sub-task "<relation> of <entity>" in the task's KB, or None when unknown.

        Case, surrounding whitespace, a leading "the " and trailing "?"/"." are tolerated.
        """
        if self._online(task):
            return None
        match = _SUBTASK.fullmatch(" ".join(subtask.split()).rstrip("?.").rstrip())
        if match is None:
            return None
        return self.kb(task.split).fact(match.group(1).lower(), match.group(2))

    def expert(self, task: ResearchTask, subtask: str, result: str | None) -> float | None:
        """1.0 when ``result`` is the sub-task's answer, 0.0 when not (or None), None when it cannot be judged."""
        gold = self.subtask_answer(task, subtask)
        if gold is None:
            return None
        return 1.0 if result is not None and normalise_answer(result) == normalise_answer(gold) else 0.0
