"""Typed schemas for every config group, registered in Hydra's ConfigStore.

Each group YAML in ``conf/`` starts its defaults list with a schema registered in Hydra's ConfigStore
as ``<group>/base_<name>`` (the plug-ins' own schemas come from their registries), so a misspelt key,
a value of the wrong type or a value outside a field's choices fails at composition. Fields that take
one of a fixed set of values are ``StrEnum``s (OmegaConf names the choices); numeric ranges are field
metadata (``bounded``), checked with every other rule by ``config.validate.check_config`` before a run
starts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from marl_cli.config.errors import ConfigError
from marl_cli.config.registry import registries


def bounded(default: Any, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
            per_policy: bool = False, trl: str | None = None) -> Any:
    """A field whose value must be ``>= ge``, ``> gt`` and ``<= le`` (None: no bound; a None value is never checked),
    marked as ``reads`` says."""
    return field(default=default, metadata={"ge": ge, "gt": gt, "le": le, **reads(per_policy=per_policy, trl=trl)})


def check_warmup(key: str, warmup: int, steps: int) -> None:
    """A warm-up of ``warmup`` steps in which the policies wait (``key``) leaves them a step of ``trainer.steps``
    (``steps``; 0: no limit)."""
    if warmup >= steps > 0:
        raise ConfigError(f"{key}={warmup}: the policies would never train in trainer.steps={steps}")


def reads(*, per_policy: bool = False, trl: str | None = None) -> dict[str, Any]:
    """Who reads a trainer key, as field metadata (``field(default=..., metadata=reads(...))`` for a key without
    bounds): ``per_policy``, a policy may change it (``policy.trainers.<policy>.<key>``); ``trl``, it goes to TRL's
    ``GRPOConfig`` under its own name, as an ``update`` setting (optimiser, schedule, clip) or a ``loss`` knob read by
    TRL's ``compute_loss``. ``marked`` lists them: the one list of each."""
    return {"per_policy": per_policy, "trl": trl}


def marked(schema: type, flag: str, value: Any = True) -> tuple[str, ...]:
    """The keys of ``schema`` whose ``bounded`` field sets ``flag`` to ``value``, in the schema's order."""
    return tuple(f.name for f in fields(schema) if f.metadata.get(flag) == value)


def choices(name: str, *values: str, module: str = __name__) -> type[StrEnum]:
    """A ``StrEnum`` of ``values``: a field typed with it accepts only them, and OmegaConf names them on error.
    ``module`` is where it is assigned to ``name`` (a plug-in's own: ``__name__``), so it pickles."""
    return StrEnum(name, [(v, v) for v in values], module=module)


RolloutMode = choices("RolloutMode", "independent", "tree")
CriticScope = choices("CriticScope", "policy", "team")
DType = choices("DType", "float32", "bfloat16", "float16")
Proposals = choices("Proposals", "any", "kinds")
LossType = choices("LossType", "grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
"""TRL's GRPO loss formulations (``GRPOConfig.loss_type``)."""
CLIPPED_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
"""The loss types whose ratio TRL clips to [1 − ε_low, 1 + ε_high] (and, with ``delta``, to at most δ)."""
SchedulerType = choices("SchedulerType", "linear", "cosine", "cosine_with_restarts", "polynomial", "constant",
                        "constant_with_warmup", "inverse_sqrt", "cosine_with_min_lr", "cosine_warmup_with_min_lr",
                        "warmup_stable_decay")
"""transformers' learning-rate schedules that need no metric."""
TrainerRole = choices("TrainerRole", "all", "main", "sub")
Sharding = choices("Sharding", "none", "fsdp2")
KVCache = choices("KVCache", "dynamic", "static")
ISCorrection = choices("ISCorrection", "none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
ISLevel = choices("ISLevel", "token", "sequence")
"""Where TRL's loss takes the PPO ratio (``GRPOConfig.importance_sampling_level``): per token, or per sequence
(GSPO)."""
LoggerMode = choices("LoggerMode", "auto", "online", "offline")
SandboxBackend = choices("SandboxBackend", "bwrap", "rlimit")
EvalKB = choices("EvalKB", "separate", "train")


@dataclass
class EnvConfig:
    """An environment: where tasks come from and how actions are scored."""

    name: str = MISSING  # the registered environment (set by the option)
    eval_size: int = bounded(200, ge=1)  # held-out tasks per evaluation; their seeds never overlap training seeds
    actions_per_episode: int = bounded(1, ge=1)  # actions on the real state per episode (yamls: max_turns)


@dataclass
class PlanPathConfig(EnvConfig):
    """Grid path planning (AT-GRPO paper: 10×10 grid, 22% blocked)."""

    name: str = "plan_path"
    size: int = bounded(10, ge=2)  # side of the square grid
    block_prob: float = bounded(0.22, ge=0.0, le=0.9)  # share of blocked cells (start and goal stay connected)
    max_moves: int = bounded(0, ge=0)  # longest move list scored; 0 means 2 * size * size
    step_reward: float = bounded(-0.01, le=0.0)  # per move made; > 0 would pay for padding a plan
    invalid_reward: float = bounded(-0.1, le=0.0)  # a move into a wall or off the grid (the agent stays)
    goal_reward: float = 1.0  # the moves reach the goal
    optimal_bonus: float = bounded(0.5, ge=0.0)  # added to goal_reward for a shortest path; < 0 would pay for padding
    failure_reward: float = -1.0  # the moves end elsewhere than the goal
    format_penalty: float = -2.0  # an answer with no parsable move list
    stop_at_goal: bool = True  # True (paper): moves after reaching the goal are ignored; False: the plan must end there
    shaping: bool = True  # + d(s) − d(s') per move (d: BFS distance to the goal); telescopes: padding earns nothing


@dataclass
class SudokuConfig(EnvConfig):
    """Sudoku with a unique solution (AT-GRPO paper: 4×4)."""

    name: str = "sudoku"
    size: int = 4  # 4 or 9 (boxes are sqrt(size) on a side)
    holes: int = bounded(6, ge=1)  # blanks per puzzle (unique solution); at most 12 (4×4), 54 (9×9)
    solved_reward: float = 2.0  # the grid equals the solution (ends the episode)
    invalid_reward: float = -0.5  # the grid breaks a row/column/box rule, or the action changes a given
    step_reward: float = 0.0  # any other well-formed action
    format_penalty: float = -1.0  # an answer that is neither a grid nor a placement list


@dataclass
class SokobanConfig(EnvConfig):
    """Sokoban: push every box onto a goal (AT-GRPO paper: 6×6, up to 200 steps)."""

    name: str = "sokoban"
    size: int = 6  # side of the map, border walls included
    boxes: int = 1  # boxes (and goals) per map: 1 or 2
    walls: int = 2  # random interior wall cells; at most a quarter of the interior
    max_moves: int = bounded(200, ge=1)  # moves scored per episode; using the last one ends the episode
    step_reward: float = bounded(-0.01, le=0.0)  # each move that is carried out; > 0 would pay for padding
    invalid_reward: float = bounded(-0.05, le=0.0)  # a move into a wall, or a push into a wall or box (player stays)
    box_on_goal_reward: float = bounded(1.0, ge=0.0)  # a box pushed onto a goal
    box_off_goal_reward: float = bounded(-1.0, le=0.0)  # a box off a goal; at most −box_on_goal_reward: no cycle earns
    win_reward: float = 10.0  # every box on a goal (ends the episode; later moves are ignored)
    failure_reward: float = -5.0  # the episode's last action or move leaves the puzzle unsolved
    format_penalty: float = -6.0  # an answer with no parsable move list (below the failure reward)


@dataclass
class MathSourceConfig:
    """Where one split of the math env takes its (question, answer) pairs."""

    source: str = "embedded"  # embedded | a preset (polaris, dapo, aime24, aime25, olympiadbench) | hub id | local file
    subset: str = ""  # hub dataset config (a preset sets its own); empty: the dataset's default
    split: str = ""  # hub split (a preset sets its own); empty: train; local files always read as train
    question_field: str = ""  # column or dotted path (prompt.0.content); empty: the preset's, else problem/question
    answer_field: str = ""  # column or dotted path; empty: the preset's, else answer/final_answer
    limit: int = bounded(0, ge=0)  # keep the first N usable rows; 0: all


@dataclass
class MathConfig(EnvConfig):
    """Math questions checked with Math-Verify (AT-GRPO paper: Polaris/DAPO train, AIME/OlympiadBench eval)."""

    name: str = "math"
    train: MathSourceConfig = field(default_factory=MathSourceConfig)  # training and warm-start tasks
    eval: MathSourceConfig = field(default_factory=MathSourceConfig)  # held-out tasks (embedded: disjoint questions)
    max_operand: int = 20  # embedded problems: largest number drawn (difficulty)
    kinds: list[str] = field(default_factory=lambda: ["arithmetic", "word", "linear"])  # also add_sub
    # a proposer's question (workflow=propose_solve*): any integer expression, or only the shapes env.kinds generate
    proposals: Proposals = Proposals.any
    correct_reward: float = 1.0  # the answer equals the gold answer (ends the episode)
    wrong_reward: float = 0.0  # a readable answer that is wrong
    format_penalty: float = -1.0  # no answer, or one Math-Verify cannot read (below a wrong answer)


@dataclass
class CodeSourceConfig:
    """Where one split of the code env takes its problems (stdin→stdout programs, or functions checked by asserts)."""

    source: str = "embedded"  # embedded | apps | code_contests | livecodebench | humaneval | mbpp
    path: str = ""  # hub id, hf:// file or glob, local file or dir; empty: the preset's source for this split
    split: str = ""  # hub split (embedded: the `split` column); empty: the preset's for this split
    question_field: str = ""  # column holding the statement; empty: the preset's
    solutions_field: str = ""  # column holding reference solutions (golden = first Python one); empty: the preset's
    tests_field: str = ""  # column(s) holding tests, comma-separated; empty: the preset's
    limit: int = 500  # keep the first N usable problems; 0: all


@dataclass
class CodeConfig(EnvConfig):
    """Write a stdin→stdout Python program, scored on ground-truth tests in the sandbox (AT-GRPO code family)."""

    name: str = "code"
    train: CodeSourceConfig = field(default_factory=CodeSourceConfig)  # training and warm-start problems
    eval: CodeSourceConfig = field(default_factory=CodeSourceConfig)  # held-out problems (embedded: disjoint set)
    max_tests: int = bounded(10, ge=1)  # ground-truth (and generated) tests run per program, the first N
    format_penalty: float = -1.0  # no code in the answer (below the 0 of code that passes no test)


@dataclass
class WebSearchConfig:
    """A web-search backend for the research env's online sources (never needed by the embedded KB)."""

    url: str = ""  # endpoint: GET <url>?q=<query>&count=<top_k> answering JSON results with title, url, snippet
    api_key: str = ""  # sent in `header`; e.g. api_key='${oc.env:MARL_SEARCH_KEY}'
    header: str = "Authorization"  # the header carrying the key (value "Bearer <key>" for Authorization)
    top_k: int = 3  # results shown per search
    timeout_s: float = 20.0  # per HTTP request
    max_page_chars: int = 2000  # text kept from an opened page


@dataclass
class ResearchSourceConfig:
    """Where one split of the research env takes its questions."""

    source: str = "embedded"  # embedded (generated KB) | gaia | xbench | webwalkerqa | a hub id | a local file
    path: str = ""  # hub id or local .json/.jsonl/.parquet/.csv; empty: the preset's
    split: str = ""  # hub split; empty: the preset's
    question_field: str = ""  # column holding the question; empty: the preset's
    answer_field: str = ""  # column holding the exact answer; empty: the preset's
    limit: int = 500  # keep the first N usable questions; 0: all


@dataclass
class ResearchConfig(EnvConfig):
    """Multi-hop deep research over a knowledge base with search/open tools (M-GRPO paper setting)."""

    name: str = "research"
    train: ResearchSourceConfig = field(default_factory=ResearchSourceConfig)  # training and warm-start questions
    eval: ResearchSourceConfig = field(default_factory=ResearchSourceConfig)  # held-out questions
    kb_seed: int = 0  # embedded: the train KB is generated from kb_seed, the eval KB from kb_seed + 1
    eval_kb: EvalKB = EvalKB.separate  # embedded eval questions: separate (own KB) | train (the train KB)
    people: int = 40  # embedded KB size: entities of each kind
    organisations: int = 12  # embedded KB size: organisations
    cities: int = 12  # embedded KB size: cities
    countries: int = 5  # embedded KB size: countries
    min_hops: int = 2  # embedded questions chain 2..3 relations
    max_hops: int = 3  # embedded questions chain at most this many relations
    search_top_k: int = 3  # documents listed per search
    max_doc_chars: int = 400  # text shown when a document is opened
    web: WebSearchConfig = field(default_factory=WebSearchConfig)  # search backend for online sources


@dataclass
class WorkflowConfig:
    """Agents (roles), their prompts, and the turn order."""

    name: str = MISSING  # the registered workflow (set by the option)
    roles: list[str] = field(default_factory=lambda: ["agent"])  # the agents, in turn order
    max_turns: int = bounded(1, ge=1)  # turns per episode (each role acts at most once per turn)
    answer_marker: str = "####"  # the answer is the text after the last marker; "": the whole reply
    # template; fields {rules}, {observation}, {marker}, {<role>} (its latest output)
    prompt: str = "{rules}\n{observation}\nAnswer after {marker}.\n"
    prompts: dict[str, str] = field(default_factory=dict)  # role → template; roles not named use `prompt`
    alpha: float = 1.0  # agent reward = alpha * team reward (env score of the new state) + own reward


@dataclass
class CodeTestConfig(WorkflowConfig):
    """The AT-GRPO coder∥tester workflow (``workflow=code_test``)."""

    tester_agreement_weight: float = 1.0  # w in tester local = p_golden + w * agreement; 0 gives the paper's reward


@dataclass
class ResearchWorkflowConfig(WorkflowConfig):
    """Deep research: a main agent calling a tool-using sub-agent (``deep_research``) or one agent (``solo``).

    Rewards are M-GRPO's, per trajectory: main R = main_format·format + main_correct·correct when the
    main agent's format is valid, else 0; sub R = sub_format·format + sub_main_correct·correct_main +
    sub_expert·expert when the sub-agent's format is valid, else 0.
    """

    max_calls: int = bounded(4, ge=1)  # deep_research: sub-agent calls per episode; solo: tool calls per episode
    sub_turns: int = bounded(4, ge=1)  # deep_research: sub-agent actions per call (its last must be the result)
    main_format: float = 0.1  # α1
    main_correct: float = 0.9  # α2
    sub_format: float = 0.1  # β1
    sub_main_correct: float = 0.4  # β2
    sub_expert: float = 0.5  # β3


@dataclass
class AlgorithmConfig:
    """What every algorithm reads: how its rollouts are played and how many make a group. Each algorithm adds its own
    settings in a schema registered beside its estimator (``algorithms/<name>.py``), so a key only another algorithm
    reads is refused when the config composes."""

    name: str = MISSING  # the registered algorithm (set by the option; `marl train --help algorithm` lists them)
    mode: RolloutMode = RolloutMode.independent  # independent: K episodes per task; tree: K candidates per agent, turn
    num_generations: int = bounded(8, ge=1)  # K samples per group


@dataclass
class CreditConfig:
    """Credit beyond a row's group-relative advantage: none, or a registered method (credit=hicra, credit=igpo)
    that reshapes the turn rewards before the advantages or the advantages, token by token, after them."""

    name: str = MISSING  # the registered method: none | hicra | igpo (set by the option)


@dataclass
class RewardConfig:
    """Rewards from a model instead of (or beside) the env's program: none, or a registered reward model
    (reward=judge, reward=http) that scores the rows of ``roles``. A judged row's reward becomes
    ``weight · score + program_weight · (its program reward)``, the score in [0, 1]."""

    name: str = MISSING  # the registered reward model: none | judge | http (set by the option)
    roles: list[str] = field(default_factory=list)  # the workflow's roles the model scores; the others keep theirs
    weight: float = 1.0  # the model's score's weight in a judged row's reward
    program_weight: float = 0.0  # the env's (program's) reward's weight beside it; 0: the model's alone
    invalid: float = 0.0  # the score of a row the model could not score (unparsable, out of range, a failed call)
    max_calls: int = bounded(0, ge=0)  # distinct (prompt, answer) pairs scored per step; beyond: `invalid`; 0: all
    cache_size: int = bounded(100000, ge=0)  # (role, prompt, answer) scores kept across steps; 0: no cache
    agreement_threshold: float = 0.5  # a score at or above it counts as "correct" in judge/agreement


@dataclass
class LossConfig:
    """A term added to TRL's policy loss: none, or a registered one (loss=epo) with its settings; a policy changes
    them with ``policy.trainers.<policy>.loss.<key>``."""

    name: str = MISSING  # the registered loss term: none | epo (set by the option)


@dataclass
class CriticConfig:
    """A learned value model that the value-based algorithms (ppo, marft, archer) read: none (critic-free), token
    (V(s_t) at every completion token: PPO) or utterance (V of the state a turn starts in, and ArCHer's Q of the
    turn's utterance in it). It trains on its own optimiser after the policies' update; every process holds it."""

    name: str = MISSING  # the registered kind: none | token | utterance (set by the option)
    scope: CriticScope = CriticScope.policy  # one critic per policy (over its roles' rows), or one for the team
    # what the critic's model changes from its policy's model (name_or_path, tiny.*, dtype: as policy.models);
    # empty: a copy of the policy's model as RL found it (after the warm start), a new value head on its trunk;
    # scope=team: of the first policy's
    model: dict[str, Any] = field(default_factory=dict)
    # the value head on its policy's own model instead of a copy: the critic's regression also trains the policy's
    # trunk (with the critic's own optimiser, after the policy's step); full-model policies, scope=policy
    share_trunk: bool = False
    learning_rate: float = bounded(1e-5, gt=0.0)  # the critic's AdamW learning rate
    weight_decay: float = bounded(0.0, ge=0.0)  # the critic's AdamW weight decay
    max_grad_norm: float = bounded(1.0, ge=0.0)  # 0: no clipping
    mini_batch_size: int = bounded(64, ge=1)  # rows per critic gradient step
    epochs: int = bounded(1, ge=1)  # passes over each step's rows (ppo, marft)
    value_clip: float | None = bounded(0.5, gt=0.0)  # PPO's value clipping around the old values; null: none
    warmup_steps: int = bounded(0, ge=0)  # the first N steps train the critic only (the policies wait)
    tau: float = bounded(0.1, gt=0.0, le=1.0)  # archer: target networks' Polyak weight of the online critic
    replay_capacity: int = bounded(10000, ge=1)  # archer: rows the replay buffer keeps (oldest dropped first)
    replay_batch_size: int = bounded(64, ge=1)  # archer: rows per critic update drawn from the buffer
    updates_per_step: int = bounded(1, ge=1)  # archer: critic updates (and target updates) per RL step


@dataclass
class PolicyConfig:
    """The policy regime: which model acts for which role."""

    name: str = MISSING  # the registered regime: shared | per_role | lora_per_role (set by the option)
    assignment: dict[str, str] = field(default_factory=dict)  # role → policy name; unnamed roles use the regime's
    lora_r: int = bounded(16, ge=1)  # lora_per_role: adapter rank
    lora_alpha: int = bounded(32, ge=1)  # lora_per_role: adapter scaling alpha
    lora_dropout: float = bounded(0.0, ge=0.0, le=0.99)  # lora_per_role: adapter dropout
    lora_target_modules: str = "all-linear"  # peft target modules: all-linear, or comma-separated module names
    devices: list[str] = field(default_factory=list)  # full-model policies on these devices, in turn (cuda:0,cuda:1)
    # policy name -> what its model changes from `model` (name_or_path, tiny.*, dtype): a team of different models
    models: dict[str, Any] = field(default_factory=dict)
    # policy name -> what its update changes from `trainer` (learning_rate, loss_type, ...: config.team.TRAINER_KEYS)
    trainers: dict[str, Any] = field(default_factory=dict)
    frozen: list[str] = field(default_factory=list)  # policies that act but never update (weights, optimiser state)
    # role -> a registered scripted actor that acts for it instead of a model (oracle, empty: policies.scripted.ACTORS)
    scripted: dict[str, str] = field(default_factory=dict)


@dataclass
class RoleSampling:
    """What one role's sampling changes (``rollout.roles.<role>``, ``eval.roles.<role>``); null keys keep the
    group's."""

    temperature: float | None = bounded(None, ge=0.0)  # eval: 0 is greedy; training needs > 0
    top_p: float | None = bounded(None, gt=0.0, le=1.0)
    top_k: int | None = bounded(None, ge=0)
    min_p: float | None = bounded(None, ge=0.0, le=1.0)
    max_new_tokens: int | None = bounded(None, ge=1)
    stop: list[str] | None = None  # the completion ends after the first of these strings (kept in it)
    chat_template_kwargs: dict[str, Any] | None = None  # merged over model.chat_template_kwargs


@dataclass
class TinyModelConfig:
    """A small Qwen3-style causal LM built locally (no download)."""

    hidden_size: int = bounded(128, ge=1)  # width of the residual stream
    intermediate_size: int = bounded(384, ge=1)  # width of the MLP
    num_hidden_layers: int = bounded(4, ge=1)  # decoder layers
    num_attention_heads: int = bounded(4, ge=1)  # query heads
    num_key_value_heads: int = bounded(2, ge=1)  # key/value heads (grouped-query attention)
    head_dim: int = bounded(32, ge=1)  # width of one attention head
    max_position_embeddings: int = bounded(1024, ge=1)  # longest sequence (prompt + completion) in tokens


@dataclass
class ModelConfig:
    """The model every policy starts from."""

    name_or_path: str | None = None  # a local dir or hub id; None builds the tiny model
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    dtype: DType = DType.float32  # compute dtype; a trained policy keeps fp32 master weights under bf16/fp16
    use_chat_template: bool = True  # wrap prompts as a user turn when the tokenizer has a chat template
    system_prompts: dict[str, str] = field(default_factory=dict)  # role -> system message (chat template only)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. {enable_thinking: false} (Qwen3)


@dataclass
class HFGenerationConfig:
    """``rollout=hf``: how transformers' ``generate`` decodes."""

    # dynamic: a group's prompt prefilled once, decoding into a cache that grows in place (the CPU's fastest);
    # static: transformers' fixed-size cache, whose decoding step it compiles on CUDA (CUDA graphs)
    cache: KVCache = KVCache.dynamic
    width_multiple: int = bounded(64, ge=1)  # static: prompts left-padded to a multiple of this: fewer shapes compile


@dataclass
class VLLMConfig:
    """``rollout=vllm``: the engines colocated with the learner, one per full-model policy."""

    gpu_memory_utilization: float = bounded(0.3, gt=0.0, le=1.0)  # share of GPU memory each engine may take
    tensor_parallel_size: int = bounded(1, ge=1)  # GPUs per engine (one process only; 1 under a launcher)
    enable_sleep_mode: bool = False  # GPU: engines free their memory while the policies train
    enforce_eager: bool = True  # no CUDA graph capture: a faster start, slower decoding on GPU
    enable_prefix_caching: bool = True  # reuse the KV cache of shared prompt prefixes (the K rollouts of a task)
    max_model_len: int | None = None  # default: rollout.max_prompt_length + rollout.max_new_tokens
    cpu_kv_cache_gib: int = bounded(1, ge=1)  # CPU builds: KV cache size (VLLM_CPU_KVCACHE_SPACE) unless set


@dataclass
class RolloutConfig:
    """Generation settings for training and evaluation rollouts."""

    backend: str = "hf"  # the registered generation backend: hf | vllm (set by the option)
    tasks_per_step: int = bounded(16, ge=1)  # tasks (prompts) per RL step; each gets K samples
    temperature: float = bounded(1.0, gt=0.0)  # also the temperature of the loss's log-probabilities
    top_p: float = bounded(1.0, gt=0.0, le=1.0)  # nucleus sampling; 1: off
    top_k: int = bounded(0, ge=0)  # 0: off
    min_p: float = bounded(0.0, ge=0.0, le=1.0)  # drop tokens below min_p x the top token's probability; 0: off
    max_new_tokens: int = bounded(64, ge=1)  # completion tokens per agent turn
    stop: list[str] = field(default_factory=list)  # a completion ends after the first of these strings (kept in it)
    # role -> what its training rollouts change (temperature, top_p, top_k, min_p, max_new_tokens, stop,
    # chat_template_kwargs: schema.RoleSampling); the learner scores each row at its role's temperature
    roles: dict[str, Any] = field(default_factory=dict)
    max_prompt_length: int = bounded(1024, ge=1)  # longer prompts keep their end (left truncation)
    batch_size: int = bounded(256, ge=1)  # largest batch handed to one generate call
    hf: HFGenerationConfig = field(default_factory=HFGenerationConfig)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)


@dataclass
class WarmStartConfig:
    """Supervised warm start on oracle demonstrations through TRL's SFTTrainer."""

    enabled: bool = False  # supervised warm start on the env's oracle demonstrations before RL
    num_examples: int = bounded(2000, ge=1)  # demonstrations per role (2 roles: twice as many)
    epochs: float = bounded(1.0, gt=0.0)  # passes over the demonstrations
    learning_rate: float = bounded(1e-3, gt=0.0)  # SFT learning rate
    batch_size: int = bounded(32, ge=1)  # demonstrations per SFT step (split across processes under a launcher)
    lr_scheduler_type: SchedulerType = SchedulerType.cosine  # SFT learning-rate schedule
    warmup_ratio: float = bounded(0.05, ge=0.0, le=1.0)  # share of SFT steps spent warming up
    shared_base: bool = True  # several full-model policies: warm-start one model on every role's demos, copy it
    cache: str | None = None  # a dir: identical warm starts (same model, settings, seed, demonstrations) run once
    # the warm start's own seed (tiny model init, demonstration tasks, SFT order); null: the run seed. Pinned,
    # a seed sweep starts every run from one warm-started model (as the papers' seeds share one pre-trained
    # model) and the seeds vary the RL only
    seed: int | None = None


@dataclass
class TrainerConfig:
    """The RL update (passed through to TRL's GRPO loss and optimiser) and the step schedule."""

    steps: int = bounded(50, ge=0)  # RL steps; 0: warm start (and evals) only
    learning_rate: float = bounded(1e-5, gt=0.0, per_policy=True, trl="update")  # RL learning rate (AdamW)
    # RL learning-rate schedule over `steps`
    lr_scheduler_type: SchedulerType = field(default=SchedulerType.constant,
                                             metadata=reads(per_policy=True, trl="update"))
    warmup_steps: int = bounded(0, ge=0, per_policy=True, trl="update")  # optimiser steps of linear warm-up
    weight_decay: float = bounded(0.0, ge=0.0, per_policy=True, trl="update")  # AdamW weight decay
    max_grad_norm: float = bounded(1.0, ge=0.0, per_policy=True, trl="update")  # 0: no clipping
    # TRL's loss formulation (GRPOConfig.loss_type)
    loss_type: LossType = field(default=LossType.grpo, metadata=reads(per_policy=True, trl="update"))
    # PPO clip range below (and above, unless epsilon_high)
    epsilon: float = bounded(0.2, ge=0.0, per_policy=True, trl="update")
    # PPO clip range above; null: epsilon
    epsilon_high: float | None = bounded(None, ge=0.0, per_policy=True, trl="update")
    # KL penalty against the reference (the policy at RL start); 0: none
    beta: float = bounded(0.0, ge=0.0, per_policy=True)
    # the PPO ratio per token, or per sequence (GSPO: exp of the mean token log-ratio; with loss_type grpo or luspo)
    importance_sampling_level: ISLevel = field(default=ISLevel.token, metadata=reads(per_policy=True, trl="loss"))
    # two-sided clip (INTELLECT-2): ratios capped at delta; null: off
    delta: float | None = bounded(None, gt=1.0, per_policy=True, trl="loss")
    # entropy bonus: loss − entropy_coef × mean token entropy; 0: none
    entropy_coef: float = bounded(0.0, ge=0.0, per_policy=True, trl="loss")
    # Skywork-OR1's adaptive entropy bonus: entropy_coef starts there, moves by entropy_coef_delta each optimiser step
    # (up while the entropy is at or below entropy_target, else down) within [entropy_coef_min, entropy_coef_max], and
    # applies only while the entropy is at or below the target
    use_adaptive_entropy: bool = field(default=False, metadata=reads(per_policy=True, trl="loss"))
    # use_adaptive_entropy: target mean token entropy (nats)
    entropy_target: float = bounded(0.2, ge=0.0, per_policy=True, trl="loss")
    # use_adaptive_entropy: the coefficient's step
    entropy_coef_delta: float = bounded(0.005, gt=0.0, per_policy=True, trl="loss")
    # use_adaptive_entropy: the coefficient's lower bound
    entropy_coef_min: float = bounded(0.0, ge=0.0, per_policy=True, trl="loss")
    # use_adaptive_entropy: the coefficient's upper bound
    entropy_coef_max: float = bounded(1.0, ge=0.0, per_policy=True, trl="loss")
    # only the top-ρ of tokens by entropy get a gradient
    top_entropy_quantile: float = bounded(1.0, ge=0.0, le=1.0, per_policy=True, trl="loss")
    # completions that never ended (cut at max_new_tokens) get no gradient
    mask_truncated_completions: bool = field(default=False, metadata=reads(per_policy=True, trl="loss"))
    # drop negative-advantage rows whose mean KL(sampler ‖ learner) per token exceeds this (DeepSeek-V3.2); null: off
    off_policy_mask_threshold: float | None = bounded(None, ge=0.0, per_policy=True, trl="loss")
    # sampler-vs-learner correction (TRL's vLLM importance sampling): weight each token's loss by
    # exp(learner − sampler log-prob) per token or summed per sequence, truncated to [min, max] or zeroed outside
    is_correction: ISCorrection = ISCorrection.none
    is_clip_max: float = bounded(3.0, gt=0.0)  # is_correction: upper limit of the importance ratio
    is_clip_min: float | None = bounded(None, ge=0.0)  # is_correction: lower limit of the importance ratio; null: none
    # optimisation passes over each step's samples
    num_iterations: int = bounded(1, ge=1, per_policy=True, trl="update")
    mini_batch_size: int = bounded(64, ge=1, per_policy=True)  # rows per gradient step
    # rows with advantage 0 are not back-propagated when beta=0 (their gradient is 0; the loss is re-weighted
    # to the whole mini-batch's): the same update for less compute
    skip_zero_advantage: bool = True
    # recompute activations in the backward pass (less memory, more compute)
    gradient_checkpointing: bool = field(default=False, metadata=reads(per_policy=True))
    # the same seed, config and machine give a bit-identical run: fixed threads, deterministic algorithms, MKL's
    # conditional numerical reproducibility (set before torch loads: give it on the command line); slower
    deterministic: bool = False
    # under a launcher: none (every process holds the whole learner, gradients averaged) | fsdp2 (the learner's
    # weights, gradients and optimiser state split across the processes; the policy's model stays whole)
    sharding: Sharding = Sharding.none
    log_ref_kl: bool = False  # also with beta=0: keep a frozen reference (the policy at RL start) and log kl_ref
    log_completions_every: int = bounded(10, ge=0)  # samples.jsonl completions every N steps; 0: never
    eval_every: int = bounded(0, ge=0)  # 0: evaluate only before and after training
    save_every: int = bounded(0, ge=0)  # 0: checkpoint only at the end
    # checkpoints kept: after each save the oldest beyond this many are deleted (never the one just saved);
    # null: keep all
    save_total_limit: int | None = bounded(None, ge=1)
    log_every: int = bounded(1, ge=1)  # write metrics every N steps
    resume: str | None = None  # a run dir to continue from its last checkpoint
    init_from: str | None = None  # a checkpoint dir (<run>/checkpoints/step_N) whose policies this run starts from
    frozen_roles: list[str] = field(default_factory=list)  # roles that act but are never updated (a frozen sub-agent)
    # train the policies in turn, N steps each (MARFT's agent-by-agent training): the others act but stay as they
    # are, weights and optimiser state; 0: every policy trains every step
    alternate_every: int = bounded(0, ge=0)
    alternate_order: list[str] = field(default_factory=list)  # the policies in turn; empty: as the roles name them
    # every N steps the roles move one policy along (two policies swap roles: CORY's pioneer and observer); 0: never
    swap_roles_every: int = bounded(0, ge=0)
    role: TrainerRole = TrainerRole.all  # all: one process; main | sub: decoupled M-GRPO trainers
    # rows may be sampled from weights up to k updates old: 0 rolls out, then updates (synchronous); k > 0 plays
    # step s on a rollout worker process from the weights after update max(0, s-1-k) while the learner trains
    # (decoupled M-GRPO: main rolls out step s with the sub policy's weights of step s-1-k or newer)
    max_staleness: int = bounded(0, ge=0)
    # max_staleness > 0: a rollout worker silent this long (no generate call, no wait it reports from) is stuck:
    # the run stops with one line
    heartbeat_timeout_s: float = bounded(300.0, gt=0.0)
    # max_staleness > 0: the longest the rollout worker waits for the weights a step needs before it gives up
    weight_sync_timeout_s: float = bounded(1800.0, gt=0.0)
    warmstart: WarmStartConfig = field(default_factory=WarmStartConfig)


@dataclass
class LoggerConfig:
    """Where metrics go besides metrics.jsonl."""

    name: str = MISSING  # wandb | none (set by the option)
    project: str = "marl"  # W&B project
    entity: str | None = None  # W&B entity (user or team); null: your default
    mode: LoggerMode = LoggerMode.auto  # auto: online when credentials exist, else offline; or online | offline
    tags: list[str] = field(default_factory=list)  # the experiment's name is added
    run_name: str | None = None  # default: <name>/<job dir> (a sweep job: its overrides and seed)
    group: str | None = None  # default: <name>/<overrides dir> (a sweep's seed repeats share one group)


@dataclass
class SandboxConfig:
    """Isolation and limits for model-written code (tool agents, generated tests)."""

    backend: SandboxBackend = SandboxBackend.bwrap  # bwrap: bubblewrap + limits; rlimit: limits only (weaker)
    timeout_s: float = bounded(10.0, gt=0.0)  # wall-clock limit per run
    cpu_seconds: int = bounded(5, ge=1)  # CPU-time limit per run
    memory_mb: int = bounded(1024, ge=1)  # address-space limit
    max_processes: int = bounded(32, ge=1)  # processes per run (its own uid when marl runs as root)
    file_size_mb: int = bounded(16, ge=1)  # largest file a run may write
    workdir_mb: int = bounded(64, ge=1)  # bwrap: the work dir is a tmpfs of this size (all its files together)
    python: str = ""  # interpreter inside the sandbox; empty: the one running marl
    # run each distinct (program, stdin) of a batch once and give its result to every copy (a group's K samples
    # often write the same program); only for deterministic programs: copies share one draw of any randomness
    share_identical: bool = False


@dataclass
class StoreConfig:
    """The shared store through which decoupled M-GRPO trainers exchange sub-trajectories and weights."""

    name: str = MISSING  # sqlite | redis
    namespace: str = "${name}"  # keys live under this prefix; both trainers of one run must agree on it
    path: str = "outputs/store.sqlite"  # sqlite: the database file (both processes must reach it)
    host: str = "localhost"  # redis
    port: int = bounded(6379, ge=1, le=65535)  # redis
    password: str = ""  # redis; pass it as '${oc.env:REDIS_PASSWORD}' to keep it out of .hydra/
    db: int = 0  # redis database number
    poll_s: float = bounded(0.5, gt=0.0)  # how often a waiting trainer looks again
    timeout_s: float = bounded(1800.0, gt=0.0)  # how long a trainer waits for the other before failing


@dataclass
class ReportConfig:
    """Where ``marl report`` files this run: its table, row and column, and the paper's number for that cell."""

    table: str | None = None  # the table the cell belongs to (a paper's table, or a toy table); None: "runs"
    method: str | None = None  # row label; None: derived from workflow, algorithm and policy regime
    benchmark: str | None = None  # column label; None: the env name
    paper: float | None = None  # the paper's number for this cell (accuracy %), shown beside ours with the difference
    source: str | None = None  # where the paper's number is from
    before_method: str | None = None  # also file the run's starting point (eval_before) as this row


@dataclass
class EvalConfig:
    """How the held-out tasks (the env's eval split, ``env.eval_size`` of them) are played: by the evaluations of
    a training run (before and after it, and every ``trainer.eval_every`` steps) and by ``marl eval``."""

    samples: int = bounded(1, ge=1)  # episodes per task (n); pass@k needs n >= k
    temperature: float = bounded(0.0, ge=0.0)  # 0: greedy (then samples must be 1)
    pass_k: list[int] = field(default_factory=lambda: [1])  # k values reported as eval/pass@k (unbiased estimator)
    # role -> what its evaluation sampling changes (schema.RoleSampling keys): a role samples in evaluation as in
    # training (rollout.*, rollout.roles.<role>) but at eval.temperature, then with these
    roles: dict[str, Any] = field(default_factory=dict)
    # games (marl eval): a round-robin between these players (run or checkpoint dirs, bot:<name>), each pair in both
    # seatings on env.eval_size deals; each player's Bradley–Terry rating (training/league.py)
    league: list[str] = field(default_factory=list)


PoolSample = choices("PoolSample", "uniform", "recency")


@dataclass
class PoolConfig:
    """An opponent pool (``training/pool.py``): the learner's snapshots, one of which plays the opponent's seat."""

    every: int = bounded(0, ge=0)  # snapshot the learner's policy every N steps (0: no pool)
    size: int = bounded(8, ge=1)  # snapshots kept; the oldest goes first
    sample: PoolSample = PoolSample.uniform  # the opponent of each step: any snapshot alike, or the newer the likelier
    learner: str = "player_0"  # the role whose policy is snapshotted (it trains)
    opponent: str = "player_1"  # the role whose policy plays a snapshot (frozen: trainer.frozen_roles)


@dataclass
class TrainSchema:
    """The root of ``conf/train.yaml``."""

    env: Any = MISSING
    workflow: Any = MISSING
    algorithm: Any = MISSING
    credit: Any = MISSING
    critic: Any = MISSING
    loss: Any = MISSING
    reward: Any = MISSING
    policy: Any = MISSING
    model: Any = MISSING
    rollout: Any = MISSING
    trainer: Any = MISSING
    logger: Any = MISSING
    store: Any = MISSING
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    pool: PoolConfig = field(default_factory=PoolConfig)
    name: str = "default"  # the run's name: outputs/<name>/<date>_<time>/ (experiments set it)
    seed: int = 0  # seeds tasks, model init, sampling and mini-batch order
    device: str = "auto"  # auto (a GPU if there is one) | cpu | mps | cuda | cuda:<index>
    threads: int = bounded(0, ge=0)  # CPU threads torch uses in this job (intra-op); 0: torch's default (every core)
    progress: bool = True  # progress bars on the terminal


@dataclass
class EvalSchema(TrainSchema):
    """The root of ``conf/eval.yaml``: a training config (so every experiment composes) plus what to load."""

    load: str | None = None  # a run dir (its latest checkpoint) or a checkpoint dir; None: the model as configured


@dataclass
class ReportSchema:
    """The root of ``conf/report.yaml``: which runs ``marl report`` tabulates and what it writes."""

    runs: list[str] = field(default_factory=list)  # run dirs, sweep dirs (searched for run dirs) or globs of them
    metric: str = "success"  # the cell value: eval/<metric> at the end of each run, in percent
    plot: bool = False  # also write PNG training curves (reward and success per agent over steps)
    digits: int = bounded(1, ge=0)  # decimals shown in the Markdown table


GROUP_SCHEMAS: dict[str, type] = {"env": EnvConfig, "workflow": WorkflowConfig, "algorithm": AlgorithmConfig,
                                  "credit": CreditConfig, "critic": CriticConfig, "loss": LossConfig,
                                  "reward": RewardConfig, "policy": PolicyConfig,
                                  "model": ModelConfig, "rollout": RolloutConfig, "trainer": TrainerConfig,
                                  "logger": LoggerConfig, "store": StoreConfig}
"""Each group's generic schema (``<group>/base_<group>``); a registered plug-in adds ``<group>/base_<name>``."""


def job_dir(overrides: str, seed: int, max_chars: int = 120) -> str:
    """A multirun job's dir under the sweep dir: ``<its overrides but the seed>/seed=<seed>``.

    Slashes in values become ``_`` (one dir per job); a name over ``max_chars`` is cut and ends with a
    hash of the whole, so long override lists stay valid, distinct file names.
    """
    name = (overrides or "defaults").replace("/", "_")
    if len(name) > max_chars:
        name = f"{name[:max_chars - 9]}~{hashlib.sha1(name.encode()).hexdigest()[:8]}"
    return f"{name}/seed={seed}"


def required(what: str) -> None:
    """``${marl_required:<what>}``: a value a config group needs from the command line (e.g. ``model=hf``'s
    ``model.name_or_path``); reading it unset is an error naming what to give."""
    raise ValueError(f"must be given: {what}")


def register_configs() -> None:
    """Register the root schemas, each group's generic schema, every registered plug-in's schema
    (``<group>/base_<name>``, from every registry) and the resolvers.

    The plug-ins are those imported so far: call ``marl_cli.plugins.register_configs`` (which loads the
    built-in and the user's plug-ins first) rather than this.
    """
    OmegaConf.register_new_resolver("marl_job_dir", job_dir, replace=True)
    OmegaConf.register_new_resolver("marl_required", required, replace=True)
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainSchema)
    cs.store(name="eval_schema", node=EvalSchema)
    cs.store(name="report_schema", node=ReportSchema)
    for group, node in GROUP_SCHEMAS.items():
        cs.store(group=group, name=f"base_{group}", node=node)
    for registry in registries():
        for name, node in registry.schemas.items():
            if registry.group:
                cs.store(group=registry.group, name=f"base_{name}", node=node)
