"""marl against raw TRL at equal work: one GRPO step each of 8 prompts × 8 completions of exactly 32 tokens (the
tiny model, EOS suppressed in both so every completion is full length; bnpo loss, β 0, one optimiser step of the
64 rows, every row back-propagated), its rollout (sampling and scoring) and its update timed apart; the runs of the
two sides interleaved. marl runs ``experiment=embedded`` cut to one turn, TRL's ``GRPOTrainer`` the same prompts
(marl's first step's, as text) with a reward function paying 0 or 1 at random. Writes a JSON report with each
side's median seconds per step (the first step of each run is left out: it builds caches) and marl's ratios.

Usage: ``python bench/trl_pair.py --pairs 3 --steps 4 --out bench/trl_pair.json`` (``make bench-trl``)."""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir

from marl_cli.config.paths import config_dir
from marl_cli.plugins import register_configs
from marl_cli.policies.tiny import build_tiny_tokenizer, save_tiny

TASKS, GENERATIONS, TOKENS = 8, 8, 32


def tiny_model_dir(workdir: Path, cfg: Any) -> Path:
    """The run's tiny model saved once, its generation config suppressing EOS (every completion full length)."""
    from transformers import GenerationConfig

    target = workdir / "tiny"
    save_tiny(cfg.model.tiny, cfg.seed, target)
    eos = build_tiny_tokenizer().eos_token_id
    generation = GenerationConfig.from_pretrained(target)
    generation.suppress_tokens = [eos]
    generation.save_pretrained(target)
    return target


def marl_config(steps: int) -> Any:
    """``experiment=embedded`` cut to one turn of 8 tasks × 8 samples of 32 tokens, one optimiser step, bnpo."""
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose(config_name="train", overrides=[
            "experiment=embedded", "trainer.warmstart.enabled=false",
            "workflow.max_turns=1", f"rollout.tasks_per_step={TASKS}", f"algorithm.num_generations={GENERATIONS}",
            f"rollout.max_new_tokens={TOKENS}", f"trainer.mini_batch_size={TASKS * GENERATIONS}",
            "trainer.loss_type=bnpo", "trainer.beta=0.0", "trainer.skip_zero_advantage=false", f"trainer.steps={steps}",
            "trainer.save_every=0", "trainer.eval_every=0", "env.eval_size=1", "logger=none", "progress=false",
            "threads=1", "trainer.log_completions_every=0"])


def run_marl(cfg: Any, workdir: Path) -> list[dict[str, float]]:
    """marl's steps: (rollout, update) seconds of each after the first, from its metrics."""
    from marl_cli.training.loop import train

    train(cfg, workdir)
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "time/step_s" in r]
    tokens = {r.get("train/agent/completion_tokens") for r in steps}
    assert tokens == {float(TOKENS)}, f"marl's completions are not all {TOKENS} tokens: {tokens}"
    return [{"rollout_s": r["time/rollout_s"], "update_s": r["time/step_s"] - r["time/rollout_s"]}
            for r in steps[1:]]


def marl_prompts(cfg: Any, workdir: Path) -> list[str]:
    """The text of marl's first step's prompts (what TRL is given), decoded from their tokens."""
    from marl_cli.training.build import build_run

    run = build_run(cfg, workdir)
    tasks = [run.workflow.env.task("train", i) for i in range(TASKS)]
    result = run.rollout.play(tasks, 1, random.Random(0))
    tokenizer = build_tiny_tokenizer()
    return [tokenizer.decode(s.prompt_ids) for s in result.samples]


def run_trl(cfg: Any, model: Path, prompts: list[str], steps: int, workdir: Path) -> list[dict[str, float]]:
    """Raw TRL's steps at the same work (marl's compute dtype and gradient checkpointing, not TRL's defaults of
    bf16 and checkpointing): (rollout, update) seconds of each after the first."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rng = random.Random(0)
    args = GRPOConfig(output_dir=str(workdir), per_device_train_batch_size=TASKS * GENERATIONS,
                      num_generations=GENERATIONS, max_completion_length=TOKENS, loss_type="bnpo", beta=0.0,
                      max_steps=steps, learning_rate=1e-4, logging_steps=1, report_to="none", use_cpu=True,
                      save_strategy="no", seed=0, temperature=1.0, dataloader_num_workers=0,
                      bf16=cfg.model.dtype == "bfloat16", gradient_checkpointing=cfg.trainer.gradient_checkpointing,
                      generation_kwargs={"suppress_tokens": [build_tiny_tokenizer().eos_token_id]})
    trainer = GRPOTrainer(model=str(model), args=args, train_dataset=Dataset.from_dict({"prompt": prompts}),
                          processing_class=build_tiny_tokenizer(),
                          reward_funcs=[lambda completions, **_: [float(rng.random() < 0.5) for _ in completions]])
    times: list[dict[str, float]] = []
    generate = trainer._generate_and_score_completions

    def timed_generate(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        out = generate(*a, **k)
        times[-1]["rollout_s"] = time.perf_counter() - t0
        lengths = out["completion_mask"].sum(1)
        assert bool((lengths == TOKENS).all()), f"TRL's completions are not all {TOKENS} tokens"
        return out

    class StepTimes(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            times.append({"start": time.perf_counter()})

        def on_step_end(self, *a: Any, **k: Any) -> None:
            times[-1]["step_s"] = time.perf_counter() - times[-1].pop("start")

    trainer._generate_and_score_completions = timed_generate
    trainer.add_callback(StepTimes())
    trainer.train()
    return [{"rollout_s": t["rollout_s"], "update_s": t["step_s"] - t["rollout_s"]} for t in times[1:]]


def median(steps: list[dict[str, float]], key: str) -> float:
    return statistics.median(s[key] for s in steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="interleaved marl/TRL run pairs")
    parser.add_argument("--steps", type=int, default=4, help="steps a run (the first is left out)")
    parser.add_argument("--out", default="bench/trl_pair.json")
    args = parser.parse_args()
    register_configs()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cfg = marl_config(args.steps)
        model = tiny_model_dir(work, cfg)
        cfg.model.name_or_path = str(model)  # both sides load the saved model (its EOS suppressed)
        prompts = marl_prompts(cfg, work / "prompts")
        marl, trl = [], []
        for pair in range(args.pairs):
            marl += run_marl(cfg, work / f"marl_{pair}")
            trl += run_trl(cfg, model, prompts, args.steps, work / f"trl_{pair}")
    report: dict[str, Any] = {"work": {"prompts": TASKS, "generations": GENERATIONS, "tokens": TOKENS,
                                       "threads": 1, "pairs": args.pairs, "steps_per_run": args.steps}}
    for side, steps in (("marl", marl), ("trl", trl)):
        report[side] = {key: median(steps, key) for key in ("rollout_s", "update_s")}
        report[side]["step_s"] = report[side]["rollout_s"] + report[side]["update_s"]
    report["marl_vs_trl"] = {key: report["marl"][key] / report["trl"][key] for key in report["marl"]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
