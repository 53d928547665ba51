"""Scaling of a whole ES generation over devices: replicated vs parameter-sharded update.

One generation, under one ``jax.jit``: ``ask``; ``sharded_fitness`` (the
population split over the mesh, fitness all-gathered); the update, either

* ``replicated``: ``es.update`` on replicated inputs (every device forms the
  whole gradient estimate: the documented step before issue 11), or
* ``sharded``: :func:`jaxnoise.parallel.sharded_update` (each device forms its
  rows of every leaf and runs Adam on them; the updates are all-gathered), or
* ``fsdp``: ``sharded_update(keep_sharded=True)``: parameters and Adam state
  stay split between generations (gathered for the evaluation only).

Efficiency = t(1 device) / (n * t(n devices)). Cases:

(a) the 784-1024-256-10 MLP (1.07M parameters), batch 32, antithetic, at
    ``--pops`` (default 65,536 and 262,144), each mode on 1 and n devices;
    also the largest difference between the sharded and the one-device update
    from the same fitness (``update_max_abs_diff``, 0 = bit-exact);
(b) optional: a transformer LM from ``benchmarks/lm_model.py`` if that file exists
    (it must define ``make_lm_case(quick) -> (model, fitness_fn, args)``);
(c) a wide MLP (rademacher noise, ``--big-pop`` individuals): ``--big-one-gb`` of
    parameters + Adam state on one device (timed on 1 and n), and ``--big-sharded-gb``
    on the mesh only with ``fsdp`` (too large for one device by design).

    python benchmarks/bench_scaling.py --out benchmarks/out            # all local GPUs
    python benchmarks/bench_scaling.py --quick --out /tmp/x            # CPU check (2 fake devices)
    # two processes, one GPU each (same machine; add hosts by giving each process its rank):
    python benchmarks/bench_scaling.py --processes 2 --out benchmarks/out

Writes ``<out>/scaling.json`` (process 0).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import math
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _parse(argv):
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true", help="tiny sizes on 2 fake CPU devices")
  parser.add_argument("--out", default="benchmarks/out")
  parser.add_argument("--budget", type=float, default=210.0, help="seconds; later cases skip")
  parser.add_argument("--pops", default="65536,262144")
  parser.add_argument("--modes", default="replicated,sharded,fsdp")
  parser.add_argument("--big-one-gb", type=float, default=40.0,
                      help="params + Adam state (12 B/param) of the largest single-device case")
  parser.add_argument("--big-sharded-gb", type=float, default=0.0,
                      help="params + Adam state of the sharded-only case (0: skip)")
  parser.add_argument("--big-pop", type=int, default=64)
  parser.add_argument("--processes", type=int, default=0,
                      help="launch this many processes, one device each (localhost coordinator)")
  parser.add_argument("--coordinator", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--process-id", type=int, default=None, help=argparse.SUPPRESS)
  return parser.parse_args(argv)


def _launch(args, argv):
  """Start ``args.processes`` copies of this script, one GPU each; wait for all."""
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
  rest, skip = [], False
  for arg in argv:  # everything but --processes N
    if skip or arg.startswith("--processes="):
      skip = False
      continue
    if arg == "--processes":
      skip = True
      continue
    rest.append(arg)
  procs = []
  for rank in range(args.processes):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(rank))
    if args.quick:
      env["JAX_PLATFORMS"] = "cpu"
    procs.append(subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), *rest, "--coordinator", f"127.0.0.1:{port}",
         "--process-id", str(rank), "--processes-in-run", str(args.processes)], env=env))
  codes = []
  try:
    for proc in procs:
      codes.append(proc.wait(timeout=max(60.0, args.budget * 3)))
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  return max(abs(c) for c in codes)


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  n_in_run = None
  if "--processes-in-run" in argv:
    position = argv.index("--processes-in-run")
    n_in_run = int(argv[position + 1])
    del argv[position:position + 2]
  args = _parse(argv)
  if args.processes and args.coordinator is None:
    sys.exit(_launch(args, argv))
  if args.quick and args.coordinator is None:
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jaxnoise.parallel as parallel  # pylint: disable=g-import-not-at-top
  if args.coordinator is not None:
    parallel.initialize_distributed(args.coordinator, n_in_run, args.process_id)
  run(args)


def run(args):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  import _harness  # pylint: disable=g-import-not-at-top
  import jaxnoise  # pylint: disable=g-import-not-at-top
  from jaxnoise import parallel  # pylint: disable=g-import-not-at-top

  lead = jax.process_index() == 0
  budget = _harness.Budget(args.budget)
  facts = _harness.device_facts()
  facts.update(devices=jax.device_count(), processes=jax.process_count())
  if lead:
    print(facts, flush=True)
  n = jax.device_count()
  meshes = {1: parallel.population_mesh(jax.devices()[:1])} if jax.process_count() == 1 else {}
  meshes[n] = parallel.population_mesh()
  results = []

  def make_mlp(sizes):
    layers = []
    for index, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
      layers.append(nnx.Linear(n_in, n_out, rngs=nnx.Rngs(index)))
      if index < len(sizes) - 2:
        layers.append(nnx.relu)
    return nnx.Sequential(*layers)

  def loss(model, x, y):
    return -optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

  def generation_case(model, fitness_fn, data, pop, mode, devices, kind="uniform"):
    mesh = meshes[devices]
    es = jaxnoise.optim.evolution_strategy(0.02, optax.adam(1e-3), pop_size=pop, kind=kind,
                                           layout=jaxnoise.nn.parameter_layout(model))
    graphdef, params = nnx.split(model, nnx.Param)
    # The step donates its parameters: copy, so the model's own arrays survive for
    # the next case (device_put to a sharding they already have would not copy).
    params = jax.tree.map(jnp.copy, params)
    n_params = sum(math.prod(p.shape) for p in jax.tree.leaves(params))
    state = es.init(model)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    if mode == "fsdp":
      split = parallel.parameter_shardings(es, params, mesh)
      params = parallel.shard_tree(params, split)
      state = parallel.shard_tree(state, parallel.state_shardings(state, params, split, mesh))
    else:
      params, state = parallel.shard_tree(
          (params, state), jax.tree.map(lambda _: replicated, (params, state)))
    data = parallel.shard_tree(data, jax.tree.map(lambda _: replicated, data))

    def evaluate(seeds, params, data):
      return es.evaluate(nnx.merge(graphdef, params), seeds, fitness_fn, *data)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, state, data):
      seeds, _ = es.ask(state)
      fitness = parallel.sharded_fitness(evaluate, seeds, params, data, mesh=mesh,
                                         antithetic=True)
      if mode == "replicated":
        updates, state = es.update(fitness, state, params)
      else:
        updates, state = parallel.sharded_update(es, fitness, state, params, mesh=mesh,
                                                 keep_sharded=mode == "fsdp")
      return optax.apply_updates(params, updates), state

    carry = [params, state]

    def call():
      carry[0], carry[1] = step(carry[0], carry[1], data)
      return carry[1].generation

    seconds = _harness.median_time(call, repeats=10, inner=1)
    return {"pop": pop, "n_params": n_params, "mode": mode, "devices": devices,
            "step_ms": 1e3 * seconds}

  def exactness_case(model, pop):
    """Sharded update vs one-device es.update from the same fitness (0.0: bit-exact)."""
    es = jaxnoise.optim.evolution_strategy(0.02, optax.adam(1e-3), pop_size=pop,
                                           layout=jaxnoise.nn.parameter_layout(model))
    params = nnx.state(model, nnx.Param)
    state = es.init(model)
    fitness = jax.random.normal(jax.random.key(5), (pop,), jnp.float32)
    mesh = meshes[n]
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    inputs = parallel.shard_tree((fitness, state, params),
                                 jax.tree.map(lambda _: replicated, (fitness, state, params)))
    sharded = jax.jit(lambda f, s, p: parallel.sharded_update(es, f, s, p, mesh=mesh))(*inputs)
    one = jax.jit(es.update)(*inputs) if 1 not in meshes else jax.jit(es.update)(
        fitness, state, params)
    diff = max(float(jnp.max(jnp.abs(jnp.asarray(a.addressable_data(0)) -
                                     jnp.asarray(b.addressable_data(0)))))
               for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(sharded)))
    return {"pop": pop, "update_max_abs_diff": diff, "bit_exact": diff == 0.0}

  def add(name, fn):
    _harness.run_case(results, name, fn, budget)

  # (a) the 1.07M-parameter MLP.
  if args.quick:
    sizes, pops, batch = (64, 32, 10), (64,), 8
  else:
    sizes, pops, batch = (784, 1024, 256, 10), tuple(int(p) for p in args.pops.split(",")), 32
  modes = args.modes.split(",")
  x = jax.random.normal(jax.random.key(1), (batch, sizes[0]), jnp.float32)
  y = jax.random.randint(jax.random.key(2), (batch,), 0, sizes[-1])
  mlp = make_mlp(sizes)
  add(f"mlp exactness pop={pops[0]}", functools.partial(exactness_case, mlp, pops[0]))
  for pop in pops:
    for mode in modes:
      for devices in sorted(meshes):
        if devices == 1 and mode != "replicated":
          continue  # on one device all modes are the same program
        add(f"mlp pop={pop} {mode} devices={devices}",
            functools.partial(generation_case, mlp, loss, (x, y), pop, mode, devices))

  # (b) optional transformer LM (benchmarks/lm_model.py, written separately).
  lm_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lm_model.py")
  if os.path.exists(lm_path):
    spec = importlib.util.spec_from_file_location("lm_model", lm_path)
    lm_model = importlib.util.module_from_spec(spec)
    sys.modules["lm_model"] = lm_model  # its dataclasses look their module up
    spec.loader.exec_module(lm_model)
  if os.path.exists(lm_path) and hasattr(lm_model, "make_lm_case"):
    lm, lm_fitness, lm_args = lm_model.make_lm_case(args.quick)
    for mode in modes:
      for devices in sorted(meshes):
        if devices == 1 and mode != "replicated":
          continue
        add(f"lm pop={pops[0]} {mode} devices={devices}",
            functools.partial(generation_case, lm, lm_fitness, tuple(lm_args), pops[0], mode,
                              devices))

  # (c) wide MLPs sized by parameters + Adam state (12 bytes per parameter).
  def wide(gb):
    if args.quick:
      return (64, 128, 128, 10)
    params = gb * (1 << 30) / 12
    width = int(math.sqrt(params) // 256 * 256)  # the width x width layer dominates
    return (1024, width, width, 10)

  big_batch = 4 if args.quick else 8
  if args.big_one_gb > 0:
    big = make_mlp(wide(args.big_one_gb))
    bx = jax.random.normal(jax.random.key(3), (big_batch, big.layers[0].in_features))
    by = jnp.zeros((big_batch,), jnp.int32)
    for devices in sorted(meshes):
      for mode in (["replicated"] if devices == 1 else ["replicated", "fsdp"][args.quick:]):
        add(f"wide one-device-size {args.big_one_gb} GB {mode} devices={devices}",
            functools.partial(generation_case, big, loss, (bx, by), args.big_pop, mode, devices,
                              "rademacher"))
    del big
  if args.big_sharded_gb > 0 and n > 1:
    big = make_mlp(wide(args.big_sharded_gb))
    bx = jax.random.normal(jax.random.key(3), (big_batch, big.layers[0].in_features))
    by = jnp.zeros((big_batch,), jnp.int32)
    add(f"wide sharded-only {args.big_sharded_gb} GB fsdp devices={n}",
        functools.partial(generation_case, big, loss, (bx, by), args.big_pop, "fsdp", n,
                          "rademacher"))

  # Efficiency against the one-device replicated step of the same case.
  base = {}
  for record in results:
    if record.get("devices") == 1 and "step_ms" in record:
      base[record["case"].rsplit(" devices=", 1)[0].rsplit(" ", 1)[0]] = record["step_ms"]
  for record in results:
    if "step_ms" in record and record.get("devices", 1) > 1:
      key = record["case"].rsplit(" devices=", 1)[0].rsplit(" ", 1)[0]
      if key in base:
        record["efficiency"] = base[key] / (record["devices"] * record["step_ms"])
  if lead:
    _harness.write_json(os.path.join(args.out, "scaling.json"), {"facts": facts,
                                                                  "results": results})
    print(_harness.table(results, ["case", "n_params", "step_ms", "efficiency",
                                   "update_max_abs_diff", "skipped", "error"]))


if __name__ == "__main__":
  main()
