"""marl against raw TRL at equal work, the comparison ``make bench-trl`` runs on the CPU and ``marl gpu-check``'s
``speed-*`` checks on a GPU: one GRPO step each of ``Work.tasks`` prompts × ``Work.generations`` completions of
exactly ``Work.tokens`` tokens (EOS suppressed in both, so every completion is full length; bnpo loss, β 0, one
optimiser step of every row, each back-propagated), its rollout (sampling and scoring) and its update timed apart,
the runs of the two sides interleaved. marl runs ``experiment=embedded`` cut to one turn, TRL's ``GRPOTrainer`` the
same prompts (marl's first step's, as text) with a reward function paying 0 or 1 at random, both from one saved
model (the tiny one, or any shape of it: ``shape_overrides``), in marl's compute dtype and gradient checkpointing.
Each side's figure is the median over its runs' steps after the first (which builds caches).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marl_cli.gpu_check.common import compose_train, cuda_peak
from marl_cli.policies.tiny import build_tiny_tokenizer, save_tiny


@dataclass(frozen=True)
class Work:
    """What one step holds: ``tasks`` prompts × ``generations`` completions of ``tokens`` tokens; ``steps`` a run."""

    tasks: int = 8
    generations: int = 8
    tokens: int = 32
    steps: int = 4


def shape_overrides(shape: dict[str, int]) -> list[str]:
    """``model.tiny.*`` overrides giving the tiny model's layers ``shape`` (its vocabulary stays the tiny one)."""
    return [f"model.tiny.{key}={value}" for key, value in shape.items()]


def embedded_config(work: Work, *overrides: str) -> Any:
    """``experiment=embedded`` (3 turns) at ``work``'s tasks, group, completion length and steps, timed only: no
    warm start, evaluation, checkpoint, logger or progress bar."""
    return compose_train(
        "experiment=embedded", "trainer.warmstart.enabled=false", f"rollout.tasks_per_step={work.tasks}",
        f"algorithm.num_generations={work.generations}", f"rollout.max_new_tokens={work.tokens}",
        f"trainer.steps={work.steps}", "trainer.save_every=0", "trainer.eval_every=0", "env.eval_size=1",
        "logger=none", "progress=false", "trainer.log_completions_every=0", *overrides)


def marl_config(work: Work, *overrides: str) -> Any:
    """``embedded_config`` cut to one turn: one optimiser step of every row, bnpo, β 0."""
    return embedded_config(work, "workflow.max_turns=1", f"trainer.mini_batch_size={work.tasks * work.generations}",
                           "trainer.loss_type=bnpo", "trainer.beta=0.0", "trainer.skip_zero_advantage=false",
                           *overrides)


def model_dir(workdir: Path) -> Path:
    """Where ``saved_model`` saves the model both sides of a comparison in ``workdir`` load."""
    return workdir / "model"


def saved_model(workdir: Path, cfg: Any) -> Path:
    """The run's model saved once for both sides (``model_dir``), its generation config suppressing EOS (every
    completion full length)."""
    from transformers import GenerationConfig

    target = model_dir(workdir)
    save_tiny(cfg.model.tiny, cfg.seed, target)
    generation = GenerationConfig.from_pretrained(target)
    generation.suppress_tokens = [build_tiny_tokenizer().eos_token_id]
    generation.save_pretrained(target)
    return target


def marl_prompts(cfg: Any, workdir: Path, work: Work) -> list[str]:
    """The text of marl's first step's prompts (what TRL is given), decoded from their tokens."""
    from marl_cli.training.build import build_run

    run = build_run(cfg, workdir)
    tasks = [run.workflow.env.task("train", i) for i in range(work.tasks)]
    result = run.rollout.play(tasks, 1, random.Random(0))
    tokenizer = build_tiny_tokenizer()
    return [tokenizer.decode(s.prompt_ids) for s in result.samples]


def run_marl(cfg: Any, workdir: Path, work: Work) -> list[dict[str, float]]:
    """marl's steps: (rollout, update) seconds of each after the first, from its metrics."""
    from marl_cli.training.loop import train

    train(cfg, workdir)
    steps = step_records(workdir)
    tokens = {r.get("train/agent/completion_tokens") for r in steps}
    if tokens != {float(work.tokens)}:
        raise RuntimeError(f"marl's completions are not all {work.tokens} tokens: {tokens}")
    return [{"rollout_s": r["time/rollout_s"], "update_s": r["time/step_s"] - r["time/rollout_s"]}
            for r in steps[1:]]


def step_records(run: Path) -> list[dict[str, Any]]:
    """The per-step records of the run in ``run`` (those with ``time/step_s``)."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "time/step_s" in r]


def run_trl(cfg: Any, model: Path, prompts: list[str], work: Work, workdir: Path) -> list[dict[str, float]]:
    """Raw TRL's steps at the same work, on marl's device, in its compute dtype (bf16 autocast over fp32 weights)
    and gradient checkpointing: (rollout, update) seconds of each after the first."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    rng = random.Random(0)
    args = GRPOConfig(output_dir=str(workdir), per_device_train_batch_size=work.tasks * work.generations,
                      num_generations=work.generations, max_completion_length=work.tokens, loss_type="bnpo",
                      beta=0.0, max_steps=work.steps, learning_rate=1e-4, logging_steps=1, report_to="none",
                      use_cpu=not str(cfg.device).startswith("cuda"), save_strategy="no", seed=0, temperature=1.0,
                      dataloader_num_workers=0, bf16=cfg.model.dtype == "bfloat16",
                      gradient_checkpointing=cfg.trainer.gradient_checkpointing,
                      generation_kwargs={"suppress_tokens": [build_tiny_tokenizer().eos_token_id]})
    trainer = GRPOTrainer(model=str(model), args=args, train_dataset=Dataset.from_dict({"prompt": prompts}),
                          processing_class=build_tiny_tokenizer(),
                          reward_funcs=[lambda completions, **_: [float(rng.random() < 0.5) for _ in completions]])
    return _timed_trl(trainer, work)


def _timed_trl(trainer: Any, work: Work) -> list[dict[str, float]]:
    """``trainer.train()``, its steps' (rollout, update) seconds after the first (the rollout: TRL's generation and
    scoring, the update: the rest of its step)."""
    from transformers import TrainerCallback

    times: list[dict[str, float]] = []
    generate = trainer._generate_and_score_completions

    def timed_generate(*a: Any, **k: Any) -> Any:
        start = time.perf_counter()
        out = generate(*a, **k)
        times[-1]["rollout_s"] = time.perf_counter() - start
        if not bool((out["completion_mask"].sum(1) == work.tokens).all()):
            raise RuntimeError(f"TRL's completions are not all {work.tokens} tokens")
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


def compare(work: Work, overrides: list[str], pairs: int, workdir: Path) -> dict[str, Any]:
    """``pairs`` interleaved marl and TRL runs of ``work`` (marl's config changed by ``overrides``): each side's
    median rollout, update and step seconds (on CUDA its runs' peak memory allocated, MiB), and marl's over TRL's."""
    cfg = marl_config(work, *overrides)
    cfg.model.name_or_path = str(saved_model(workdir, cfg))  # both sides load the saved model (its EOS suppressed)
    prompts = marl_prompts(cfg, workdir / "prompts", work)
    steps: dict[str, list[dict[str, float]]] = {"marl": [], "trl": []}
    peaks: dict[str, list[float | None]] = {"marl": [], "trl": []}
    for pair in range(pairs):
        with cuda_peak(str(cfg.device)) as peak:
            steps["marl"] += run_marl(cfg, workdir / f"marl_{pair}", work)
        peaks["marl"].append(peak[0])
        with cuda_peak(str(cfg.device)) as peak:
            steps["trl"] += run_trl(cfg, Path(cfg.model.name_or_path), prompts, work, workdir / f"trl_{pair}")
        peaks["trl"].append(peak[0])
    report: dict[str, Any] = {}
    for side, timed in steps.items():
        report[side] = {key: statistics.median(s[key] for s in timed) for key in ("rollout_s", "update_s")}
        report[side]["step_s"] = report[side]["rollout_s"] + report[side]["update_s"]
        if peaks[side][0] is not None:
            report[side]["peak_mib"] = max(peaks[side])
    report["marl_vs_trl"] = {key: report["marl"][key] / report["trl"][key]
                             for key in ("rollout_s", "update_s", "step_s")}
    return report
