"""The main demo (examples/es_digits.py) runs from the command line and learns."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "examples" / "es_digits.py"
RESULT = re.compile(r"train accuracy ([0-9.]+), test accuracy ([0-9.]+)")


def _run(*args, timeout=300):
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                        timeout=timeout, env=env, check=False)


@pytest.mark.parametrize("extra", [[], ["--kind", "rademacher", "--steps", "60", "--pop", "64"]],
                         ids=["default_kind", "rademacher"])
def test_es_digits_quick_beats_chance_clearly(rng, extra):
  seed = str(int(rng.integers(0, 1000)))
  proc = _run("--quick", "--seed", seed, *extra)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  match = RESULT.search(proc.stdout)
  assert match, proc.stdout[-2000:]
  train_acc, test_acc = float(match.group(1)), float(match.group(2))
  # Ten classes: chance is 0.1. The quick run reaches about 0.9.
  assert test_acc > 0.6, (train_acc, test_acc)
  assert train_acc > 0.6, (train_acc, test_acc)


def test_es_digits_rejects_an_odd_population():
  proc = _run("--pop", "7", "--steps", "1", timeout=120)
  assert proc.returncode == 2
  assert "--pop" in proc.stderr and "even" in proc.stderr
