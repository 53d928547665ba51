"""Shared pytest configuration: GPU-only tests skip cleanly without a GPU."""

import jax
import pytest

HAS_GPU = jax.default_backend() == "gpu"


def pytest_collection_modifyitems(config, items):
  del config
  skip_gpu = pytest.mark.skip(reason="needs a GPU (jax.default_backend() != 'gpu')")
  for item in items:
    if "gpu" in item.keywords and not HAS_GPU:
      item.add_marker(skip_gpu)


@pytest.fixture
def rng():
  """A fresh numpy Generator per test (seeded from the test's node id for reproducibility)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  return np.random.default_rng(abs(hash(__name__)) % (2**32))
