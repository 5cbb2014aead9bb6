"""A non-editable install finds its configs (they are packed into the wheel as marl_cli/conf)."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_carries_configs_and_runs_outside_the_checkout(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(ROOT)], check=True, capture_output=True)
    wheel = next((tmp_path / "dist").glob("marl-*.whl"))
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    assert (site / "marl_cli" / "conf" / "train.yaml").is_file()
    assert (site / "marl_cli" / "conf" / "experiment" / "embedded.yaml").is_file()
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "marl_cli", "train", "experiment=embedded", "--cfg", "job"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "name: embedded" in out.stdout
    probe = subprocess.run([sys.executable, "-c", "import marl_cli; print(marl_cli.__file__)"], cwd=tmp_path,
                           env=env, capture_output=True, text=True)
    assert probe.stdout.strip().startswith(str(site))
