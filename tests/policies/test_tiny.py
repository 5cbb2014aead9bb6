import torch

from marl_cli.config.schema import TinyModelConfig
from marl_cli.policies.tiny import build_tiny_model, build_tiny_tokenizer

SMALL = TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                        num_key_value_heads=1, head_dim=16)


def test_tokenizer_round_trips_text_one_token_per_character():
    tok = build_tiny_tokenizer()
    text = "Go from S to G.\nS . #\n. . G\n#### R D"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert tok("é", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]
    assert tok.pad_token_id != tok.eos_token_id


def test_model_is_deterministic_from_seed():
    tok = build_tiny_tokenizer()
    a, b, c = (build_tiny_model(SMALL, len(tok), seed) for seed in (7, 7, 8))
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    assert a.config.model_type == "qwen3"
