"""A small Qwen3-style causal LM and a character-level tokenizer, built locally from a seed.

The tokenizer covers printable ASCII and newline, one token per character, so any environment's
text is representable without a vocabulary file; anything else maps to ``<unk>``.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from marl_cli.config.schema import TinyModelConfig

SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>"]
CHARACTERS = sorted(set(string.printable) - set("\t\r\x0b\x0c"))


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """The character-level tokenizer: specials first, then printable ASCII and newline."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>", padding_side="left")


def build_tiny_model(cfg: TinyModelConfig, vocab_size: int, seed: int) -> Qwen3ForCausalLM:
    """A randomly initialised Qwen3 model; the same seed gives the same weights."""
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=SPECIAL_TOKENS.index("<pad>"),
        eos_token_id=SPECIAL_TOKENS.index("<eos>"),
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config.pad_token_id = config.pad_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    return model


def save_tiny(cfg: TinyModelConfig, seed: int, directory: Path) -> Path:
    """Build the tiny model and tokenizer and save both to ``directory`` (HF format)."""
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(cfg, len(tokenizer), seed)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
