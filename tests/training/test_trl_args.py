import warnings

import pytest
from trl import GRPOConfig, SFTConfig

from marl_cli.training.trl_args import checkpointing_off


@pytest.mark.parametrize("config", [GRPOConfig, SFTConfig])
def test_trl_configs_leave_checkpointing_off_without_a_deprecation_warning(config, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        args = config(output_dir=str(tmp_path), use_cpu=True, report_to="none", **checkpointing_off())
    assert args.gradient_checkpointing is False  # TRL's default is True
    assert getattr(args, "activation_checkpointing", False) is False
