"""Every config in conf/ composes; typos and type errors give a one-line error."""

import importlib.util
import inspect
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from marl_cli.cli.first_run import GROUPS as RECIPE_GROUPS
from marl_cli.cli.first_run import RECIPES
from marl_cli.config.errors import ConfigError
from marl_cli.config.paths import config_dir
from marl_cli.config.schema import ISCorrection, LossType, SchedulerType
from marl_cli.config.validate import check_config, check_overrides, sweep_variants
from marl_cli.plugins import register_configs
from tests.helpers import cli, marl

register_configs()
CONF = config_dir()
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir())
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONF / g).glob("*.yaml")) if g != "experiment"]
SUBPROCESS_START_S = 2.0
"""Slack for the test machine's process start-up beyond what the command itself takes."""
EXPERIMENTS = sorted(str(p.relative_to(CONF / "experiment").with_suffix(""))
                     for p in (CONF / "experiment").rglob("*.yaml"))


def _compose(overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


@pytest.mark.parametrize("group,option", OPTIONS)
def test_every_group_option_composes(group, option):
    overrides = [f"{group}={option}"]
    if (group, option) == ("model", "hf"):
        overrides.append("model.name_or_path=some/model")
    if (group, option) == ("dry_run", "cpu_embedded"):
        overrides.append("env=math")
    if (group, option) in (("workflow", "deep_research"), ("workflow", "solo_research")):
        overrides.append("algorithm=m_grpo")  # workflows rewarded per trajectory train with M-GRPO
    if (group, option) == ("credit", "igpo"):
        overrides.append("algorithm.norm_group=episode")  # IGPO normalises every turn of a task together
    if (group, option) in (("algorithm", "rae"), ("algorithm", "mars")):
        overrides += ["env=openspiel", "workflow=game"]  # the game estimators score the seats of a game
    if (group, option) in (("env", "openspiel"), ("env", "textarena"), ("env", "pettingzoo")):
        overrides.append("workflow=game")  # a game: a role per seat
    adapters = {("env", "dataset"): "env.train.source=examples/datasets/arithmetic.jsonl",
                ("env", "openenv"): "env.environment=examples/openenv_envs/guess_number.py:GuessNumberEnvironment"}
    if (group, option) in adapters:
        overrides.append(adapters[group, option])  # an adapter needs the user's data or environment
    if (group, option) == ("workflow", "game"):
        overrides.append("env=openspiel")
    if (group, option) == ("workflow", "propose_solve"):
        overrides += ["env=math", "algorithm.batch_roles=[proposer]"]  # a family whose tasks a model can write
    if (group, option) == ("workflow", "propose_solve_judge"):
        overrides += ["env=math", "algorithm.batch_roles=[proposer,judge]"]
    if group == "reward" and option != "none":
        overrides.append("reward.roles=[agent]")  # a reward model names the roles it scores
    if (group, option) == ("reward", "http"):
        overrides.append("reward.probe=false")  # no judge server here
    pairs = {("algorithm", "ppo"): "critic=token", ("algorithm", "marft"): "critic=utterance",
             ("algorithm", "archer"): "critic=utterance", ("critic", "token"): "algorithm=ppo",
             ("critic", "utterance"): "algorithm=archer"}
    if (group, option) in pairs:
        overrides.append(pairs[group, option])  # a value-based algorithm and the critic it reads
    cfg = _compose(overrides)
    OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    if (group, option) == ("rollout", "vllm") and importlib.util.find_spec("vllm") is None:
        with pytest.raises(ConfigError, match="^rollout=vllm needs vllm: "):  # complete, but vLLM is not installed
            check_config(cfg)
        return
    check_config(cfg)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes(experiment):
    """... and a recipe (``cli.first_run.RECIPES``) picks the group options it is declared with."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"experiment={experiment}"], return_hydra_config=True)
    choices = cfg.hydra.runtime.choices
    recipe = next((r for r in RECIPES if r.experiment == experiment), None)
    if recipe is not None:
        assert {g: choices[g] for g in RECIPE_GROUPS} == {g: getattr(recipe, g) for g in RECIPE_GROUPS}
    with open_dict(cfg):
        del cfg["hydra"]
    OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    check_config(cfg)
    assert cfg.name != "default"


def test_every_recipe_is_an_experiment():
    assert {r.experiment for r in RECIPES} <= set(EXPERIMENTS)


def test_config_dir_is_the_checkout_conf():
    assert Path(__file__).resolve().parents[2] / "conf" == CONF


@pytest.mark.parametrize("override,message", [
    ("trainer.learnin_rate=1", "trainer.learnin_rate: no such key; valid keys: steps, learning_rate"),
    ("trainer.steps=abc", "trainer.steps: Value 'abc' of type 'str' could not be converted to Integer"),
    ("env=plan_pth", "env=plan_pth: no such option; choose from: "),
    ("seeed=1", "seeed: no such key; valid keys: env, workflow"),
    ("env.size=1.5", "env.size: Value '1.5' of type 'float' could not be converted to Integer"),
    ("trainer.loss_type=bnp0", "trainer.loss_type: Invalid value 'bnp0', expected one of [grpo, dr_grpo, dapo, bnpo"),
    ("algorithm.filter=zero-std", "algorithm.filter: Invalid value 'zero-std', expected one of [none, zero_std]"),
    ("trainer.lr_scheduler_type=cosin", "trainer.lr_scheduler_type: Invalid value 'cosin', expected one of [linear"),
    ("model.dtype=bf16", "model.dtype: Invalid value 'bf16', expected one of [float32, bfloat16, float16]"),
    ("trainer.role=both", "trainer.role: Invalid value 'both', expected one of [all, main, sub]"),
    ("+trainer.foo=1", "trainer.foo: no such key; valid keys: steps, learning_rate"),
    ("+foo=1", "foo: no such key; valid keys: env, workflow"),
    ("rollout.eval_temperature=0.5", "rollout.eval_temperature: no such key; it is eval.temperature now"),
    ("trainer.sync=false", "trainer.sync: no such key; it is trainer.max_staleness (sync=true is 0"),
    ("trainer.max_staleness=-1", "trainer.max_staleness=-1: must be >= 0"),
    ("trainer.heartbeat_timeout_s=0", "trainer.heartbeat_timeout_s=0.0: must be > 0.0"),
    ("eval.samples=4", "eval.samples=4 with eval.temperature=0 repeats one greedy episode"),  # training evals too
    ("trainer.learning_rate=0", "trainer.learning_rate=0.0: must be > 0.0"),
    ("trainer.save_every=-1", "trainer.save_every=-1: must be >= 0"),
    ("trainer.log_every=0", "trainer.log_every=0: must be >= 1"),
    ("rollout.max_new_tokens=0", "rollout.max_new_tokens=0: must be >= 1"),
    ("rollout.max_prompt_length=0", "rollout.max_prompt_length=0: must be >= 1"),
    ("rollout.top_p=1.5", "rollout.top_p=1.5: must be > 0.0 and <= 1.0"),
    ("rollout.temperature=0", "rollout.temperature=0.0: must be > 0.0"),
    ("threads=-1", "threads=-1: must be >= 0"),
    ("env.name=nope", "env.name='nope' is not registered; choose from: "),
    ("workflow.name=nope", "workflow.name='nope' is not registered; choose from: "),
    ("algorithm.name=trpo", "algorithm.name='trpo' is not registered; choose from: "),
    ("rollout.backend=sglang", "rollout.backend='sglang' is not registered; choose from: "),
    ("policy.name=bogus", "policy.name='bogus' is not registered; choose from: "),
    ("algorithm.mode=tree", "algorithm.mode=tree is not defined for algorithm=grpo; choose from: independent"),
    ("device=gpu", "device: 'gpu' is not a device; choose from auto, cpu, mps, cuda, cuda:<index>"),
    ("policy.devices=[cuda:0,gpu1]", "policy.devices: 'gpu1' is not a device"),
    ("model=hf", "model.name_or_path: must be given: a local model dir or a hub id"),
    ("+model.system_prompts.ghost=hi", "model.system_prompts names roles ['ghost'] that the workflow lacks"),
    ("model=hf model.name_or_path=/missing/dir", "model.name_or_path=/missing/dir: no such directory"),
    ("policy=lora_per_role policy.devices=[cpu]", "policy.devices places full-model policies; policy=lora_per_role"),
    ("policy=lora_per_role trainer.sharding=fsdp2", "trainer.sharding=fsdp2 splits full-model learners across"),
    ("trainer.sharding=zero3", "trainer.sharding"),
    ("trainer.frozen_roles=[ghost]", "trainer.frozen_roles names roles ['ghost'] that the workflow lacks"),
    ("trainer.role=sub", "trainer.role=sub runs decoupled M-GRPO trainers; it needs algorithm=m_grpo"),
    ("trainer.resume=/no/such/run", "trainer.resume=/no/such/run: no such directory"),
    ("workflow=deep_research", "workflow=deep_research rewards whole trajectories; train it with algorithm=m_grpo"),
])
def test_errors_are_one_line(override, message):
    with pytest.raises(ConfigError) as err:
        check_overrides("train", override.split())
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("override,names", [
    ("env=plan_pth", {"code", "math", "plan_path", "research", "sokoban", "sudoku"}),
    ("env.name=nope", {"code", "math", "plan_path", "research", "sokoban", "sudoku"}),
    ("workflow.name=nope", {"code_test", "deep_research", "single_agent", "tool_plan", "tool_reason"}),
    ("algorithm.name=trpo", {"archer", "at_grpo", "grpo", "m_grpo", "marft", "ppo"}),
    ("rollout.backend=sglang", {"hf", "vllm"}),
    ("policy.name=bogus", {"lora_per_role", "per_role", "shared"}),
])
def test_an_unknown_name_lists_the_choices(override, names):
    """The choices listed hold the built-in ones (membership, so a new built-in plug-in breaks no test)."""
    with pytest.raises(ConfigError) as err:
        check_overrides("train", [override])
    listed = str(err.value).split("choose from: ", 1)[1].split(" (", 1)[0]
    assert names <= set(listed.split(", "))


def test_vllm_backend_needs_vllm_before_the_run():
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ConfigError, match=r"^rollout=vllm needs vllm: pip install 'marl\[vllm\]'"):
            check_overrides("train", ["rollout=vllm"])
    else:
        check_overrides("train", ["rollout=vllm"])


def test_every_sweep_value_is_checked():
    assert sweep_variants(["a=1,2", "b=x", "c=3,4"]) == [["a=1", "b=x", "c=3"], ["a=2", "b=x", "c=3"],
                                                         ["a=1", "b=x", "c=4"]]
    with pytest.raises(ConfigError, match="trainer.steps"):
        check_overrides("train", ["trainer.steps=1,oops"])


def test_cli_typo_exits_2_with_one_line():
    out = cli("train", "trainer.learnin_rate=1")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("marl train: error: trainer.learnin_rate: no such key")
    assert "Traceback" not in out.stderr


def test_cli_bad_choice_fails_fast_and_makes_no_run_dir(tmp_path):
    t0 = time.perf_counter()
    out = marl("train", "trainer.loss_type=bnp0", f"hydra.run.dir={tmp_path / 'run'}")
    assert time.perf_counter() - t0 < 3 + SUBPROCESS_START_S
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "marl train: error: trainer.loss_type: Invalid value 'bnp0', expected one of "
        "[grpo, dr_grpo, dapo, bnpo, cispo, sapo, luspo, vespo]"]
    assert not (tmp_path / "run").exists()


def test_choices_match_trl_and_transformers():
    from transformers import SchedulerType as HFSchedulers
    from trl import GRPOConfig, GRPOTrainer

    assert {s.value for s in SchedulerType} <= {s.value for s in HFSchedulers}
    for loss in LossType:
        assert GRPOConfig(output_dir="unused", loss_type=loss, report_to=[], use_cpu=True, bf16=False).loss_type == loss
    trl_modes = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    for mode in ISCorrection:  # marl's importance-sampling modes are TRL's vLLM ones (plus none)
        assert mode == "none" or f"'{mode}'" in trl_modes or f'"{mode}"' in trl_modes


def test_cli_help_lists_commands_and_groups():
    top = cli("--help")
    assert top.returncode == 0 and "train" in top.stdout
    unknown = cli("nope")
    assert unknown.returncode == 2 and "unknown command" in unknown.stderr
    app = cli("train", "--help")
    assert app.returncode == 0
    for group in ("env", "workflow", "algorithm", "policy", "model", "rollout", "trainer", "logger", "experiment"):
        assert f"{group}:" in app.stdout
    assert "base_" not in app.stdout  # schemas are not options
    assert "the task family" in app.stdout and "toy/table/{code_at_grpo_per_role," in app.stdout


def test_a_plug_in_option_whose_module_is_not_loaded_names_what_to_load(tmp_path):
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "ghost.yaml").write_text("defaults:\n  - base_ghost\n  - _self_\n\nname: ghost\n")
    with pytest.raises(ConfigError) as err:
        check_overrides("train", ["env=ghost"], [str(tmp_path)])
    assert str(err.value) == (
        "env=ghost: the schema env/base_ghost is not registered, so the plug-in that defines env 'ghost' is not "
        "loaded; name the plug-in's module or .py file in MARL_PLUGINS (comma-separated) or in the marl.plugins "
        "entry-point group")
    with pytest.raises(ConfigError, match=r"^env=ghost: no such option; choose from: .*plan_path.* \(a plug-in's env\? "
                                          r"add its config dir with --config-dir and its module with MARL_PLUGINS\)$"):
        check_overrides("train", ["env=ghost"])  # nor its config dir
    with pytest.raises(ConfigError, match=r"^experiment=toy/nope: no such option; choose from: "
                                          r"toy/.*, toy/table/, toy/tasks/, toy/values/$"):
        check_overrides("train", ["experiment=toy/nope"])
    with pytest.raises(ConfigError, match=r"^env.name='ghost' is not registered; choose from: .* \(a plug-in's\? "
                                          r"name its module in MARL_PLUGINS\)$"):
        check_overrides("train", ["env.name=ghost"])


@pytest.mark.parametrize("device,visible,message", [
    ("cuda", 0, "device='cuda' but no CUDA device is visible"),
    ("cuda:2", 2, "device='cuda:2' but this machine has 2 CUDA device(s), cuda:0 to cuda:1"),
    ("cuda:1", 2, None),
])
def test_the_device_is_checked_before_anything_is_built(monkeypatch, device, visible, message):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: visible > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    if message is None:
        check_overrides("train", [f"device={device}"])
        return
    with pytest.raises(ConfigError, match=f"^{message}".replace("(", r"\(").replace(")", r"\)")):
        check_overrides("train", [f"device={device}"])
    with pytest.raises(ConfigError, match="^policy.devices: " + message.replace("(", r"\(").replace(")", r"\)")):
        check_overrides("train", ["policy.devices=[cpu," + device + "]"])


def _choices(experiment: str) -> set[tuple[str, str]]:
    """The (group, option) pairs ``experiment``'s defaults list selects, through the experiments it builds on (read
    from its YAML: what composing it would choose, at none of Hydra's cost)."""
    data = yaml.safe_load((CONF / "experiment" / f"{experiment}.yaml").read_text()) or {}
    out: set[tuple[str, str]] = set()
    for entry in data.get("defaults", []):
        if isinstance(entry, str) and entry.startswith("/experiment/"):
            out |= _choices(entry.removeprefix("/experiment/").split("@")[0])
        elif isinstance(entry, dict):
            out |= {(key.removeprefix("override ").strip("/"), str(value)) for key, value in entry.items()}
    return out


def covering_experiments() -> list[str]:
    """Few experiments that between them select every plug-in option the experiments select (greedily, the one
    adding most first)."""
    chosen = {e: _choices(e) for e in EXPERIMENTS}
    left, cover = set().union(*chosen.values()), []
    while left:
        best = max(EXPERIMENTS, key=lambda e: len(chosen[e] & left))
        cover.append(best)
        left -= chosen[best]
    return cover


def test_the_plug_ins_stay_light():
    """Loading every plug-in, then composing and checking the default config and experiments that select every
    plug-in option, imports none of torch, transformers and trl (plug-in modules import them inside the functions
    that use them)."""
    probe = textwrap.dedent(f"""
        import sys
        from hydra import compose, initialize_config_dir
        from marl_cli.config.paths import config_dir
        from marl_cli.config.validate import check_config
        from marl_cli.plugins import register_configs
        register_configs()
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            for overrides in [[], *([f"experiment={{e}}"] for e in {covering_experiments()!r})]:
                check_config(compose(config_name="train", overrides=overrides))
        heavy = sorted({{"torch", "transformers", "trl"}} & set(sys.modules))
        assert not heavy, f"imported {{heavy}}"
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]


def test_cli_device_without_cuda_fails_before_a_run_dir_or_model(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = marl("train", "device=cuda", f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("marl train: error: device='cuda' but no CUDA device is visible")
    assert out.stdout == "" and not (tmp_path / "run").exists()  # no job started: no run dir, nothing logged
