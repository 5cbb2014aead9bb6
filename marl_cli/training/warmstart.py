"""Supervised warm start on oracle demonstrations, through TRL's SFTTrainer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from datasets import Dataset
from transformers import PrinterCallback
from trl import SFTConfig, SFTTrainer

from marl_cli.policies.loading import format_prompt
from marl_cli.policies.regime import Policy
from marl_cli.workflows.base import Workflow


def demonstrations(workflow: Workflow, roles: list[str], num_examples: int,
                   use_chat_template: bool, policy: Policy) -> Dataset:
    """Prompt/completion pairs from the oracle on warm-start tasks (disjoint from RL and eval tasks)."""
    env = workflow.env
    prompts, completions = [], []
    index = 0
    while len(prompts) < num_examples:
        state = env.initial_state(env.task("warmstart", index))
        index += 1
        for role in roles:
            completion = workflow.demonstration(role, state)
            if completion is not None:
                prompts.append(format_prompt(policy.tokenizer, workflow.prompt(role, state), use_chat_template))
                completions.append(completion)
    return Dataset.from_dict({"prompt": prompts[:num_examples], "completion": completions[:num_examples]})


def warm_start(policy: Policy, workflow: Workflow, cfg: Any, use_chat_template: bool, output_dir: Path,
               seed: int) -> dict[str, float]:
    """Fine-tune ``policy`` on demonstrations for its roles; return TRL's final training metrics."""
    data = demonstrations(workflow, policy.roles, cfg.num_examples, use_chat_template, policy)
    args = SFTConfig(
        output_dir=str(output_dir),
        num_train_epochs=cfg.epochs,
        learning_rate=cfg.learning_rate,
        per_device_train_batch_size=cfg.batch_size,
        lr_scheduler_type=cfg.lr_scheduler_type,
        warmup_steps=cfg.warmup_ratio,
        gradient_checkpointing=False,
        use_cpu=policy.model.device.type == "cpu",
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        seed=seed,
    )
    trainer = SFTTrainer(model=policy.model, args=args, train_dataset=data, processing_class=policy.tokenizer)
    trainer.remove_callback(PrinterCallback)  # marl logs the result itself
    result = trainer.train()
    return {"loss": float(result.training_loss), "examples": float(len(data)),
            "steps": float(result.global_step)}
