"""The bad-input table: every case of a config typo, wrong value, missing file, damaged checkpoint or bad
sweep value, run through ``marl`` as a user would (one process each), with what it answered.

    python bench/bad_input.py            # prints the Markdown table; exit 1 when a case breaks its contract

Contract: a refused start exits 2 with one line on stderr (``marl <command>: error: ...``) and leaves no
run dir; a damaged newest checkpoint is skipped with a one-line warning and the resume completes; a sweep
checks every value before its first job, and a job that fails later does not stop the others.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SMALL = ["trainer.warmstart.enabled=false", "env.size=4", "env.eval_size=4", "rollout.tasks_per_step=2",
         "algorithm.num_generations=2", "rollout.max_new_tokens=8", "model.tiny.hidden_size=32",
         "model.tiny.intermediate_size=64", "model.tiny.num_hidden_layers=1", "model.tiny.num_attention_heads=2",
         "model.tiny.num_key_value_heads=1", "model.tiny.head_dim=16", "trainer.eval_every=0", "logger=none",
         "progress=false"]


ARITHMETIC = Path(__file__).resolve().parents[1] / "examples" / "datasets" / "arithmetic.jsonl"
TEAM = ["workflow=tool_plan", "algorithm=at_grpo", "policy=per_role"]
GAME = ["env=openspiel", "workflow=game"]


@dataclass
class Case:
    """One bad input: the ``marl`` arguments and what the answer must show."""

    name: str
    args: list[str]
    code: int = 2
    expect: str = "error:"
    check: Callable[[Path], str | None] | None = None  # extra contract on the work dir; a failure message


def marl(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "marl_cli", *args], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=600)
    return out, time.perf_counter() - start


def files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()} if root.exists() else set()


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def cases(work: Path) -> list[Case]:
    run = work / "run"

    def other_job_ran(_: Path) -> str | None:
        done = [json.loads(p.read_text())["status"] for p in (work / "sweep").rglob("summary.json")]
        return None if sorted(done) == ["completed", "failed"] else f"job statuses {done}"

    def resumed(_: Path) -> str | None:
        summary = json.loads((run / "summary.json").read_text())
        return None if summary["status"] == "completed" and summary["steps"] == 2 else f"summary {summary}"

    return [
        Case("unknown key `+trainer.some_typo=1`", ["train", "+trainer.some_typo=1"]),
        Case("option typo `env=plan_pth`", ["train", "env=plan_pth"]),
        Case("`rollout.max_new_tokens=0`", ["train", "rollout.max_new_tokens=0"]),
        Case("`trainer.learning_rate=-1`", ["train", "trainer.learning_rate=-1"]),
        Case("`trainer.log_every=0`", ["train", "trainer.log_every=0"]),
        Case("`trainer.save_every=-1`", ["train", "trainer.save_every=-1"]),
        Case("`trainer.eval_every=-1`", ["train", "trainer.eval_every=-1"]),
        Case("wrong type `trainer.steps=abc`", ["train", "trainer.steps=abc"]),
        Case("`model=hf` without `model.name_or_path`", ["train", "model=hf"]),
        Case("`model.name_or_path=/missing/dir`", ["train", "model=hf", "model.name_or_path=/missing/dir"]),
        Case("offline hub id `nosuchorg/nosuchmodel`",
             ["train", "model=hf", "model.name_or_path=nosuchorg/nosuchmodel"]),
        Case("`device=mps` without MPS", ["train", "device=mps"]),
        Case("`trainer.resume=/no/such/run`", ["train", "trainer.resume=/no/such/run"]),
        Case("`marl eval load=/no/such/run`", ["eval", "load=/no/such/run"]),
        Case("per-policy setting for a policy the run lacks",
             ["train", *TEAM, "+policy.trainers.planner.learning_rate=1e-4"]),
        Case("per-role key no schema knows `rollout.roles.plan.temprature`",
             ["train", *TEAM, "+rollout.roles.plan.temprature=0.6"]),
        Case("per-policy key that is the run's `policy.trainers.plan.steps`",
             ["train", *TEAM, "+policy.trainers.plan.steps=3"]),
        Case("every policy frozen", ["train", *TEAM, "policy.frozen=[tool,plan]"]),
        Case("alternating with one trainable policy",
             ["train", *TEAM, "policy.frozen=[tool]", "trainer.alternate_every=5"]),
        Case("a shared policy given two models",
             ["train", *TEAM, "policy=shared", "+policy.models.tool.tiny.num_hidden_layers=2",
              "+policy.models.plan.tiny.num_hidden_layers=4"]),
        Case("credit option typo `credit=hicrra`", ["train", "credit=hicrra"]),
        Case("`algorithm.gamma=0.9` without turn returns", ["train", "algorithm.gamma=0.9"]),
        Case("turn returns on tree rollouts", ["train", "algorithm=at_grpo", "algorithm.turn_credit=return"]),
        Case("`credit=igpo` with per-turn groups", ["train", "experiment=embedded", "credit=igpo"]),
        Case("EPO's old trainer key", ["train", "trainer.epo_penalty=0.5"], expect="it is loss=epo with loss.penalty"),
        Case("EPO beside TRL's entropy bonus", ["train", "loss=epo", "trainer.entropy_coef=0.01"]),
        Case("EPO's setting without the term", ["train", "loss.coef=0.01"], expect="loss.coef: no such key"),
        Case("`algorithm=ppo` without a critic", ["train", "experiment=embedded", "algorithm=ppo"]),
        Case("GRPO's group filter under PPO", ["train", "algorithm=ppo", "algorithm.filter=zero_std"],
             expect="algorithm.filter is a setting of"),
        Case("GAE's lambda under ArCHer", ["train", "algorithm=archer", "algorithm.lam=0.9"],
             expect="algorithm.lam is a setting of"),
        Case("M-GRPO's alignment under GRPO", ["train", "algorithm=grpo", "algorithm.align_d=4"],
             expect="algorithm.align_d is a setting of"),
        Case("a critic for a critic-free algorithm", ["train", "experiment=embedded", "critic=token"]),
        Case("ArCHer's replay setting under PPO", ["train", "algorithm=ppo", "critic=token",
                                                   "critic.replay_capacity=100"]),
        Case("a shared-trunk critic for the team", ["train", "algorithm=marft", "critic=utterance",
                                                    "critic.scope=team", "critic.share_trunk=true"]),
        Case("removed key `trainer.sync=false`", ["train", "trainer.sync=false"],
             expect="it is trainer.max_staleness"),
        Case("`trainer.max_staleness=-1`", ["train", "trainer.max_staleness=-1"]),
        Case("GSPO with a token-sum loss", ["train", "trainer.importance_sampling_level=sequence",
                                            "trainer.loss_type=bnpo"]),
        Case("unknown game `env.game=kuhn_pokr`", ["train", *GAME, "env.game=kuhn_pokr"]),
        Case("a parameter the game refuses", ["train", *GAME, "+env.params.foo=1"]),
        Case("a seat count the roles cannot fill", ["train", *GAME, "env.game=leduc_poker", "+env.params.players=3"]),
        Case("MCTS in a game of hidden information", ["train", *GAME, "+policy.scripted.player_1=mcts"]),
        Case("an illegal-move rule no game has `env.illegal=forfeit`", ["train", *GAME, "env.illegal=forfeit"]),
        Case("a league player that does not exist", ["eval", *GAME, "eval.league=[bot:random,/no/such/run]"]),
        Case("an opponent pool whose opponent trains", ["train", *GAME, "policy=per_role", "pool.every=2"]),
        Case("unknown TextArena env", ["train", "env=textarena", "workflow=game", "env.env_id=SimpleNegotation-v0"]),
        Case("RAE outside a game", ["train", "experiment=null", "algorithm=rae"]),
        Case("`env=dataset` without a source", ["train", "env=dataset"]),
        Case("a dataset file that does not exist", ["train", "env=dataset", "env.train.source=no/such.jsonl"]),
        Case("a column the dataset lacks", ["train", "env=dataset", f"env.train.source={ARITHMETIC}",
                                            "env.columns.prompt=problem_text"]),
        Case("code tests the dataset lacks", ["train", "env=dataset", f"env.train.source={ARITHMETIC}",
                                              "env.verifier=code"]),
        Case("unknown reasoning-gym dataset", ["train", "env=reasoning_gym", "env.dataset=mazee"]),
        Case("a parameter reasoning-gym refuses", ["train", "env=reasoning_gym", "env.dataset=maze",
                                                   "+env.params.min_distance=3"]),
        Case("unknown verifiers env id", ["train", "env=verifiers", "env.env_id=no-such-env", "env.path="]),
        Case("an OpenEnv class path that does not exist", ["train", "env=openenv", "env.environment=no/such.py:Env"]),
        Case("an OpenEnv server that does not answer", ["train", "env=openenv", "env.environment=",
                                                               "env.base_url=http://127.0.0.1:9"]),
        Case("unknown PettingZoo env id", ["train", "env=pettingzoo", "workflow=game",
                                           "env.env_id=classic/tictactoe_v9"]),
        Case("sweep value `rollout.tasks_per_step=2,-1,3`", ["train", "-m", "rollout.tasks_per_step=2,-1,3"]),
        Case("sweep job failing late `env.holes=99,4`", ["train", "-m", "experiment=null", *SMALL, "trainer.steps=0",
                                                         "env=sudoku",
                                                         "env.holes=99,4", f"hydra.sweep.dir={work / 'sweep'}"],
             expect="1 job(s) of the sweep failed (the others ran)", check=other_job_ran),
        Case("a new run in another run's dir", ["train", *SMALL, "trainer.steps=1", "seed=5", f"hydra.run.dir={run}"],
             expect="holds another run"),
        Case("resume changing the env `env.size=5`", ["train", f"trainer.resume={run}", "env.size=5"],
             expect="the run was trained with other settings; changed: env.size (4 -> 5)"),
        Case("truncated newest checkpoint on resume", ["train", f"trainer.resume={run}", "trainer.steps=2",
                                                       f"hydra.run.dir={work / 'resume'}"],
             code=0, expect="checkpoint step_000002 is damaged", check=resumed),
    ]


def main() -> int:
    rows, broken = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        out, _ = marl(["train", *SMALL, "trainer.steps=2", "trainer.save_every=1", f"hydra.run.dir={work / 'run'}"],
                      work)
        if out.returncode != 0:
            print(out.stderr[-3000:], file=sys.stderr)
            return 1
        truncate(work / "run" / "checkpoints" / "step_000002" / "state.pt")
        for case in cases(work):
            before = files(work / "outputs")
            out, seconds = marl(case.args, work)
            said = out.stdout + out.stderr
            stderr = [line for line in out.stderr.splitlines() if line.strip()]
            errors = [line for line in stderr if line.startswith("marl ") and ": error:" in line]
            shown = next((line for line in [*errors, *said.splitlines()] if case.expect in line),
                         stderr[-1] if stderr else "")
            problems = []
            if out.returncode != case.code:
                problems.append(f"exit {out.returncode}, expected {case.code}")
            if case.expect not in said:
                problems.append(f"no '{case.expect}'")
            if case.code == 2 and len(errors) != 1:
                problems.append(f"{len(errors)} error lines")
            if case.code == 2 and case.check is None and files(work / "outputs") != before:
                problems.append("left a run dir")
            if case.check is not None and (message := case.check(work)):
                problems.append(message)
            broken += bool(problems)
            rows.append(f"| {case.name} | {out.returncode} | {len(errors) or '-'} | {seconds:.1f} s | "
                        f"`{shown.strip()[:150]}` | {'; '.join(problems) or 'ok'} |")
    print("| case | exit | error lines | time | message | contract |\n|---|---:|---:|---:|---|---|")
    print("\n".join(rows))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
