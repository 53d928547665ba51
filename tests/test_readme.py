"""The README's code runs, and its ES example is examples/es_nnx_minimal.py verbatim."""

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def _python_blocks():
  return re.findall(r"```python\n(.*?)```", README, re.S)


def test_es_example_block_is_the_example_file():
  block = re.search(r"<!-- es-nnx-example:start -->\n```python\n(.*?)```\n<!-- es-nnx-example:end -->",
                    README, re.S)
  assert block is not None, "README lost its ES example markers"
  assert block.group(1) == (REPO / "examples" / "es_nnx_minimal.py").read_text()


def test_api_tour_blocks_run():
  """Every other python block runs, in order, in one namespace (the tour builds on itself)."""
  blocks = [b for b in _python_blocks() if "es_nnx" not in b and "load_digits" not in b]
  assert len(blocks) >= 4
  namespace = {}
  for block in blocks:
    exec(compile(block, "README.md", "exec"), namespace)  # pylint: disable=exec-used
  assert namespace["y"].shape == (4, 64)
  assert namespace["ys"].shape == (8, 32, 256)
  # The antithetic snippets show something: a gradient that is not exactly zero (a fitness
  # even in the noise cancels within each pair), and pairs equal to the batched op's output.
  assert float(abs(namespace["g_w"]).max()) > 0 and float(abs(namespace["g_b"]).max()) > 0
  population = namespace["jaxnoise"].virtual_perturbed_linear(
      namespace["x"], namespace["w"], namespace["b"], namespace["seeds"], 0.02, 0,
      antithetic=True)
  assert (namespace["ys"] == population).all()
  assert namespace["packed"].shape == (64, 96)


@pytest.mark.parametrize("command", ["examples/es_digits.py", "-m pytest -q -n 2"])
def test_quickstart_commands_are_in_the_readme(command):
  assert command in README
