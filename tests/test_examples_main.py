"""The main job (examples/es_digits.py) learns, prints its metric line and resumes bit for bit."""

import importlib.util
import json
import math
import os
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
SCRIPT = EXAMPLES / "es_digits.py"
LAST_LINE = re.compile(r"^test_accuracy=([0-9.]+) generations=(\d+) seconds=([0-9.]+)$")


def _run(*args, timeout=300):
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                        timeout=timeout, env=env, check=False)


def _load_example():
  spec = importlib.util.spec_from_file_location("es_digits", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_es_digits_quick_learns_and_ends_with_its_metric_line(rng, tmp_path):
  seed = str(int(rng.integers(0, 1000)))
  proc = _run("--quick", "--seed", seed, "--out", str(tmp_path))
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  match = LAST_LINE.match(proc.stdout.strip().splitlines()[-1])
  assert match, proc.stdout[-2000:]
  test_acc, generations, seconds = float(match.group(1)), int(match.group(2)), float(match.group(3))
  # Ten classes: chance is 0.1. The quick run reaches about 0.9.
  assert test_acc > 0.6, proc.stdout[-2000:]
  assert generations == 100 and math.isfinite(seconds)
  assert (tmp_path / "curve.png").stat().st_size > 10_000
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["100", "50"]


def test_es_digits_resume_is_bit_identical_to_an_uninterrupted_run(rng, tmp_path, capsys):
  """Run K generations, resume to 2K; compare with 2K in one go (checkpoint mid-way)."""
  es_digits = _load_example()
  seed = str(int(rng.integers(0, 1000)))
  common = ["--seed", seed, "--pop", "16", "--batch", "32", "--hidden", "8", "--eval-every",
            "2", "--kind", "rademacher"]
  first = es_digits.main([*common, "--generations", "4", "--checkpoint-every", "4",
                          "--out", str(tmp_path / "resumed")])
  resumed = es_digits.main([*common, "--generations", "8", "--checkpoint-every", "4",
                            "--out", str(tmp_path / "resumed")])
  assert "resumed at generation 4" in capsys.readouterr().out
  straight = es_digits.main([*common, "--generations", "8", "--checkpoint-every", "3",
                             "--out", str(tmp_path / "straight")])
  assert first["generations"] == 4 and resumed["generations"] == straight["generations"] == 8
  for name in ("params", "es_state"):
    leaves_a, treedef_a = jax.tree.flatten(resumed[name])
    leaves_b, treedef_b = jax.tree.flatten(straight[name])
    assert treedef_a == treedef_b
    for a, b in zip(leaves_a, leaves_b):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert int(resumed["es_state"].generation) == 8
  assert resumed["history"]["train_loss"] == straight["history"]["train_loss"]
  assert resumed["history"]["test_accuracy"] == straight["history"]["test_accuracy"]
  # The run moved: the resumed parameters are not the first half's.
  assert not np.array_equal(np.asarray(jax.tree.leaves(first["params"])[0]),
                            np.asarray(jax.tree.leaves(resumed["params"])[0]))
  # A run with other settings is not resumed from these checkpoints.
  with pytest.raises(SystemExit, match="--fresh"):
    es_digits.main([*common, "--generations", "9", "--sigma", "0.1",
                    "--out", str(tmp_path / "straight")])


def test_es_digits_rejects_an_odd_population():
  proc = _run("--pop", "7", "--generations", "1", timeout=120)
  assert proc.returncode == 2
  assert "--pop" in proc.stderr and "even" in proc.stderr


# ----------------------------------------------------------------------------
# The other examples: --help does not train, --quick ends with a finite metric line.


@pytest.mark.parametrize("script", ["es_digits", "es_cartpole", "compare_evosax",
                                    "es_nnx_minimal", "ternary_digits"])
def test_example_help_describes_options_and_does_not_train(script):
  proc = subprocess.run([sys.executable, str(EXAMPLES / f"{script}.py"), "--help"],
                        capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.startswith("usage:")
  assert "test accuracy after" not in proc.stdout  # es_nnx_minimal's training print
  options = re.findall(r"^  (--[a-z-]+)", proc.stdout, re.M)
  for option in options:  # every option has a description after its name
    line = re.search(rf"^  {option}\b.*(?:\n {{10,}}.*)*", proc.stdout, re.M).group(0)
    assert len(line.split()) > 2 or option == "--help", (option, line)
  if script not in ("es_nnx_minimal", "ternary_digits"):
    assert {"--seed", "--implementation", "--quick"} <= set(options), options


def _quick(script, *args):
  proc = subprocess.run([sys.executable, str(EXAMPLES / f"{script}.py"), "--quick", *args],
                        capture_output=True, text=True, timeout=300, check=False,
                        env=dict(os.environ, PYTHONUNBUFFERED="1"))
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  last = proc.stdout.strip().splitlines()[-1]
  values = dict(item.split("=") for item in last.split())
  assert all(math.isfinite(float(value)) for value in values.values()), last
  return values


def test_es_cartpole_quick_ends_with_a_finite_mean_return():
  pytest.importorskip("gymnax")
  values = _quick("es_cartpole")
  assert set(values) == {"mean_return", "generations", "seconds"}
  assert values["generations"] == "10"
  assert 8.0 <= float(values["mean_return"]) <= 500.0  # CartPole's returns


def test_compare_evosax_quick_writes_its_figure_and_numbers(tmp_path):
  pytest.importorskip("evosax")
  pytest.importorskip("gymnax")
  out = tmp_path / "compare.png"
  values = _quick("compare_evosax", "--out", str(out))
  assert set(values) == {"digits_jaxnoise", "digits_evosax", "cartpole_jaxnoise",
                         "cartpole_evosax", "seconds"}
  assert out.stat().st_size > 10_000
  summary = json.loads(out.with_suffix(".json").read_text())
  for task in ("digits", "cartpole"):
    for library in ("jaxnoise", "evosax"):
      result = summary["results"][task][library]
      assert result["median_step_ms"] > 0 and result["step_memory_bytes"] > 0
