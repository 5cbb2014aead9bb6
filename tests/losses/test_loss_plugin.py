"""A loss term is two files: a module (its schema with settings of its own, the term, ``LOSS_TERMS.register``) and its
YAML. Here a throwaway entropy floor, w·[h − mean token entropy]_+, with a state (the steps it has seen) is written into
a temporary dir and loaded like a user's: it composes, trains, resumes with its state, a policy changes its settings
through ``policy.trainers.<policy>.loss``, and a wrong key fails in one line, with no file of marl changed."""

from __future__ import annotations

import pytest

from marl_cli.config.team import policy_loss
from marl_cli.losses import LOSS_TERMS
from marl_cli.training.loop import train
from tests.helpers import FAST, install_plugin, metric_records, refusal, train_config

MODULE = "marl_floor_plugin"
PLUGIN = '''
"""An entropy floor: w·[h − the mini-batch's mean token entropy]_+ added to the policy loss."""

from dataclasses import dataclass

from marl_cli.config.schema import LossConfig, bounded
from marl_cli.losses.base import LOSS_TERMS, LossKind


@dataclass
class FloorConfig(LossConfig):
    """An entropy floor."""

    name: str = "floor"
    floor: float = bounded(1.0, ge=0.0)  # h (nats): the mean token entropy below which the term pushes it up
    weight: float = bounded(0.1, ge=0.0)  # w


class Floor:
    entropies = True
    every_row = False

    def __init__(self, cfg):
        self.cfg, self.steps = cfg, 0

    def prepare(self, batch, rows, counted, world, dtype):
        pass

    def __call__(self, batch, entropies, mask, step):
        mean = (entropies * mask).sum() / mask.sum().clamp(min=1)
        return self.cfg.weight * (self.cfg.floor - mean).clamp(min=0), {"floor/steps_seen": float(self.steps)}

    def after_step(self, entropy_sum, tokens):
        self.steps += 1

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = state.get("steps", 0)


LOSS_TERMS.register("floor", schema=FloorConfig)(LossKind(lambda settings, trainer: Floor(settings)))
'''
YAMLS = {"loss/floor.yaml": "defaults:\n  - base_floor\n  - _self_\n\nname: floor\nfloor: 5.0\n"}
CHOSEN = [*FAST, "loss=floor", "trainer.save_every=1", "trainer.eval_every=0"]


@pytest.fixture
def plugin(monkeypatch, tmp_path):
    return install_plugin(monkeypatch, tmp_path, MODULE, PLUGIN, YAMLS, [LOSS_TERMS])


def _config(conf: str, *overrides: str):
    return train_config(*CHOSEN, *overrides, f"hydra.searchpath=[file://{conf}]")


def test_it_composes_trains_and_resumes_with_its_state(plugin, tmp_path):
    cfg = _config(plugin, "trainer.steps=1")
    assert dict(cfg.loss) == {"name": "floor", "floor": 5.0, "weight": 0.1}
    run = tmp_path / "run"
    assert train(cfg, run)["status"] == "completed"
    assert train(_config(plugin, "trainer.steps=2", f"trainer.resume={run}"), run)["steps"] == 2
    seen = {r["step"]: r["train/shared/floor/steps_seen"] for r in metric_records(run)
            if "train/shared/floor/steps_seen" in r}
    assert seen == {1: 0.0, 2: 1.0}  # step 2 ran after the resume: the term's state came back from the checkpoint


def test_a_policy_changes_its_settings_like_any_trainer_key(plugin):
    cfg = _config(plugin, "workflow=tool_plan", "algorithm=at_grpo", "policy=per_role",
                  "+policy.trainers.plan.loss.weight=0.5")
    assert (policy_loss(cfg, "plan").weight, policy_loss(cfg, "tool").weight) == (0.5, 0.1)


@pytest.mark.parametrize(("override", "message"), [
    ("loss.floor=-1", "loss.floor=-1.0: must be >= 0.0"),
    ("loss.flor=1", "loss.flor: no such key; valid keys: name, floor, weight"),
    ("loss.coef=0.1", "loss.coef is a setting of loss=epo, not of loss=floor (its keys: floor, weight)"),
])
def test_a_wrong_key_fails_in_one_line(plugin, override, message):
    assert refusal([*CHOSEN, override], [plugin]).startswith(message)
