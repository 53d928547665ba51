"""Compile time of the virtual-noise kernels for one (kind, offset): a diagnostic.

    python benchmarks/compile_probe.py KIND OFFSET [OP]
"""
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, ".")
import jaxnoise  # noqa: E402

kind, offset = sys.argv[1], int(sys.argv[2])
ops = sys.argv[3].split(",") if len(sys.argv) > 3 else ["forward", "gradient"]
impl = "pallas" if jax.default_backend() == "gpu" else "interpret"
seeds = jnp.arange(4, dtype=jnp.uint32)
for op in ops:
  if op == "forward":
    fn = jax.jit(lambda x, w: jaxnoise.virtual_perturbed_linear(
        x, w, None, seeds, 1.0, offset, kind=kind, implementation=impl))
    args = (jnp.eye(45), jnp.zeros((19, 45)))
  else:
    fn = jax.jit(lambda f: jaxnoise.virtual_weight_gradient(
        f, seeds, (19, 45), 0.25, None, offset, kind=kind, implementation=impl))
    args = (jnp.ones(4),)
  t0 = time.perf_counter()
  fn.lower(*args).compile()
  print(f"compile {op} {kind} offset={offset}: {time.perf_counter() - t0:.1f} s", flush=True)
