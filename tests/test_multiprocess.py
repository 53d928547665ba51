"""Two CPU processes under jax.distributed give the parameters of one process.

Each process runs the same script (the README's launch recipe): it calls
``jaxnoise.parallel.initialize_distributed`` with a localhost coordinator on a
free port, builds the mesh over both processes' devices, and runs three ES
generations with ``sharded_fitness`` and ``sharded_update`` (gloo
collectives). One process with one device runs the plain ``es.update``
steps; the parameters must agree bit for bit: the parameter-sharded update
equals the one-device update by construction (``jaxnoise.parallel``,
"Exactness"), and the centered ranks do not see a last-bit difference in a
fitness evaluated on half the population.
Select with ``pytest -k multiprocess``.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent("""
    import json, sys
    import jaxnoise.parallel as parallel
    mode = sys.argv[1]
    if mode == "multi":
      parallel.initialize_distributed(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    import jax, jax.numpy as jnp, numpy as np, optax
    from flax import nnx
    import jaxnoise
    x = jnp.asarray(np.random.default_rng(0).normal(size=(16, 5)), jnp.float32)
    y = jnp.asarray(np.random.default_rng(1).integers(0, 3, size=16))
    model = nnx.Sequential(nnx.Linear(5, 16, rngs=nnx.Rngs(0)), nnx.relu,
                           nnx.Linear(16, 4, rngs=nnx.Rngs(2)))
    graphdef, params = nnx.split(model, nnx.Param)
    es = jaxnoise.optim.evolution_strategy(0.05, optax.adam(0.01), pop_size=64,
                                           layout=jaxnoise.nn.parameter_layout(model))
    state = es.init(model)

    def evaluate(seeds, params):
      return es.evaluate(nnx.merge(graphdef, params), seeds,
                         lambda m: -optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean())

    if mode == "multi":
      mesh = parallel.population_mesh()

      @jax.jit
      def step(params, state):
        seeds, _ = es.ask(state)
        fitness = parallel.sharded_fitness(evaluate, seeds, params, mesh=mesh, antithetic=True)
        updates, state = parallel.sharded_update(es, fitness, state, params, mesh=mesh)
        return optax.apply_updates(params, updates), state
      replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
      params, state = parallel.shard_tree((params, state), jax.tree.map(lambda _: replicated, (params, state)))
    else:
      @jax.jit
      def step(params, state):
        seeds, _ = es.ask(state)
        updates, state = es.update(evaluate(seeds, params), state, params)
        return optax.apply_updates(params, updates), state
    for _ in range(3):
      params, state = step(params, state)
    leaves = [np.asarray(leaf.addressable_data(0)).tolist() for leaf in jax.tree.leaves(params)]
    print("RESULT " + json.dumps({"devices": jax.device_count(), "processes": jax.process_count(),
                                  "params": leaves}))
""")


def _free_port():
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def _result(stdout):
  line = [l for l in stdout.splitlines() if l.startswith("RESULT ")][-1]
  return json.loads(line[len("RESULT "):])


def test_multiprocess_two_cpu_processes_equal_one_process():
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  env.pop("XLA_FLAGS", None)
  address = f"127.0.0.1:{_free_port()}"
  processes = [subprocess.Popen([sys.executable, "-c", SCRIPT, "multi", address, "2", str(rank)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
               for rank in range(2)]
  outputs = []
  try:
    for process in processes:
      stdout, stderr = process.communicate(timeout=240)
      assert process.returncode == 0, stderr[-4000:]
      outputs.append(_result(stdout))
  finally:
    for process in processes:
      if process.poll() is None:
        process.kill()
        process.wait()
  single = subprocess.run([sys.executable, "-c", SCRIPT, "single"], capture_output=True,
                          text=True, env=env, timeout=240)
  assert single.returncode == 0, single.stderr[-4000:]
  one = _result(single.stdout)
  assert one["devices"] == 1
  for output in outputs:
    assert output["processes"] == 2 and output["devices"] == 2, output
    for a, b in zip(output["params"], one["params"]):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert outputs[0]["params"] == outputs[1]["params"]
