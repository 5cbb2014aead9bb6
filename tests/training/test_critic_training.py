"""Value models in whole runs (in-process, tiny model): each value-based algorithm trains its critic beside the
policies, logs its diagnostics, and a resume (critic weights, target copy, optimiser, replay buffer) continues
exactly as the uninterrupted run; a critic warm-up holds the policies; ``marl eval`` reads the policies only."""

import json

import pytest
import torch

from marl_cli.config.errors import ConfigError
from marl_cli.training.checkpoint import load_state
from marl_cli.training.loop import train
from tests.helpers import FAST, cli, train_config

CASES = {
    "ppo": ["algorithm=ppo", "critic=token"],
    "marft": ["workflow=tool_plan", "workflow.max_turns=2", "algorithm=marft", "critic=utterance",
              "critic.scope=team"],
    "archer": ["workflow.max_turns=2", "algorithm=archer", "critic=utterance", "critic.replay_batch_size=8",
               "critic.updates_per_step=2"],
    "ppo_shared_trunk": ["algorithm=ppo", "critic=token", "critic.share_trunk=true"],
}
RUN = [*FAST, "critic.learning_rate=1e-3", "trainer.save_every=1", "trainer.eval_every=0",
       "trainer.log_completions_every=1", "rollout.temperature=1.5"]


def _records(run, name):
    return [json.loads(line) for line in (run / name).read_text().splitlines()]


def _equal(a, b, where=""):
    """Two nested states hold the same values (tensors bit for bit: the same computation in one process)."""
    if torch.is_tensor(a):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert set(a) == set(b), where
        for key in a:
            _equal(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


@pytest.mark.parametrize("name", CASES)
def test_a_resumed_run_with_a_critic_equals_the_uninterrupted_one(tmp_path, name):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert train(train_config(*RUN, *CASES[name], "trainer.steps=3"), whole)["status"] == "completed"
    train(train_config(*RUN, *CASES[name], "trainer.steps=2"), cut)
    assert train(train_config(*RUN, *CASES[name], "trainer.steps=3", f"trainer.resume={cut}"), cut)["status"] == \
        "completed"
    a, b = (load_state(run / "checkpoints" / "step_000003") for run in (whole, cut))
    assert a["critics"] and (name != "archer" or all(c["buffer"]["transitions"] for c in a["critics"].values()))
    _equal(a["critics"], b["critics"], "critics")
    _equal(a["trainers"], b["trainers"], "trainers")
    step3 = [[{k: v for k, v in r.items() if not k.startswith("time/")} for r in _records(run, "metrics.jsonl")
              if r.get("step") == 3 and "train/reward" in r] for run in (whole, cut)]
    assert step3[0] == step3[1]
    critic = next(k for k in step3[0][0] if k.startswith("critic/") and k.endswith("/value_loss"))
    assert step3[0][0][critic] > 0
    if name == "archer":
        assert step3[0][0]["critic/shared/replay/size"] > 0
        assert 0 < step3[0][0]["critic/shared/replay/off_policy_fraction"] < 1


def test_ppo_rows_carry_the_critics_values_and_returns(tmp_path):
    run = tmp_path / "r"
    train(train_config(*RUN, *CASES["ppo"], "trainer.steps=1"), run)
    rows = [r for r in _records(run, "samples.jsonl") if r["split"] == "train"]
    assert rows and all(len(r["values"]) == len(r["returns"]) == len(r["token_advantages"]) > 0 for r in rows)
    step = next(r for r in _records(run, "metrics.jsonl") if "train/reward" in r)
    assert {"critic/shared/explained_variance", "critic/shared/td_error/mean", "critic/shared/value/mean",
            "critic/shared/target/std", "train/return_mean", "train/value_mean"} <= set(step)


def test_a_critic_warm_up_holds_the_policies(tmp_path):
    run = tmp_path / "r"
    train(train_config(*RUN, *CASES["ppo"], "trainer.steps=2", "critic.warmup_steps=1"), run)
    steps = [r for r in _records(run, "metrics.jsonl") if "train/reward" in r]
    assert [r["train/shared/active"] for r in steps] == [0.0, 1.0]
    assert "train/shared/loss" not in steps[0] and "critic/shared/value_loss" in steps[0]


def test_marl_eval_loads_a_run_with_a_critic(tmp_path):
    run = tmp_path / "r"
    train(train_config(*RUN, *CASES["ppo"], "trainer.steps=1"), run)
    out = cli("eval", *FAST, "algorithm=ppo", "critic=token", f"load={run}", f"hydra.run.dir={tmp_path / 'ev'}")
    assert out.returncode == 0, out.stderr


def test_a_critic_model_with_another_tokenizer_is_refused_before_training(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    other = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    other.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=other, eos_token="b").save_pretrained(tmp_path / "other")
    assert AutoTokenizer.from_pretrained(tmp_path / "other").get_vocab()
    with pytest.raises(ConfigError, match=r"^critic.model.name_or_path=.*other: its tokenizer differs from policy "
                                          r"'shared'"):
        train(train_config(*RUN, *CASES["ppo"], f"+critic.model.name_or_path={tmp_path / 'other'}"), tmp_path / "r")
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_a_shared_trunk_critic_trains_the_policys_own_model(tmp_path):
    """``critic.share_trunk``: the value head sits on the policy's model itself; with the policies held by the
    critic's warm-up, only the critic's regression moves the policy's weights (and its version, so rollout
    backends re-sync)."""
    from marl_cli.training.build import build_run
    from marl_cli.training.loop import Trainer

    cfg = train_config(*RUN, *CASES["ppo_shared_trunk"], "trainer.steps=2", "critic.warmup_steps=1")
    trainer = Trainer(build_run(cfg, tmp_path / "r"))
    trainer.prepare()
    policy = trainer.run.policies["shared"]
    assert trainer.critics.critics["shared"].model.trunk is policy.model.get_decoder()
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    version = policy.version
    metrics, _ = trainer.train_step(1)
    assert metrics["train/shared/active"] == 0.0 and policy.version > version
    after = policy.model.state_dict()
    assert set(after) == set(before)  # the value head is the critic's, not a weight of the policy's model
    assert any(not torch.equal(before[k], after[k]) for k in before)
    trainer.close("completed")
