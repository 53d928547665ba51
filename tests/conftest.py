"""Shared pytest configuration: GPU-only tests skip cleanly without a GPU."""

import os
import zlib

import jax
import numpy as np
import pytest

HAS_GPU = jax.default_backend() == "gpu"


def pytest_collection_modifyitems(config, items):
  del config
  skip_gpu = pytest.mark.skip(reason="needs a GPU (jax.default_backend() != 'gpu')")
  for item in items:
    if "gpu" in item.keywords and not HAS_GPU:
      item.add_marker(skip_gpu)


@pytest.fixture
def rng(request):
  """A numpy Generator per test, seeded from the test's id (fresh inputs per test, reproducible).

  Set JAXNOISE_TEST_SEED to draw a different set of inputs.
  """
  seed = zlib.crc32(request.node.nodeid.encode()) ^ int(os.environ.get("JAXNOISE_TEST_SEED", "0"))
  return np.random.default_rng(seed)
