"""``marl gpu-check``: without CUDA one line and exit 0; the checks with a CPU stand-in pass on the CPU (bf16 with fp32
masters, gradient checkpointing, 2 gloo processes for NCCL and FSDP2, a paper cell's update at a small shape); a
failing check fails its row only; the table, JSON and Markdown; ``--only``; a check in its own process and its
timeout. The vLLM checks run where vLLM is (the CPU build: ``.venv-vllm``; they skip here)."""

import json

import pytest
import torch

from marl_cli.gpu_check import runner, training
from marl_cli.gpu_check.checks import CHECKS, Setup, Skip
from marl_cli.gpu_check.pair import Work
from marl_cli.gpu_check.paper_cell import QWEN3_1_7B, docs_estimate, paper_cell
from marl_cli.gpu_check.speed import speed
from marl_cli.gpu_check.table import Row, markdown, text_table, write
from tests.helpers import cli

SMALL_CELL = {**QWEN3_1_7B, "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32}
"""The paper cell's model at a shape a CPU test trains in a second (its vocabulary still beyond the tokenizer's)."""


@pytest.fixture
def setup(tmp_path):
    return Setup("cpu", 2, "bfloat16", str(tmp_path))


def test_without_cuda_it_says_so_in_one_line_and_exits_0(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    out = cli("gpu-check")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("\n") == 1
    assert out.stdout.startswith(f"no CUDA device: nothing to check (torch {torch.__version__}, CUDA runtime ")
    assert list(tmp_path.iterdir()) == []  # nothing written
    refused = cli("gpu-check", "--device", "cuda")
    assert refused.returncode == 2 and "no CUDA device" in refused.stderr
    assert cli("gpu-check", "--only", "nonsense").returncode == 2


def test_bf16_update_keeps_fp32_masters_and_moves_at_lr_1e_6_on_the_cpu(setup):
    row = runner.run_check("bf16-master", setup)
    assert row.status == "pass", row.reason
    assert row.figures["compute"] == "bfloat16" and row.figures["masters"] == "float32"
    assert row.figures["weights moved"] > 0.99
    assert row.figures["moved in a bf16 copy"] < 0.5  # the step is below bf16's resolution for most weights


def test_gradient_checkpointing_gives_the_same_update_with_fewer_saved_activations_on_the_cpu(setup):
    row = runner.run_check("grad-checkpointing", setup)
    assert row.status == "pass", row.reason
    assert row.figures["weights gap"] <= row.figures["tolerance"]
    plain, checkpointed = (float(x) for x in row.figures["saved MiB"].split(" → "))
    assert checkpointed < 0.5 * plain


@pytest.mark.parametrize("check", ["nccl", "fsdp2"])
def test_two_gloo_processes_update_as_one_on_the_cpu(setup, check):
    row = runner.run_check(check, setup)
    assert row.status == "pass", row.reason
    assert row.figures["backend"] == "gloo"
    assert row.figures["weights gap"] < 1e-3


def test_multi_process_checks_skip_without_the_devices(tmp_path):
    row = runner.run_check("nccl", Setup("cuda", 1, "bfloat16", str(tmp_path)))
    assert (row.status, row.reason) == ("skip", "a 2-process update needs 2 GPUs; this machine has 1")
    assert runner.run_check("tensor-parallel", Setup("cpu", 2, "bfloat16", str(tmp_path))).status == "skip"


def test_a_paper_cell_update_at_a_small_shape_and_the_docs_memory_arithmetic(setup):
    row = runner.run_check("paper-cell", setup, lambda s: paper_cell(s, SMALL_CELL))
    assert row.status == "pass", row.reason
    assert row.figures["compute"] == "bfloat16" and row.figures["lr"] == 1e-6
    assert "peak GB" not in row.figures and row.figures["estimate GB"] > 0  # not measured on the CPU
    with torch.device("meta"):
        from transformers import Qwen3Config, Qwen3ForCausalLM

        params = sum(p.numel() for p in Qwen3ForCausalLM(Qwen3Config(**QWEN3_1_7B)).parameters())
    assert params == pytest.approx(1.72e9, rel=0.01)
    # the numbers docs/guides/rollout-and-gpus.md gives ("Memory per paper cell"), in GB
    assert docs_estimate(params) / 1e9 == pytest.approx(27.5, abs=0.1)
    assert (docs_estimate(params, engine=True) - docs_estimate(params)) / 1e9 == pytest.approx(3.4, abs=0.1)
    assert docs_estimate(params, 8, sharded=True) / 1e9 == pytest.approx(6.9, abs=0.1)
    assert docs_estimate(8_200_000_000) / 1e9 == pytest.approx(131, abs=0.5)
    assert docs_estimate(8_200_000_000, 8, sharded=True) / 1e9 == pytest.approx(33, abs=0.5)


def test_async_rollouts_run_synchronous_and_one_update_behind(setup):
    row = runner.run_check("async-rollouts", setup)  # on the CPU stand-in: the rollout worker is a real process
    assert row.status == "pass", row.reason
    assert set(row.figures) == {"s/step k=0", "s/step k=1", "ratio"} and row.figures["s/step k=1"] > 0


def test_the_speed_check_times_marl_and_trl_at_equal_work_and_the_3_turn_run(setup):
    row = runner.run_check("speed-tiny", setup, lambda s: speed(s, "tiny", Work(tasks=2, generations=2, tokens=4,
                                                                                 steps=2)))
    assert row.status == "pass", row.result
    assert row.figures["work"] == "2×2×4"
    assert row.figures["ratio"] == pytest.approx(row.figures["marl s/step"] / row.figures["TRL s/step"])
    assert all(row.figures[f"3-turn s/step k={k}"] > 0 for k in (0, 1)) and row.figures["marl static-cache s/step"] > 0
    assert runner.run_check("speed-0.6b", setup).status == "skip"  # the CPU runs the tiny stand-in only


def test_a_short_run_trains_on_the_setups_device(setup):
    assert training.short_run(setup, "plain", steps=1) > 0


def test_a_failing_check_fails_its_row_and_the_others_run(monkeypatch, setup):
    def broken(s):
        raise RuntimeError("boom\nmore detail")

    def skipped(s):
        raise Skip("not here")

    checks = {"device": broken, "bf16-master": lambda s: {"loss": 0.5}, "nccl": skipped}
    monkeypatch.setattr(runner, "resolve", checks.__getitem__)
    rows = runner.run_checks(["nccl", "bf16-master", "device"], setup, timeout=60, isolate=False)
    assert [(r.check, r.result) for r in rows] == [("device", "fail: RuntimeError: boom"),
                                                   ("bf16-master", "pass"), ("nccl", "skip: not here")]


def test_table_json_and_markdown(tmp_path):
    rows = [Row("device", "pass", {"gpu": "H100 | SXM", "memory GiB": 79.6543}, 1.234),
            Row("nccl", "skip", {}, 0.01, "a 2-process update needs 2 GPUs; this machine has 1")]
    text = text_table(rows).splitlines()
    assert text[0].split() == ["check", "result", "figures", "seconds"] and len(text) == 4
    assert "gpu H100 | SXM; memory GiB 79.65" in text[2] and text[2].endswith("1.2")
    machine = {"date": "2026-01-02", "card": "H100 × 1", "torch": "2.13.0"}
    md = markdown(rows, "title")
    assert md.startswith("title\n\n| check | result | figures | seconds |\n|---|---|---|---|\n")
    assert "H100 \\| SXM" in md and "| skip: a 2-process update needs 2 GPUs; this machine has 1 |" in md
    json_path, md_path = write(rows, machine, tmp_path / "out" / "gpu_check.json")
    saved = json.loads(json_path.read_text())
    assert saved["machine"] == machine and [Row(**r) for r in saved["rows"]] == rows
    assert md_path.read_text().startswith("`make gpu-check` on 2026-01-02, H100 × 1 (torch 2.13.0)")


def test_only_runs_the_named_checks_in_table_order_and_writes_both_files(monkeypatch, tmp_path):
    monkeypatch.setattr(runner, "run_isolated", lambda name, setup, timeout: runner.run_check(name, setup))
    out = tmp_path / "gc.json"
    done = cli("gpu-check", "--device", "cpu", "--only", "tensor-parallel", "--only", "device", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert [r["check"] for r in json.loads(out.read_text())["rows"]] == ["device", "tensor-parallel"]
    assert "device" in done.stdout and "[2/2] tensor-parallel: skip" in done.stderr
    assert out.with_suffix(".md").read_text().startswith("`make gpu-check` on ")
    assert len(CHECKS) == 13  # the ten GPU paths of issue 33 and issue 46's three speed rows


def test_a_check_runs_in_its_own_process_and_is_killed_at_its_timeout(setup):
    row = runner.run_isolated("device", setup, timeout=300)
    assert row.status == "pass", row.reason
    assert row.figures["cuda"] == "not available"
    late = runner.run_isolated("device", setup, timeout=0.2)
    assert late.result == "fail: timed out after 0.2 s"
