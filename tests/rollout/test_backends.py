"""The backend contract on its own: every registered backend's generator is a ``Generator``, and naming or
building the rollout machinery never imports vLLM."""

from __future__ import annotations

import inspect
import subprocess
import sys

from marl_cli.rollout.backends.base import Generator
from marl_cli.rollout.generation import HFGenerator
from tests.helpers import ScriptedGenerator


def test_the_hf_generator_and_a_test_double_satisfy_the_protocol():
    assert isinstance(HFGenerator(), Generator)
    assert isinstance(ScriptedGenerator(lambda *a: ""), Generator)
    assert not isinstance(object(), Generator)


def test_the_vllm_generator_has_the_protocols_methods_with_its_signatures():
    from marl_cli.rollout.vllm_generator import VLLMGenerator

    for name in ("generate", "start", "release"):
        theirs = inspect.signature(getattr(VLLMGenerator, name))
        ours = inspect.signature(getattr(Generator, name))
        assert list(theirs.parameters) == list(ours.parameters), name
    assert "self.calls = 0" in inspect.getsource(VLLMGenerator.__init__)


def test_no_rollout_module_imports_vllm():
    code = ("import sys, marl_cli.rollout.backends, marl_cli.rollout.engine, marl_cli.rollout.vllm_generator, "
            "marl_cli.training.build; print('vllm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
