"""The backend contract on its own: every registered backend's generator is a ``Generator``, and naming or
building the rollout machinery never imports vLLM."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import marl_cli
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


def test_no_module_imports_vllm_at_module_level():
    """vLLM is an optional extra: only the functions that build or drive an engine import it (read from the source,
    so the check holds whether or not vllm is installed)."""
    package = Path(marl_cli.__file__).parent
    for path in package.rglob("*.py"):
        body = ast.parse(path.read_text()).body
        top = [n for n in body if isinstance(n, ast.Import | ast.ImportFrom)]
        top += [n for t in body if isinstance(t, ast.If | ast.Try) for n in ast.walk(t)
                if isinstance(n, ast.Import | ast.ImportFrom)]
        names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
        assert not [n for n in names if n == "vllm" or n.startswith("vllm.")], path
