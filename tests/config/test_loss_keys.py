"""TRL's loss knobs under ``trainer.*`` and ``policy.trainers.<policy>.*``: each composes from the command line and
reaches TRL's config; a combination TRL would only warn of, or a knob the loss type would ignore, is a one-line
error before anything is built."""

import pytest
import torch

from marl_cli.config.errors import ConfigError
from marl_cli.config.team import policy_loss, policy_trainer
from marl_cli.config.validate import check_overrides
from marl_cli.plugins import register_configs
from marl_cli.training.learner.trl_adapter import grpo_args
from tests.helpers import FAST, cli, train_config

register_configs()
TEAM = [*FAST, "workflow=tool_plan", "algorithm=at_grpo", "policy=per_role"]

SET = {
    "importance_sampling_level": "sequence",
    "delta": 4.0,
    "entropy_coef": 0.01,
    "use_adaptive_entropy": True,
    "entropy_target": 0.5,
    "entropy_coef_delta": 0.01,
    "entropy_coef_min": 0.001,
    "entropy_coef_max": 0.1,
    "top_entropy_quantile": 0.2,
    "mask_truncated_completions": True,
    "off_policy_mask_threshold": 0.5,
}


@pytest.mark.parametrize("key,value", SET.items(), ids=SET)
def test_each_loss_key_composes_from_the_command_line_and_reaches_trl(tmp_path, key, value):
    override = f"trainer.{key}={str(value).lower()}"
    check_overrides("train", [*FAST, override])
    trainer = train_config(*FAST, override).trainer
    assert trainer[key] == value
    assert getattr(grpo_args(trainer, 1.0, 8, tmp_path, 0, torch.device("cpu"), None), key) == value


def test_a_policy_sets_its_own_loss_keys():
    own = [f"+policy.trainers.plan.{key}={str(value).lower()}" for key, value in SET.items()]
    check_overrides("train", [*TEAM, *own])
    cfg = train_config(*TEAM, *own)
    plan, tool = policy_trainer(cfg, "plan"), policy_trainer(cfg, "tool")
    assert {key: plan[key] for key in SET} == SET
    assert (tool.importance_sampling_level, tool.delta, tool.mask_truncated_completions) == ("token", None, False)


@pytest.mark.parametrize("overrides,message", [
    ("trainer.importance_sampling_level=sequence trainer.loss_type=dapo",
     "trainer.importance_sampling_level=sequence with trainer.loss_type=dapo: a token-sum loss weights each "
     "sequence's ratio by its length"),
    ("trainer.importance_sampling_level=sequence trainer.loss_type=cispo",
     "trainer.importance_sampling_level=sequence with trainer.loss_type=cispo"),
    ("trainer.loss_type=luspo", "trainer.loss_type=luspo is a sequence-level loss: set "
     "trainer.importance_sampling_level=sequence"),
    ("trainer.loss_type=vespo trainer.importance_sampling_level=sequence",
     "trainer.loss_type=vespo weights whole sequences itself: keep trainer.importance_sampling_level=token"),
    ("trainer.loss_type=sapo trainer.delta=4", "trainer.delta=4.0: loss_type=sapo does not clip the ratio"),
    ("trainer.delta=1.2", "trainer.delta=1.2 must exceed 1 + epsilon_high = 1.2"),
    ("trainer.delta=1.25 trainer.epsilon_high=0.28", "trainer.delta=1.25 must exceed 1 + epsilon_high = 1.28"),
    ("trainer.delta=1", "trainer.delta=1.0: must be > 1.0"),
    ("trainer.importance_sampling_level=sentence", "trainer.importance_sampling_level: Invalid value 'sentence', "
     "expected one of [token, sequence]"),
    ("trainer.top_entropy_quantile=1.5", "trainer.top_entropy_quantile=1.5: must be >= 0.0 and <= 1.0"),
    ("trainer.entropy_coef=-0.1", "trainer.entropy_coef=-0.1: must be >= 0.0"),
    ("trainer.entropy_coef_delta=0", "trainer.entropy_coef_delta=0.0: must be > 0.0"),
    ("trainer.entropy_coef_min=0.5 trainer.entropy_coef_max=0.1",
     "trainer.entropy_coef_min=0.5 exceeds trainer.entropy_coef_max=0.1"),
    ("trainer.off_policy_mask_threshold=-1", "trainer.off_policy_mask_threshold=-1.0: must be >= 0.0"),
    ("trainer.mask_truncated_completions=maybe", "trainer.mask_truncated_completions: Value 'maybe'"),
    (" ".join([*TEAM[1:], "+policy.trainers.plan.loss_type=bnpo", "+policy.trainers.plan.importance_sampling_level="
                                                                  "sequence"]),
     "policy.trainers.plan.importance_sampling_level=sequence with policy.trainers.plan.loss_type=bnpo"),
    (" ".join([*TEAM[1:], "+policy.trainers.tool.delta=1.1"]), "policy.trainers.tool.delta=1.1 must exceed 1 + "),
    ("trainer.epo_penalty=0.5", "trainer.epo_penalty: no such key; it is loss=epo with loss.penalty now"),
    ("loss.coef=0.01", "loss.coef: no such key; valid keys: name"),
    ("loss=epo trainer.entropy_coef=0.01", "loss=epo (coef=0.001) with TRL's entropy bonus "
     "(trainer.entropy_coef=0.01, use_adaptive_entropy=False): EPO's trajectory-level bonus replaces it"),
    ("loss=epo loss.corridor_low=1.1", "loss.corridor_low=1.1: must be >= 0.0 and <= 1.0"),
    ("loss=epo loss.corridor_high=0.9", "loss.corridor_high=0.9: must be >= 1.0"),
    (" ".join([*TEAM[1:], "loss=epo", "+policy.trainers.plan.loss.decay=-1"]),
     "policy.trainers.plan.loss.decay=-1.0: must be >= 0.0"),
    (" ".join([*TEAM[1:], "loss=epo", "+policy.trainers.plan.loss.name=none"]),
     "policy.trainers.plan.loss.name: not a key this can change"),
    (" ".join([*TEAM[1:], "loss=epo", "+policy.trainers.plan.entropy_coef=0.1"]),
     "loss=epo (coef=0.001) with TRL's entropy bonus (policy.trainers.plan.entropy_coef=0.1"),
])
def test_bad_combinations_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError) as err:
        check_overrides("train", [FAST[0], *overrides.split()])
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)


EPO = {"coef": 0.01, "penalty": 0.5, "corridor_low": 0.5, "corridor_high": 2.0, "decay": 1.0, "window": 5}


def test_epo_composes_for_the_run_and_for_one_policy():
    run = ["loss=epo", *(f"loss.{key}={value}" for key, value in EPO.items())]
    check_overrides("train", [*FAST, *run])
    assert {key: train_config(*FAST, *run).loss[key] for key in EPO} == EPO
    own = ["loss=epo", *(f"+policy.trainers.plan.loss.{key}={value}" for key, value in EPO.items()),
           "+policy.trainers.plan.learning_rate=0.5"]
    check_overrides("train", [*TEAM, *own])
    cfg = train_config(*TEAM, *own)
    assert {key: policy_loss(cfg, "plan")[key] for key in EPO} == EPO
    assert policy_loss(cfg, "tool").coef == 0.001 and policy_trainer(cfg, "plan").learning_rate == 0.5
    assert "loss" not in policy_trainer(cfg, "plan")


def test_the_trainer_keys_are_one_list_on_the_schema():
    """What a policy may change, what goes to TRL's update and what TRL's loss reads are marks on the schema's
    fields: the per-policy keys hold both TRL lists, and grpo_args passes each under its own name."""
    from marl_cli.config.schema import TrainerConfig, marked
    from marl_cli.config.team import TRAINER_KEYS
    from marl_cli.training.learner.trl_adapter import LOSS_KNOBS, UPDATE_KEYS

    assert set(UPDATE_KEYS) | set(LOSS_KNOBS) <= set(TRAINER_KEYS) == set(marked(TrainerConfig, "per_policy"))
    assert {"learning_rate", "loss_type", "epsilon", "num_iterations"} <= set(UPDATE_KEYS)
    assert {"beta", "mini_batch_size", "gradient_checkpointing"} <= set(TRAINER_KEYS) - set(UPDATE_KEYS)
    from marl_cli.config.schema import GROUP_SCHEMAS

    assert all(not marked(schema, "per_policy") and not marked(schema, "trl", "update")
               for group, schema in GROUP_SCHEMAS.items() if group != "trainer")  # marks are the trainer's only


def test_the_cli_refuses_a_bad_combination_before_a_run_dir(tmp_path):
    out = cli("train", "trainer.loss_type=luspo", f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["marl train: error: trainer.loss_type=luspo is a sequence-level loss: "
                                               "set trainer.importance_sampling_level=sequence"]
    assert not (tmp_path / "run").exists()
