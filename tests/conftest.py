"""Shared pytest configuration: GPU-only tests skip cleanly without a GPU; one JAX cache."""

import os
import shutil
import tempfile
import zlib

import jax
import numpy as np
import pytest

HAS_GPU = jax.default_backend() == "gpu"
_CACHE_KEY = pytest.StashKey[str]()


def pytest_configure(config):
  """One persistent JAX compilation cache for the whole run, removed at its end.

  The suite compiles many programs more than once: in each xdist worker, and in
  the subprocesses that tests start (examples run twice to test resuming,
  benchmarks' quick modes, multi-device scripts). Compiling dominates the
  suite's time on a CI core (the language-model example's ES step: 19 s cold,
  under 5 s from the cache). Workers and subprocesses inherit the directory
  through ``JAX_COMPILATION_CACHE_DIR``. A cache the caller set is left alone;
  ``JAXNOISE_TEST_JAX_CACHE=0`` compiles everything cold.
  """
  if (hasattr(config, "workerinput") or os.environ.get("JAX_COMPILATION_CACHE_DIR")
      or os.environ.get("JAXNOISE_TEST_JAX_CACHE") == "0"):
    return
  path = tempfile.mkdtemp(prefix="jaxnoise-tests-jax-cache-")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = path
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"
  jax.config.update("jax_compilation_cache_dir", path)  # this process imported jax already
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  config.stash[_CACHE_KEY] = path


def pytest_unconfigure(config):
  path = config.stash.get(_CACHE_KEY, None)
  if path:
    shutil.rmtree(path, ignore_errors=True)


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
