import importlib
import re
import warnings

import pytest
from trl import GRPOConfig, SFTConfig

from marl_cli.training.learner.trl_args import VLLM_VERSION_WARNING, checkpointing_off, vllm_warning_once


@pytest.mark.parametrize("config", [GRPOConfig, SFTConfig])
def test_trl_configs_leave_checkpointing_off_without_a_deprecation_warning(config, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        args = config(output_dir=str(tmp_path), use_cpu=True, report_to="none", **checkpointing_off())
    assert args.gradient_checkpointing is False  # TRL's default is True
    assert getattr(args, "activation_checkpointing", False) is False


def test_trls_vllm_version_warning_shows_once_not_once_per_call_site(monkeypatch):
    trl_imports = importlib.import_module("trl.import_utils")
    monkeypatch.setattr(trl_imports, "_is_package_available", lambda name, return_version=False: (True, "9.0"))
    warnings.onceregistry.clear()
    with warnings.catch_warnings(record=True) as caught:
        vllm_warning_once()  # as importing trl_args does (pytest resets the filters its collection installed)
        trl_imports.is_vllm_available()  # TRL warns with stacklevel=2: each caller's line is a new place
        trl_imports.is_vllm_available()
        trl_imports.is_vllm_available(min_version="0.22.0")
    shown = [w for w in caught if re.match(VLLM_VERSION_WARNING, str(w.message))]
    assert len(shown) == 1, [str(w.message) for w in caught]
