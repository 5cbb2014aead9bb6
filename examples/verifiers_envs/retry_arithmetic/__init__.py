"""retry-arithmetic: a small verifiers environment (the classic ``import verifiers as vf`` API), shipped with marl
for its tests and its toy run of ``env=verifiers``.

Each task asks for a sum of ``terms`` numbers in [0, ``max_operand``]; the reply gives it inside
``<answer>...</answer>``. A wrong sum is told "Incorrect, try again." and an untagged reply gets the format again,
until ``max_turns`` replies (``max_turns=1``: a ``vf.SingleTurnEnv``); a correct sum ends the episode. The rubric:
``correct_answer`` (1.0 when the last tagged answer is the sum, weight 1) and the parser's format reward (weight
0.2), so a reward lies in [0, 1.2]. The train and eval datasets never share a question.

Load it by id without installing it: ``env=verifiers env.env_id=retry-arithmetic env.path=examples/verifiers_envs``
(verifiers imports the module ``retry_arithmetic`` from that folder).
"""

from __future__ import annotations

import random

import verifiers as vf
from datasets import Dataset

SYSTEM = "Compute the sum. Reply with the number alone inside <answer>...</answer>, e.g. <answer>12</answer>."
RETRY = "Incorrect, try again."
FORMAT = "Give your answer inside <answer>...</answer>."


def questions(count: int, seed: int, max_operand: int, terms: int) -> list[dict[str, str]]:
    """``count`` distinct sums (question, answer) drawn from ``Random(seed)``."""
    if (max_operand + 1) ** terms < count:
        raise ValueError(f"only {(max_operand + 1) ** terms} distinct sums of {terms} numbers up to {max_operand}; "
                         f"asked for {count}")
    rng, rows, seen = random.Random(seed), [], set()
    while len(rows) < count:
        numbers = [rng.randint(0, max_operand) for _ in range(terms)]
        question = " + ".join(map(str, numbers))
        if question not in seen:
            seen.add(question)
            rows.append({"question": f"What is {question}?", "answer": str(sum(numbers))})
    return rows


class RetryArithmeticEnv(vf.MultiTurnEnv):
    """A sum per task; a wrong or untagged reply gets another turn."""

    @vf.stop
    async def solved(self, state: vf.State) -> bool:
        """The last reply's answer is the sum."""
        return bool(state["trajectory"]) and self.parser.parse_answer(state["trajectory"][-1]["completion"]) == \
            state["answer"]

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs) -> vf.Messages:
        answer = self.parser.parse_answer(messages[-1:])
        return [vf.UserMessage(content=FORMAT if answer is None else RETRY)]


def load_environment(max_turns: int = 3, num_train: int = 2000, num_eval: int = 200, max_operand: int = 50,
                     terms: int = 2, seed: int = 0) -> vf.Environment:
    """The environment: ``num_train`` training and ``num_eval`` evaluation sums (disjoint), up to ``max_turns``
    replies each."""
    if max_turns < 1:
        raise ValueError(f"max_turns must be at least 1, got {max_turns}")
    rows = questions(num_train + num_eval, seed, max_operand, terms)
    parser = vf.XMLParser(["answer"], answer_field="answer")

    def correct_answer(completion: vf.Messages, answer: str) -> float:
        return 1.0 if parser.parse_answer(completion) == answer else 0.0

    rubric = vf.Rubric(funcs=[correct_answer, parser.get_format_reward_func()], weights=[1.0, 0.2], parser=parser)
    kwargs = dict(dataset=Dataset.from_list(rows[:num_train]), eval_dataset=Dataset.from_list(rows[num_train:]),
                  system_prompt=SYSTEM, parser=parser, rubric=rubric)
    if max_turns == 1:
        return vf.SingleTurnEnv(**kwargs)
    return RetryArithmeticEnv(max_turns=max_turns, **kwargs)
