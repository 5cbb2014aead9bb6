"""The sandbox runs model-written code in isolation: limits hold, the host stays untouched, bad configs fail fast."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from marl_cli.config.errors import ConfigError
from marl_cli.config.schema import SandboxConfig
from marl_cli.sandbox import Sandbox, SandboxResult
from marl_cli.sandbox.runner import OUTPUT_LIMIT

REPO = Path(__file__).resolve().parents[2]
LIMITS = {"timeout_s": 2.0, "cpu_seconds": 1, "memory_mb": 256, "max_processes": 16}


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(OmegaConf.structured(SandboxConfig(**LIMITS)))


@pytest.fixture(scope="module")
def rlimit_sandbox() -> Sandbox:
    """rlimit-only sandbox; as root the interpreter must be readable by nobody, so fall back to the system one."""
    for python in ("", "/usr/bin/python3"):
        try:
            return Sandbox(SandboxConfig(backend="rlimit", python=python, **LIMITS))
        except ConfigError:
            continue
    pytest.fail("no interpreter the rlimit backend can run")


def _timed(sb: Sandbox, code: str) -> tuple[SandboxResult, float]:
    start = time.monotonic()
    result = sb.run(code)
    return result, time.monotonic() - start


def test_print_stdin_and_files(sandbox):
    code = "import sys, helper\nprint(helper.double(int(sys.stdin.read())))\nprint(open('data/n.txt').read())"
    result = sandbox.run(code, stdin="21", files={"helper.py": "def double(x):\n    return 2 * x\n", "data/n.txt": "n"})
    assert result.ok, result.stderr
    assert result.stdout == "42\nn\n"
    assert result.stderr == "" and result.returncode == 0 and not result.timed_out


def test_failing_code_reports_without_raising(sandbox):
    result = sandbox.run("raise SystemExit('boom')")
    assert not result.ok and result.returncode == 1 and "boom" in result.stderr


def test_busy_loop_is_killed_by_the_cpu_limit(sandbox):
    result, elapsed = _timed(sandbox, "while True:\n    pass")
    assert not result.ok
    assert elapsed < LIMITS["timeout_s"] + 2


def test_sleep_is_killed_by_the_wall_clock(sandbox):
    result, elapsed = _timed(sandbox, "import time\nprint('started', flush=True)\ntime.sleep(60)")
    assert result.timed_out and result.returncode is None and not result.ok
    assert result.stdout == "started\n"
    assert elapsed < LIMITS["timeout_s"] + 2


def test_writes_land_only_in_the_private_dir(sandbox, tmp_path):
    targets = [str(REPO / "sandbox_escape.txt"), "/work/sandbox_escape.txt", "/root/sandbox_escape.txt",
               "/etc/sandbox_escape.txt", "/usr/sandbox_escape.txt", "/sandbox_escape.txt",
               str(tmp_path / "sandbox_escape.txt")]
    code = f"""
import json, os
written = []
for path in {targets!r}:
    try:
        with open(path, "w") as f:
            f.write("x")
        written.append(path)
    except OSError:
        pass
with open("own.txt", "w") as f:
    f.write("mine")
print(json.dumps({{"written": written, "own": open("own.txt").read(), "cwd": os.getcwd()}}))
"""
    result = sandbox.run(code)
    assert result.ok, result.stderr
    report = json.loads(result.stdout)
    assert report["written"] == [] and report["own"] == "mine"
    assert not any(os.path.exists(path) for path in targets)
    assert not os.path.exists(os.path.join(report["cwd"], "own.txt"))


def test_everything_a_run_writes_together_is_capped(tmp_path):
    sb = Sandbox(OmegaConf.structured(SandboxConfig(**{**LIMITS, "file_size_mb": 4, "workdir_mb": 10})))
    code = ("import os\nn = 0\ntry:\n    for i in range(10):\n        os.makedirs(f'd{i}', exist_ok=True)\n"
            "        open(f'd{i}/f', 'wb').write(b'a' * (3 << 20)); n += 1\n"
            "except OSError as e:\n    print('stopped', n)\n"
            "print(sum(os.path.getsize(f'd{i}/f') for i in range(10) if os.path.exists(f'd{i}/f')) >> 20)")
    out = sb.run(code, files={"given/data.txt": "x"})
    stopped, total = out.stdout.split("\n")[-3:-1] if "stopped" in out.stdout else ("", "")
    assert stopped.startswith("stopped") and int(total) <= 10  # per file 4 MiB, all together 10 MiB
    assert sb.run("print(open('given/data.txt').read())", files={"given/data.txt": "x"}).stdout.strip() == "x"


@pytest.mark.skipif(os.geteuid() != 0, reason="per-run uids need root; unprivileged runs share the user's uid")
def test_64_concurrent_runs_on_a_16_cpu_count_each_keep_their_process_budget(monkeypatch):
    sandbox = Sandbox(OmegaConf.structured(SandboxConfig(**{**LIMITS, "timeout_s": 60})))  # 2 cores, 64 runs
    monkeypatch.setattr("marl_cli.sandbox.runner.os.cpu_count", lambda: 16)  # 4 workers per CPU: 64 at once
    code = "import subprocess, sys, time\ntime.sleep(1)\nsubprocess.run([sys.executable, '-c', 'pass'], check=True)\n" \
           "print('ok')"
    results = sandbox.run_many([(code, "")] * 64)
    assert [r.stdout.strip() for r in results] == ["ok"] * 64, next(r.stderr for r in results if not r.ok)


def test_a_runs_processes_share_one_memory_limit():
    sandbox = Sandbox(OmegaConf.structured(SandboxConfig(**{**LIMITS, "timeout_s": 30, "cpu_seconds": 10})))
    if sandbox.memory is None:
        pytest.skip("no writable memory cgroup here: the memory limit is per process only (RLIMIT_AS)")
    child = "import time; b = bytearray(150 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(1); print('held')"
    code = (f"import subprocess, sys\nprocs = [subprocess.Popen([sys.executable, '-c', {child!r}]) for _ in range(3)]\n"
            "print('codes', [p.wait() for p in procs])")
    result = sandbox.run(code)  # 3 x 150 MiB, each under the 256 MiB per-process limit, 450 MiB together
    assert result.ok and "codes" in result.stdout, result
    assert result.stdout.count("held") < 3 and "-9" in result.stdout  # the cgroup's OOM killer stopped one


def test_no_network(sandbox):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    code = f"""
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=1).close()
    print("connected")
except OSError:
    print("no connect")
try:
    socket.getaddrinfo("example.com", 80)
    print("resolved")
except OSError:
    print("no dns")
"""
    try:
        result = sandbox.run(code)
    finally:
        server.close()
    assert result.ok, result.stderr
    assert result.stdout.split() == ["no", "connect", "no", "dns"]


def test_fork_bomb_is_contained(sandbox):
    result, elapsed = _timed(sandbox, "import os\nwhile True:\n    os.fork()")
    assert not result.ok
    assert "BlockingIOError" in result.stderr or result.timed_out
    assert elapsed < LIMITS["timeout_s"] + 2
    assert sandbox.run("print('alive')").stdout == "alive\n"


def test_memory_hog_fails(sandbox):
    result = sandbox.run("block = bytearray(4 * 1024 ** 3)\nprint('allocated')")
    assert not result.ok and result.returncode != 0
    assert "MemoryError" in result.stderr and "allocated" not in result.stdout


def test_parent_environment_is_hidden(sandbox, monkeypatch):
    monkeypatch.setenv("MARL_SECRET", "x")
    result = sandbox.run("import json, os\nprint(json.dumps(dict(os.environ)))")
    assert result.ok, result.stderr
    env = json.loads(result.stdout)
    assert "MARL_SECRET" not in env
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and env["HOME"] == os.path.realpath(env["TMPDIR"])


def test_output_is_capped(sandbox):
    result = sandbox.run("import sys\nfor _ in range(200):\n    sys.stdout.write('x' * 10000)")
    assert result.ok, result.stderr
    assert OUTPUT_LIMIT <= len(result.stdout) < OUTPUT_LIMIT + 100
    assert result.stdout.endswith(f"[output truncated at {OUTPUT_LIMIT} bytes]")


def test_run_many_keeps_order_and_runs_concurrently(sandbox):
    jobs = [(f"import sys, time\ntime.sleep(0.4)\nprint({i} + int(sys.stdin.read()))", "100") for i in range(4)]
    start = time.monotonic()
    results = sandbox.run_many(jobs)
    elapsed = time.monotonic() - start
    assert [r.stdout for r in results] == ["100\n", "101\n", "102\n", "103\n"]
    if (os.cpu_count() or 1) >= 2:
        assert elapsed < 4 * 0.4
    assert sandbox.run_many([]) == []


@pytest.mark.parametrize("share", [False, True])
def test_share_identical_runs_each_distinct_program_once(share):
    sandbox = Sandbox(OmegaConf.structured(SandboxConfig(**LIMITS, share_identical=share)))
    draw = "import random\nprint(random.random())"
    jobs = [(draw, ""), ("print(1)", ""), (draw, ""), ("print(1)", "x"), (draw, "")]
    results = sandbox.run_many(jobs)
    assert [r.stdout for r in results][1::2] == ["1\n", "1\n"]
    assert all(r.ok for r in results)
    draws = {results[i].stdout for i in (0, 2, 4)}
    assert len(draws) == (1 if share else 3)  # shared: the copies get the one run's output


def test_file_names_must_stay_inside(sandbox):
    for name in ("/etc/x.py", "../x.py", ""):
        with pytest.raises(ValueError):
            sandbox.run("pass", files={name: "x"})


def test_missing_bwrap_names_the_opt_in(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError) as info:
        Sandbox(SandboxConfig())
    message = str(info.value)
    assert "\n" not in message
    assert "sandbox.backend=rlimit" in message and "apt-get install bubblewrap" in message


@pytest.mark.parametrize("override", [{"backend": "docker"}, {"timeout_s": 0}, {"cpu_seconds": -1},
                                      {"memory_mb": "lots"}, {"max_processes": 0}, {"file_size_mb": 0},
                                      {"python": "/nonexistent/python"}])
def test_bad_config_is_one_line(override):
    with pytest.raises(ConfigError) as info:
        Sandbox(SandboxConfig(**{**LIMITS, **override}))
    assert "\n" not in str(info.value) and f"sandbox.{next(iter(override))}" in str(info.value)


def test_rlimit_backend_runs_code_with_limits(rlimit_sandbox, monkeypatch):
    monkeypatch.setenv("MARL_SECRET", "x")
    result = rlimit_sandbox.run("import os, sys\nprint(sys.stdin.read(), 'MARL_SECRET' in os.environ, os.listdir())",
                                stdin="hi", files={"a.txt": ""})
    assert result.ok, result.stderr
    assert result.stdout.split(" ", 2)[:2] == ["hi", "False"] and "a.txt" in result.stdout
    result, elapsed = _timed(rlimit_sandbox, "import time\ntime.sleep(60)")
    assert result.timed_out and not result.ok
    assert elapsed < LIMITS["timeout_s"] + 2
    result = rlimit_sandbox.run("block = bytearray(4 * 1024 ** 3)")
    assert "MemoryError" in result.stderr
