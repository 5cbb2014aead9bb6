"""The opponent pool: snapshots of the learner join it every N steps, the opponent plays one drawn per step from a
generator of (seed, step), a resume plays the same opponents, and a setup the pool cannot run is refused."""

from collections import Counter

import pytest
import torch

from marl_cli.training.loop import train
from marl_cli.training.pool import OpponentPool
from tests.helpers import metric_records, refusal, train_config
from tests.workflows.test_game import GAME

POOL = [*GAME, "algorithm=rae", "policy=per_role", "trainer.frozen_roles=[player_1]", "pool.every=1", "pool.size=4",
        "trainer.warmstart.enabled=false", "trainer.eval_every=0", "env.eval_size=2"]


def _pool(tmp_path, sample, steps):
    pool = OpponentPool(tmp_path, "a", "b", 1, 8, sample, seed=0)
    tmp_path.mkdir(parents=True, exist_ok=True)
    for s in steps:
        torch.save({}, tmp_path / f"step_{s:06d}.pt")
    return pool


def test_the_draw_is_a_function_of_seed_and_step_uniform_or_by_recency(tmp_path):
    uniform, recent = _pool(tmp_path / "u", "uniform", [0, 5, 10, 15]), _pool(tmp_path / "r", "recency", [0, 5, 10, 15])
    assert [uniform.draw(s) for s in range(20)] == [uniform.draw(s) for s in range(20)]
    counts = Counter(uniform.draw(s) for s in range(4000))
    assert all(abs(c / 4000 - 0.25) < 0.03 for c in counts.values())  # 4.4 binomial sd
    newest = Counter(recent.draw(s) for s in range(4000))
    # weights 1/8, 1/4, 1/2 (normalised by 15/8): the newest 8/15, the next 4/15, 2/15, 1/15
    assert newest[15] / 4000 == pytest.approx(8 / 15, abs=0.035) and newest[0] / 4000 == pytest.approx(1 / 15, abs=0.02)


def test_the_opponent_plays_snapshots_of_the_learner_and_a_resume_plays_the_same_ones(tmp_path):
    straight = train(train_config(*POOL, "trainer.steps=4"), tmp_path / "straight")
    assert straight["status"] == "completed"
    snapshots = sorted(p.name for p in (tmp_path / "straight" / "pool").glob("*.pt"))
    assert snapshots == ["step_000001.pt", "step_000002.pt", "step_000003.pt", "step_000004.pt"]  # size 4: 0 left
    drawn = [m["pool/opponent_step"] for m in metric_records(tmp_path / "straight") if "pool/opponent_step" in m]
    assert len(drawn) == 3 and all(0 <= d <= s for s, d in enumerate(drawn, start=1))
    train(train_config(*POOL, "trainer.steps=2", "trainer.save_every=1"), tmp_path / "resumed")
    train(train_config(*POOL, "trainer.steps=4", f"trainer.resume={tmp_path / 'resumed'}"), tmp_path / "resumed")
    again = {m["step"]: m["pool/opponent_step"] for m in metric_records(tmp_path / "resumed")
             if "pool/opponent_step" in m}
    assert again == {1: drawn[0], 3: drawn[2]}  # step 2 ended the first run: its draw was made on resuming
    weights = [sorted((tmp_path / run / "checkpoints" / "step_000004" / "policies").rglob("*.safetensors"))
               for run in ("straight", "resumed")]
    assert len(weights[0]) == 2 and [w.read_bytes() for w in weights[0]] == [w.read_bytes() for w in weights[1]]


def test_the_opponent_holds_the_drawn_snapshots_weights(tmp_path):
    from marl_cli.training.build import build_run
    from marl_cli.training.loop import Trainer

    trainer = Trainer(build_run(train_config(*POOL, "trainer.steps=2"), tmp_path))
    trainer.fit()
    pool = trainer.hooks[0]
    last = [m for m in metric_records(tmp_path) if "pool/opponent_step" in m][-1]["pool/opponent_step"]
    saved = torch.load(pool.dir / f"step_{int(last):06d}.pt", weights_only=True)
    held = trainer.run.policies["player_1"].trained_state()
    assert all(torch.equal(saved[k], held[k]) for k in saved)
    learner = trainer.run.policies["player_0"].trained_state()
    assert any(not torch.equal(learner[k], held[k]) for k in held)  # the learner trained on after that snapshot


@pytest.mark.parametrize(("overrides", "message"), [
    (["policy=per_role", "pool.every=2"], "pool.opponent=player_1 plays the pool's snapshots and must not train"),
    (["pool.every=2", "trainer.frozen_roles=[player_1]"], "pool.learner and pool.opponent act through one policy"),
    (["policy=per_role", "pool.every=2", "pool.learner=hero"], "pool.learner=hero: not a role acting through a policy"),
])
def test_a_pool_it_cannot_run_is_refused_in_one_line(overrides, message):
    assert message in refusal([*GAME, *overrides])
