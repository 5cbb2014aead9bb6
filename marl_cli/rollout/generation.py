"""Batched generation with ``transformers`` (the ``hf`` backend).

What comes back is exactly what was sampled: the prompt as the model saw it (a prompt longer than
``max_prompt_length`` keeps its end, as TRL does), and the completion token for token up to and
including the first end token (every end token the model's generation config names, plus the
tokenizer's EOS), or all ``max_new_tokens`` when none came. With each completion come the sampler's
log-probabilities of its tokens, taken from the logits after temperature, min-p, top-k and top-p, which is
what the learner's log-probabilities are checked against. A prompt that several rows share (a group's K
samples) is prefilled once (``rollout/prefix.py``), at the learner's positions, and decoding appends to a
key/value cache that grows in place (``rollout/growing_cache.py``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from marl_cli.core.padding import pad_rows
from marl_cli.policies.loading import format_prompt
from marl_cli.policies.regime import Policy
from marl_cli.rollout.growing_cache import grow_in_place
from marl_cli.rollout.prefix import cache_argument, shared_prompt_cache


@dataclass
class Sampling:
    """How to sample: temperature 0 means greedy decoding. ``roles`` holds what each role changes (its
    ``schema.RoleSampling`` keys); ``for_role`` gives the settings one role generates with."""

    temperature: float
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    max_prompt_length: int = 1024
    batch_size: int = 256
    cache: str = "dynamic"  # the hf backend's key/value cache: dynamic (a shared prompt prefilled once) or static
    width_multiple: int = 1  # static: prompts left-padded to a multiple of this many tokens
    use_chat_template: bool = True
    system_prompts: dict[str, str] = field(default_factory=dict)  # role -> system message
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    roles: dict[str, dict[str, Any]] = field(default_factory=dict)  # role -> its changes
    system_prompt: str | None = None  # of the role being generated for (``for_role``)

    def for_role(self, role: str) -> Sampling:
        """The settings ``role`` generates with: these, with its changes and its system message."""
        changes = dict(self.roles.get(role, {}))
        kwargs = {**self.chat_template_kwargs, **changes.pop("chat_template_kwargs", {})}
        if "stop" in changes:
            changes["stop"] = tuple(changes["stop"])
        return replace(self, **changes, chat_template_kwargs=kwargs, system_prompt=self.system_prompts.get(role),
                       roles={})

    def key(self, role: str) -> str:
        """Equal for roles that generate alike (one generate call may serve them together)."""
        return repr(self.for_role(role))

    def prompt(self, tokenizer: Any, text: str) -> str:
        """``text`` as the model sees it: the chat template (with the system message and template kwargs) when
        wanted and the tokenizer has one; what rollouts generate from and warm-start demonstrations train on."""
        return format_prompt(tokenizer, text, self.use_chat_template, self.system_prompt, self.chat_template_kwargs)


@dataclass
class Generation:
    """One completion as sampled: token ids (ending in an end token when the model stopped), text, log-probs.

    ``logprobs`` holds the sampler's log-probability of each completion token (empty when the
    backend returns none); ``prompt_truncated`` says the prompt lost its beginning to
    ``max_prompt_length``; ``finished`` says the completion ended with an end token.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    text: str
    logprobs: list[float] = field(default_factory=list)
    prompt_truncated: bool = False
    finished: bool = True


class _SampledLogprobs(LogitsProcessor):
    """Warps the logits as the sampler will (temperature, top-k, top-p) and records each sampled token's log-prob.

    HF calls processors before drawing a token, so the log-probs of step t are gathered at step
    t + 1 (when the drawn token is the last input id); ``finish`` gathers the last step's.
    """

    def __init__(self, warpers: list[LogitsProcessor]):
        self.warpers = warpers
        self.pending: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []

    def _gather(self, tokens: torch.Tensor) -> None:
        if self.pending is not None:
            self.steps.append(self.pending.gather(1, tokens.unsqueeze(1)).squeeze(1))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._gather(input_ids[:, -1])
        for warper in self.warpers:
            scores = warper(input_ids, scores)
        self.pending = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """Per-step log-probs, (batch, generated steps)."""
        self._gather(last_tokens)
        self.pending = None
        return torch.stack(self.steps, dim=1) if self.steps else torch.zeros(len(last_tokens), 0)


def end_token_ids(policy: Policy) -> list[int]:
    """Every token that ends a completion: the generation config's EOS ids and the tokenizer's EOS."""
    configured = getattr(policy.model.generation_config, "eos_token_id", None)
    ids = configured if isinstance(configured, list) else [configured]
    ids = [*ids, policy.tokenizer.eos_token_id]
    return list(dict.fromkeys(int(i) for i in ids if i is not None))


def encode_prompts(policy: Policy, prompts: list[str], sampling: Sampling) -> tuple[list[list[int]], list[bool]]:
    """Token ids of each prompt as the model sees it (chat template applied), cut on the left to the limit."""
    texts = [sampling.prompt(policy.tokenizer, p) for p in prompts]
    ids = policy.tokenizer(texts, add_special_tokens=False)["input_ids"]
    limit = sampling.max_prompt_length
    return [row[-limit:] for row in ids], [len(row) > limit for row in ids]


def stop_index(tokenizer: Any, tokens: list[int], stops: tuple[str, ...]) -> int | None:
    """The index of the token that completes the first of ``stops`` in the decoded ``tokens`` (None: no stop string
    in them); a binary search over prefixes, as a prefix that holds a stop string stays holding it."""
    def holds(n: int) -> bool:
        text = tokenizer.decode(tokens[:n], skip_special_tokens=True)
        return any(stop in text for stop in stops)

    if not stops or not holds(len(tokens)):
        return None
    low, high = 1, len(tokens)
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if holds(middle) else (middle + 1, high)
    return low - 1


def as_sampled(policy: Policy, prompt_ids: list[int], tokens: list[int], logprobs: list[float], truncated: bool,
               ends: list[int], stops: tuple[str, ...] = ()) -> Generation:
    """A backend's raw completion as marl keeps it: cut after its first end token or the token that completes a
    stop string (kept whole when neither came), its log-probs cut with it, decoded without special tokens."""
    end = next((j for j, t in enumerate(tokens) if t in ends), None)
    stop = stop_index(policy.tokenizer, tokens if end is None else tokens[:end + 1], stops)
    end = end if stop is None else stop
    completion = tokens if end is None else tokens[:end + 1]
    text = policy.tokenizer.decode(completion, skip_special_tokens=True)
    return Generation(prompt_ids, completion, text, logprobs[:len(completion)], truncated, end is not None)


@contextlib.contextmanager
def compute_precision(policy: Policy) -> Iterator[None]:
    """Run the forward passes in the policy's compute dtype (bf16 autocast over fp32 master weights)."""
    dtype = policy.compute_dtype
    if dtype == torch.float32:
        yield
        return
    with torch.autocast(policy.model.device.type, dtype=dtype):
        yield


class HFGenerator:
    """Generates for many prompts in as few ``model.generate`` calls as the batch size allows."""

    def __init__(self) -> None:
        self.calls = 0

    def start(self, policies: list[Policy]) -> None:
        """Nothing to start: generation runs on the learner's own model."""

    def release(self) -> None:
        """Nothing to free: generation runs on the learner's own model."""

    @torch.inference_mode()
    def generate(self, policy: Policy, prompts: list[str], sampling: Sampling) -> list[Generation]:
        tokenizer, model = policy.tokenizer, policy.model
        policy.activate()
        prompt_ids, truncated = encode_prompts(policy, prompts, sampling)
        ends = end_token_ids(policy)
        results: list[Generation] = []
        was_training = model.training
        model.eval()
        static = sampling.cache == "static"
        for start in range(0, len(prompt_ids), sampling.batch_size):
            chunk = prompt_ids[start:start + sampling.batch_size]
            width = math.ceil(max(map(len, chunk)) / sampling.width_multiple) * sampling.width_multiple if static else 0
            input_ids, attention_mask = (t.to(model.device) for t in pad_rows(chunk, tokenizer.pad_token_id,
                                                                               left=True, width=width))
            recorder = _SampledLogprobs(_warpers(sampling))
            # The warpers run inside the recorder, so generate's own sampling settings are all neutral.
            kwargs = {"do_sample": False} if sampling.temperature <= 0 else {
                "do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": None, "typical_p": 1.0}
            with compute_precision(policy):
                cache = {"cache_implementation": "static"} if static else _prompt_cache(
                    model, input_ids, attention_mask, sampling.max_new_tokens)
                stops = {"stop_strings": list(sampling.stop), "tokenizer": tokenizer} if sampling.stop else {}
                out = model.generate(input_ids=input_ids, attention_mask=attention_mask,
                                     max_new_tokens=sampling.max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                                     eos_token_id=ends, logits_processor=LogitsProcessorList([recorder]),
                                     **cache, **kwargs, **stops)
            self.calls += 1
            generated = out[:, input_ids.shape[1]:]
            logprobs = recorder.finish(generated[:, -1]) if generated.shape[1] else None
            for i, row in enumerate(chunk):
                lps = logprobs[i].tolist() if logprobs is not None else []
                results.append(as_sampled(policy, row, generated[i].tolist(), lps, truncated[start + i], ends,
                                          sampling.stop))
        model.train(was_training)
        return results


def _prompt_cache(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  max_new_tokens: int) -> dict[str, Any]:
    """``generate``'s cache arguments with each distinct prompt of ``input_ids`` prefilled once, decoding into a cache
    that grows in place (none where the model's generation config names a cache of its own, ``takes_cache``)."""
    cache = (shared_prompt_cache(model, input_ids, attention_mask, always=True) if takes_cache(model) else None) or {}
    if cache:  # the cache holds the prompts at the learner's positions (0.., pads included), not generate's
        # padding-aware ones: the new tokens must continue from the same positions
        grow_in_place(cache[cache_argument(model)], input_ids.size(1) + max_new_tokens)
        cache["position_ids"] = torch.arange(input_ids.size(1), device=model.device).expand_as(input_ids)
    return cache


def takes_cache(model: Any) -> bool:
    """Whether ``generate`` decodes into a cache made outside it (a prompt run once, growing in place): not when
    the model's generation config names a cache of its own (static, offloaded, quantized: transformers refuses
    both; ``hybrid``, a hub default it drops, is fine)."""
    return getattr(model.generation_config, "cache_implementation", None) in (None, "dynamic", "hybrid")


def _warpers(sampling: Sampling) -> list[LogitsProcessor]:
    if sampling.temperature <= 0:
        return []
    warpers: list[LogitsProcessor] = [TemperatureLogitsWarper(sampling.temperature)]
    if sampling.min_p > 0.0:  # before top-k and top-p, as vLLM applies it: both backends keep the same tokens
        warpers.append(MinPLogitsWarper(sampling.min_p))
    if sampling.top_k:
        warpers.append(TopKLogitsWarper(sampling.top_k))
    if sampling.top_p < 1.0:
        warpers.append(TopPLogitsWarper(sampling.top_p))
    return warpers
