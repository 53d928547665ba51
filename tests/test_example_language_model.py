"""examples/es_language_model.py: --help starts nothing; --quick prints its metric line, resumes."""

import math
import os
import pathlib
import re
import subprocess
import sys

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
SCRIPT = EXAMPLES / "es_language_model.py"
LAST_LINE = re.compile(r"^bits_per_byte=(\S+) generations=(\d+) seconds=(\S+)$")


def _run(*args, timeout=300):
  env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                        timeout=timeout, env=env, check=False)


def test_help_starts_nothing():
  proc = _run("--help", timeout=60)
  assert proc.returncode == 0, proc.stderr[-2000:]
  for flag in ("--seed", "--implementation", "--generations", "--pop", "--rank", "--sigma",
               "--lr", "--out", "--quick", "--time-budget"):
    assert flag in proc.stdout
  assert "data:" not in proc.stdout


def test_quick_run_prints_a_finite_metric_line_and_resumes(tmp_path):
  proc = _run("--quick", "--out", str(tmp_path))
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  match = LAST_LINE.match(proc.stdout.strip().splitlines()[-1])
  assert match, proc.stdout[-2000:]
  bits, generations, seconds = float(match.group(1)), int(match.group(2)), float(match.group(3))
  assert math.isfinite(bits) and 0 < bits < 16 and math.isfinite(seconds)
  assert generations == 4
  assert (tmp_path / "curve.png").stat().st_size > 10_000
  assert (tmp_path / "samples.txt").read_text().count("--- ") == 2

  resumed = _run("--quick", "--generations", "6", "--out", str(tmp_path))
  assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-4000:]
  assert "resumed at generation 4" in resumed.stdout
  assert LAST_LINE.match(resumed.stdout.strip().splitlines()[-1]).group(2) == "6"
