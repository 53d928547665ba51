"""Population sharding with shard_map: the sharded ES step equals the single-device step.

The multi-device test runs in a subprocess with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (the flag must be set
before JAX initialises). What it checks, and how exactly:

* fitness: sharded vs one device to 1e-6 (each device evaluates a slice; XLA
  may compile the smaller batched matmuls with another reduction order);
* the ES update from a given fitness vector: bit-exact (the same program on
  replicated inputs);
* three whole ES steps (centered ranks): bit-exact parameters and state (the
  ranks absorb last-bit fitness differences);
* the compiled sharded evaluation's only collective is one all-gather of the
  ``(pop,)`` float32 fitness.
"""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnoise.parallel import population_mesh, sharded_fitness

SCRIPT = textwrap.dedent("""
    import json, re, sys
    import jax, jax.numpy as jnp, numpy as np, optax
    from flax import nnx
    from jaxnoise.optim.es import evolution_strategy
    from jaxnoise.parallel import population_mesh, sharded_fitness

    assert jax.device_count() == 8, jax.devices()
    data_seed = int(sys.argv[1])
    rng = np.random.default_rng(data_seed)
    x = jnp.asarray(rng.normal(size=(16, 5)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 3, size=16))
    model = nnx.Sequential(nnx.Linear(5, 16, rngs=nnx.Rngs(0)), nnx.LayerNorm(16, rngs=nnx.Rngs(1)),
                           nnx.relu, nnx.Linear(16, 3, rngs=nnx.Rngs(2)))
    graphdef, params0, rest = nnx.split(model, nnx.Param, ...)
    mesh = population_mesh()

    def loss(m):
      return -optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean()

    def run(shaping, sharded, steps):
      es = evolution_strategy(0.05, optax.adam(0.01), pop_size=64, fitness_shaping=shaping,
                              seed=data_seed)

      def evaluate(seeds, params):
        return es.evaluate(nnx.merge(graphdef, params, rest), seeds, loss)

      @jax.jit
      def fitness_of(params, state):
        seeds, _ = es.ask(state)
        if sharded:
          return sharded_fitness(evaluate, seeds, params, mesh=mesh, antithetic=True)
        return evaluate(seeds, params)

      @jax.jit
      def update(fitness, params, state):
        updates, state = es.update(fitness, state, nnx.merge(graphdef, params, rest))
        return optax.apply_updates(params, updates), state

      params, state, fitnesses = params0, es.init(model), []
      for _ in range(steps):
        fitness = fitness_of(params, state)
        fitnesses.append(np.asarray(fitness))
        params, state = update(fitness, params, state)
      return params, state, fitnesses, fitness_of, update, es

    def same_bits(a, b):
      return all(np.array_equal(np.asarray(u), np.asarray(v))
                 for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)))

    result = {}
    p1, s1, f1, _, _, es = run("centered_rank", False, 3)
    p8, s8, f8, fitness_of, update, _ = run("centered_rank", True, 3)
    result["fitness_max_abs_diff"] = max(float(np.abs(a - b).max()) for a, b in zip(f1, f8))
    result["steps_params_bit_exact"] = same_bits(p1, p8)
    result["steps_state_bit_exact"] = same_bits(s1, s8)

    # The update from one fitness vector, on mesh-replicated inputs vs one device.
    _, _, _, _, update_z, es_z = run("z_score", False, 0)
    state = es_z.init(model)
    fitness = jnp.asarray(f1[0])
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    on_mesh = update_z(*jax.device_put((fitness, params0, state), replicated))
    on_one = update_z(fitness, params0, state)
    result["update_bit_exact"] = same_bits(on_mesh, on_one)

    # Communication of the sharded evaluation: one all-gather of the fitness.
    hlo = fitness_of.lower(params0, es.init(model)).compile().as_text()
    collective = r"(all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)"
    result["collectives"] = sorted(set(re.findall(collective + r"(?:-start)?\\(", hlo)))
    result["all_gather_shapes"] = sorted(set(re.findall(r"= (\\S+) all-gather(?:-start)?\\(", hlo)))
    print("RESULT " + json.dumps(result))
""")


def test_sharded_es_step_equals_single_device(rng):
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu")
  completed = subprocess.run(
      [sys.executable, "-c", SCRIPT, str(int(rng.integers(0, 2**31)))],
      capture_output=True, text=True, timeout=300, env=env)
  assert completed.returncode == 0, completed.stderr[-4000:]
  line = [l for l in completed.stdout.splitlines() if l.startswith("RESULT ")][-1]
  result = json.loads(line[len("RESULT "):])
  assert result["fitness_max_abs_diff"] <= 1e-6, result
  assert result["update_bit_exact"], result
  assert result["steps_params_bit_exact"] and result["steps_state_bit_exact"], result
  assert result["collectives"] == ["all-gather"], result
  assert all(shape.startswith("f32[64]") for shape in result["all_gather_shapes"]), result


def test_one_device_mesh_equals_direct_evaluation(rng):
  mesh = population_mesh(jax.devices()[:1])
  seeds = jnp.asarray(rng.integers(0, 2**32, size=6, dtype=np.uint32))
  weights = jnp.asarray(rng.normal(size=3), jnp.float32)
  fitness_fn = lambda s, w: jnp.sum(w) * (s % 7).astype(jnp.float32)
  np.testing.assert_array_equal(sharded_fitness(fitness_fn, seeds, weights, mesh=mesh),
                                fitness_fn(seeds, weights))


def test_sharding_validation():
  mesh = population_mesh(jax.devices()[:1])
  fitness_fn = lambda s: s.astype(jnp.float32)
  with pytest.raises(ValueError, match="antithetic pairs would be split"):
    sharded_fitness(fitness_fn, jnp.arange(3), mesh=mesh, antithetic=True)
  with pytest.raises(ValueError, match="axis_name"):
    sharded_fitness(fitness_fn, jnp.arange(4), mesh=mesh, axis_name="batch")
  with pytest.raises(TypeError, match="Mesh"):
    sharded_fitness(fitness_fn, jnp.arange(4), mesh=jax.devices())
  with pytest.raises(ValueError, match="fitness_fn must return"):
    sharded_fitness(lambda s: jnp.zeros(()), jnp.arange(4), mesh=mesh)
  with pytest.raises(TypeError, match="seeds"):
    sharded_fitness(fitness_fn, jnp.ones(4), mesh=mesh)
