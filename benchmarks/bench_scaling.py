"""Scaling of a whole ES generation over devices, and its bit-exactness.

One generation, under one ``jax.jit``: ``ask``; the population's evaluation;
the update, either

* ``replicated``: ``es.update`` on replicated inputs (every device forms the
  whole gradient estimate: the documented step before issue 11), or
* ``sharded``: :func:`jaxnoise.parallel.sharded_update` (each device forms its
  rows of every leaf and runs Adam on them; the updates are all-gathered), or
* ``fsdp``: ``sharded_update(keep_sharded=True)``: parameters and Adam state
  stay split between generations, gathered whole for the evaluation
  (:func:`~jaxnoise.parallel.sharded_fitness`), or
* ``fsdp_eval``: the same, evaluated by :func:`~jaxnoise.parallel.sharded_evaluate`
  (each linear kernel gathered just before its layer runs).

Efficiency = t(1 device) / (n * t(n devices)). Cases (``--cases``):

``exact``  the sharded update (and the parameters after ``optax.apply_updates``)
           against ``es.update`` on one device from one fitness vector, for the
           784-1024-256-10 MLP, full rank and rank 1, SGD and Adam:
           ``max_abs_diff`` (0.0 and ``bit_exact``: equal bit for bit);
``mlp``    that MLP (1.07M parameters), batch 32, antithetic, at ``--pops``, each
           mode on 1 and n devices;
``lm``     the byte-level transformer LM of ``benchmarks/lm_model.py`` (12.9M
           parameters, rank-1 noise) at ``--lm-pops``: on one device as
           ``bench_lm.py`` runs it, on n devices with ``sharded_fitness`` (each
           device evaluates its members in chunks) and ``sharded_update``;
``wide``   a wide MLP with ``--big-one-gb`` of parameters + Adam state on 1 and n
           devices (as in the 2026-11-30 run);
``deep``   deep MLPs of ``--deep-width``-wide float32 layers without biases
           (rademacher noise, SGD, population ``--deep-pop``): the largest that fits one device
           (timed on 1 device and FSDP on n), and one that fits only sharded
           (timed with ``fsdp_eval`` on n devices; on one device it must run out
           of memory, and that is recorded). Layer counts come from XLA's memory
           analysis of 1- and 2-layer programs, extrapolated (or
           ``--deep-layers-one`` / ``--deep-layers-sharded``).

    python benchmarks/bench_scaling.py --out benchmarks/out            # all local GPUs
    python benchmarks/bench_scaling.py --quick --out /tmp/x            # CPU check (2 fake devices)
    # two processes, one GPU each (same machine; add hosts by giving each process its rank):
    python benchmarks/bench_scaling.py --processes 2 --cases mlp --out benchmarks/out

Writes ``<out>/scaling.json`` (process 0) after every case.
"""

from __future__ import annotations

import argparse
import functools
import gc
import math
import os
import socket
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CASES = ("exact", "mlp", "lm", "wide", "deep")


def _parse(argv):
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true", help="tiny sizes on 2 fake CPU devices")
  parser.add_argument("--out", default="benchmarks/out")
  parser.add_argument("--budget", type=float, default=300.0, help="seconds; later cases skip")
  parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated of {CASES}")
  parser.add_argument("--pops", default="65536,262144")
  parser.add_argument("--modes", default="replicated,sharded,fsdp,fsdp_eval")
  parser.add_argument("--exact-pop", type=int, default=16384)
  parser.add_argument("--lm-pops", default="16384,65536")
  parser.add_argument("--lm-tokens-per-chunk", type=int, default=1 << 20)
  parser.add_argument("--big-one-gb", type=float, default=0.0,
                      help="wide case: params + Adam state (12 B/param) on one device (0: skip)")
  parser.add_argument("--big-pop", type=int, default=64)
  parser.add_argument("--deep-width", type=int, default=32768,
                      help="width of the deep MLPs (a layer has width**2 < 2**31 elements)")
  parser.add_argument("--deep-pop", type=int, default=8)
  parser.add_argument("--deep-layers-one", type=int, default=0, help="0: from memory analysis")
  parser.add_argument("--deep-layers-sharded", type=int, default=0,
                      help="0: from memory analysis")
  parser.add_argument("--deep-fill", type=float, default=0.85,
                      help="fraction of a device's memory the chosen deep models may need")
  parser.add_argument("--repeats", type=int, default=10, help="timed steps per mlp case")
  parser.add_argument("--processes", type=int, default=0,
                      help="launch this many processes, one device each (localhost coordinator)")
  parser.add_argument("--coordinator", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--process-id", type=int, default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  unknown = set(args.cases.split(",")) - set(CASES)
  if unknown:
    parser.error(f"unknown cases {sorted(unknown)}; choose from {CASES}")
  return args


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


def with_host_devices(flags: str, count: int) -> str:
  """``flags`` with ``count`` CPU devices asked for, unless they already ask for a number.

  Other flags are kept (``--quick`` on a machine whose ``XLA_FLAGS`` sets, say, a dump
  directory still gets its two devices).
  """
  if "xla_force_host_platform_device_count" in flags:
    return flags
  return f"{flags} --xla_force_host_platform_device_count={count}".strip()


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
    os.environ["XLA_FLAGS"] = with_host_devices(os.environ.get("XLA_FLAGS", ""), 2)
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
  import lm_model  # pylint: disable=g-import-not-at-top
  from jaxnoise import parallel  # pylint: disable=g-import-not-at-top

  P = jax.sharding.PartitionSpec
  lead = jax.process_index() == 0
  one_process = jax.process_count() == 1
  budget = _harness.Budget(args.budget)
  facts = _harness.device_facts()
  facts.update(devices=jax.device_count(), processes=jax.process_count())
  if lead:
    print(facts, flush=True)
  n = jax.device_count()
  meshes = {1: parallel.population_mesh(jax.devices()[:1])} if one_process else {}
  meshes[n] = parallel.population_mesh()
  cases = set(args.cases.split(","))
  results = []

  def save():
    if lead:
      _harness.write_json(os.path.join(args.out, "scaling.json"),
                          {"facts": facts, "results": results})

  def add(name, fn, **tags):
    record = _harness.run_case(results, name, fn, budget)
    if record is not None:
      record.update(tags)
    gc.collect()
    save()
    return record

  def replicate(tree, mesh):
    return parallel.shard_tree(tree, jax.tree.map(lambda _: jax.sharding.NamedSharding(mesh, P()),
                                                  tree))

  def make_mlp(sizes, use_bias=True):
    layers = []
    for index, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
      layers.append(nnx.Linear(n_in, n_out, use_bias=use_bias, rngs=nnx.Rngs(index)))
      if index < len(sizes) - 2:
        layers.append(nnx.relu)
    return nnx.Sequential(*layers)

  def loss(model, x, y):
    return -optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

  def time_step(step, carry, data, repeats):
    def call():
      carry[0], carry[1] = step(carry[0], carry[1], *data)
      return carry[1].generation
    return _harness.median_time(call, repeats=repeats, inner=1, warmup=1 if repeats < 5 else 2)

  def generation_case(model, fitness_fn, data, pop, mode, devices, kind="uniform",
                      optimizer=None, repeats=None):
    mesh = meshes[devices]
    es = jaxnoise.optim.evolution_strategy(0.02, optimizer or optax.adam(1e-3), pop_size=pop,
                                           kind=kind, layout=jaxnoise.nn.parameter_layout(model))
    graphdef, params = nnx.split(model, nnx.Param)
    # The step donates its parameters: copy, so the model's own arrays survive for
    # the next case (device_put to a sharding they already have would not copy).
    params = jax.tree.map(jnp.copy, params)
    n_params = sum(math.prod(p.shape) for p in jax.tree.leaves(params))
    state = es.init(model)
    if mode in ("fsdp", "fsdp_eval"):
      split = parallel.parameter_shardings(es, model, mesh)
      params = parallel.shard_tree(params, split)
      state = parallel.shard_tree(state, parallel.state_shardings(state, params, split, mesh))
    else:
      params, state = replicate((params, state), mesh)
    data = replicate(data, mesh)

    def evaluate(seeds, params, data):
      return es.evaluate(nnx.merge(graphdef, params), seeds, fitness_fn, *data)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, state, *data):
      seeds, _ = es.ask(state)
      if mode == "fsdp_eval":
        fitness = parallel.sharded_evaluate(es, nnx.merge(graphdef, params), seeds, fitness_fn,
                                            *data, mesh=mesh)
      else:
        fitness = parallel.sharded_fitness(evaluate, seeds, params, data, mesh=mesh,
                                           antithetic=True)
      if mode == "replicated":
        updates, state = es.update(fitness, state, params)
      else:
        updates, state = parallel.sharded_update(es, fitness, state, params, mesh=mesh,
                                                 keep_sharded=mode != "sharded")
      return optax.apply_updates(params, updates), state

    seconds = time_step(step, [params, state], data, repeats or args.repeats)
    return {"pop": pop, "n_params": n_params, "mode": mode, "devices": devices,
            "step_ms": 1e3 * seconds}

  # (a) Bit-exactness of the sharded update.
  sizes, pops, batch = (((64, 32, 10), (64,), 8) if args.quick else
                        ((784, 1024, 256, 10), tuple(int(p) for p in args.pops.split(",")), 32))
  x = jax.random.normal(jax.random.key(1), (batch, sizes[0]), jnp.float32)
  y = jax.random.randint(jax.random.key(2), (batch,), 0, sizes[-1])
  mlp = make_mlp(sizes)

  def exactness_case(model, pop, rank, optimizer_name, keep_sharded):
    optimizer = optax.adam(1e-3) if optimizer_name == "adam" else optax.sgd(0.05, momentum=0.9)
    es = jaxnoise.optim.evolution_strategy(
        0.02, optimizer, pop_size=pop, rank=rank, weight_decay=1e-4, fitness_shaping="z_score",
        layout=jaxnoise.nn.parameter_layout(model, rank=rank))
    params = nnx.state(model, nnx.Param)
    state = es.init(model)
    fitness = jax.random.normal(jax.random.key(5), (pop,), jnp.float32)
    mesh = meshes[n]

    def with_params(update):
      def step(fitness, state, params):
        updates, state = update(fitness, state, params)
        return updates, state, optax.apply_updates(params, updates)
      return jax.jit(step)

    one = with_params(es.update)(fitness, state, params)
    p, s = replicate((params, state), mesh)
    if keep_sharded:
      split = parallel.parameter_shardings(es, model, mesh)
      p = parallel.shard_tree(params, split)
      s = parallel.shard_tree(state, parallel.state_shardings(state, params, split, mesh))
    sharded = with_params(lambda f, s, p: parallel.sharded_update(
        es, f, s, p, mesh=mesh, keep_sharded=keep_sharded))(replicate(fitness, mesh), s, p)
    diffs = {}
    for name, a, b in zip(("updates", "state", "params"), one, sharded):
      pairs = [(np.asarray(u), np.asarray(v)) for u, v in zip(jax.tree.leaves(a),
                                                                jax.tree.leaves(b))]
      diffs[name] = max((float(np.max(np.abs(u.astype(np.float64) - v.astype(np.float64)),
                                      initial=0.0)) for u, v in pairs if u.dtype.kind == "f"),
                        default=0.0)
      diffs[name + "_bit_exact"] = all(np.array_equal(u, v) for u, v in pairs)
    return {"pop": pop, "rank": rank, "optimizer": optimizer_name, "devices": n,
            "keep_sharded": keep_sharded, "update_max_abs_diff": diffs["updates"],
            "params_max_abs_diff": diffs["params"], "state_max_abs_diff": diffs["state"],
            "bit_exact": diffs["updates_bit_exact"] and diffs["params_bit_exact"]
                         and diffs["state_bit_exact"]}

  if "exact" in cases and one_process and n > 1:
    exact_pop = 64 if args.quick else args.exact_pop
    combos = ([(None, "sgd"), (1, "adam")] if args.quick else
              [(rank, name) for rank in (None, 1) for name in ("sgd", "adam")])
    for rank, optimizer_name in combos:
      add(f"exactness mlp pop={exact_pop} rank={rank} {optimizer_name}",
          functools.partial(exactness_case, mlp, exact_pop, rank, optimizer_name,
                            optimizer_name == "adam"))

  # (b) The 1.07M-parameter MLP.
  if "mlp" in cases:
    for pop in pops:
      for mode in args.modes.split(","):
        for devices in sorted(meshes):
          if devices == 1 and mode != "replicated":
            continue  # on one device all modes are the same program
          add(f"mlp pop={pop} {mode} devices={devices}",
              functools.partial(generation_case, mlp, loss, (x, y), pop, mode, devices),
              group=f"mlp pop={pop}")

  # (c) The byte-level transformer LM, rank 1.
  def lm_case(pop, devices):
    config = (lm_model.LMConfig(context=8, d_model=16, num_layers=1, num_heads=2) if args.quick
              else lm_model.LMConfig())
    model = lm_model.TransformerLM(config, rngs=nnx.Rngs(0))
    es = jaxnoise.optim.evolution_strategy(
        0.01, optax.adam(1e-3), pop_size=pop, rank=1,
        layout=jaxnoise.nn.parameter_layout(model, rank=1))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    state = es.init(model)
    mesh = meshes[devices]
    sequences = jax.random.randint(jax.random.key(1), (1, config.context + 1), 0,
                                   config.vocab_size, jnp.int32)
    tokens_per_chunk = 32 if args.quick else args.lm_tokens_per_chunk
    chunk = lm_model.chunk_members(pop // devices, config.context, tokens_per_chunk)
    params, rest, state, sequences = replicate((params, rest, state, sequences), mesh)

    def fitness_fn(member, sequences):
      return -lm_model.next_byte_loss(member, sequences)

    def evaluate(seeds, params, rest, sequences):
      return lm_model.chunked_population_fitness(es, nnx.merge(graphdef, params, rest), seeds,
                                                 fitness_fn, sequences, chunk=chunk)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, state, rest, sequences):
      seeds, _ = es.ask(state)
      if devices == 1:  # bench_lm.py's step
        updates, state = es.update(evaluate(seeds, params, rest, sequences), state, params)
      else:
        fitness = parallel.sharded_fitness(evaluate, seeds, params, rest, sequences, mesh=mesh,
                                           antithetic=True)
        updates, state = parallel.sharded_update(es, fitness, state, params, mesh=mesh)
      return optax.apply_updates(params, updates), state

    seconds = time_step(step, [params, state], (rest, sequences), 3)
    return {"pop": pop, "rank": 1, "devices": devices, "chunk": chunk,
            "n_params": lm_model.count_params(model), "step_ms": 1e3 * seconds,
            "tokens_per_s": pop * config.context / seconds}

  if "lm" in cases:
    for pop in ((8,) if args.quick else tuple(int(p) for p in args.lm_pops.split(","))):
      for devices in sorted(meshes):
        add(f"lm rank=1 pop={pop} devices={devices}", functools.partial(lm_case, pop, devices),
            group=f"lm rank=1 pop={pop}")

  # (d) Wide MLP sized by parameters + Adam state (the 2026-11-30 case).
  if "wide" in cases and args.big_one_gb > 0:
    if args.quick:
      wide_sizes = (64, 128, 128, 10)
    else:
      width = int(math.sqrt(args.big_one_gb * (1 << 30) / 12) // 256 * 256)
      wide_sizes = (1024, width, width, 10)
    big = make_mlp(wide_sizes)
    bx = jax.random.normal(jax.random.key(3), (8, wide_sizes[0]))
    by = jnp.zeros((8,), jnp.int32)
    for devices in sorted(meshes):
      for mode in (["replicated"] if devices == 1 else ["replicated", "fsdp"]):
        add(f"wide one-device-size {args.big_one_gb} GB {mode} devices={devices}",
            functools.partial(generation_case, big, loss, (bx, by), args.big_pop, mode, devices,
                              "rademacher"), group=f"wide {args.big_one_gb} GB")
    del big

  # (e) Deep MLPs: the largest that fits one device, and one that fits only sharded.
  deep_width = 64 if args.quick else args.deep_width
  deep_in, deep_batch = (32, 4) if args.quick else (1024, 8)

  def deep_sizes(layers):
    return (deep_in,) + (deep_width,) * (layers + 1) + (10,)

  def deep_step(es, graphdef, mesh, fsdp):
    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, state, x, y):
      seeds, _ = es.ask(state)
      if fsdp:
        fitness = parallel.sharded_evaluate(es, nnx.merge(graphdef, params), seeds, loss, x, y,
                                            mesh=mesh)
        updates, state = parallel.sharded_update(es, fitness, state, params, mesh=mesh,
                                                 keep_sharded=True)
      else:
        updates, state = es.update(es.evaluate(nnx.merge(graphdef, params), seeds, loss, x, y),
                                   state, params)
      return optax.apply_updates(params, updates), state
    return step

  def deep_setup(layers, devices, fsdp):
    """Abstract model, ES, shardings and step of a deep MLP (nothing allocated)."""
    # No biases: fewer leaves, so fewer kernels to compile for the same size.
    model = nnx.eval_shape(lambda: make_mlp(deep_sizes(layers), use_bias=False))
    es = jaxnoise.optim.evolution_strategy(
        0.02, optax.sgd(1e-3), pop_size=args.deep_pop, kind="rademacher",
        layout=jaxnoise.nn.parameter_layout(model))
    graphdef, params = nnx.split(model, nnx.Param)
    mesh = meshes[devices]
    shardings = (parallel.parameter_shardings(es, model, mesh) if fsdp else
                 jax.tree.map(lambda _: jax.sharding.NamedSharding(mesh, P()), params))
    return es, graphdef, params, shardings, mesh, deep_step(es, graphdef, mesh, fsdp)

  def deep_data(mesh):
    bx = jax.random.normal(jax.random.key(3), (deep_batch, deep_in))
    return replicate((bx, jnp.zeros((deep_batch,), jnp.int32)), mesh)

  def device_bytes(layers, devices, fsdp):
    """Bytes one device needs for the step (XLA's memory analysis; nothing allocated)."""
    es, _, params, shardings, mesh, step = deep_setup(layers, devices, fsdp)
    abstract = jax.tree.map(lambda p, s: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=s),
                            params, shardings)
    state = jax.eval_shape(es.init, params)
    replicated = jax.sharding.NamedSharding(mesh, P())
    state = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated),
                         state)
    data = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated),
                        jax.eval_shape(lambda: deep_data(mesh)))
    memory = step.lower(abstract, state, *data).compile().memory_analysis()
    return (memory.argument_size_in_bytes + memory.output_size_in_bytes
            + memory.temp_size_in_bytes - memory.alias_size_in_bytes)

  def device_limit():
    if args.quick:
      return 1 << 18  # a pretend 256 KiB device: a few 64-wide layers
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("bytes_limit", 141 * 10**9)

  def layers_for(devices, fsdp, fill):
    """Most layers whose step needs at most ``fill`` of a device (linear in the layers)."""
    one, two = device_bytes(1, devices, fsdp), device_bytes(2, devices, fsdp)
    per_layer = max(1, two - one)
    return max(1, int((fill * device_limit() - (one - per_layer)) // per_layer)), one, per_layer

  def deep_case(layers, devices, fsdp, expect_oom=False):
    es, graphdef, params, shardings, mesh, step = deep_setup(layers, devices, fsdp)
    n_params = sum(math.prod(p.shape) for p in jax.tree.leaves(params))
    record = {"layers": layers, "width": deep_width, "n_params": n_params,
              "param_gb": 4 * n_params / 1e9, "devices": devices,
              "mode": "fsdp_eval" if fsdp else "replicated", "pop": args.deep_pop,
              "device_limit_gb": device_limit() / 1e9}
    scale = 1.0 / math.sqrt(deep_width)

    @functools.partial(jax.jit, out_shardings=shardings)
    def init():  # generated in place, shard by shard (never whole on one device)
      keys = jax.random.split(jax.random.key(0), len(jax.tree.leaves(params)))
      leaves = [scale * jax.random.normal(k, p.shape, p.dtype)
                for k, p in zip(keys, jax.tree.leaves(params))]
      return jax.tree.unflatten(jax.tree.structure(params), leaves)

    try:
      real = init()
      state = jax.tree.map(lambda a: jax.device_put(a, jax.sharding.NamedSharding(mesh, P())),
                           es.init(real))
      seconds = time_step(step, [real, state], deep_data(mesh), 3)
    except Exception as error:  # pylint: disable=broad-except
      text = f"{type(error).__name__}: {error}"
      oom = "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()
      if not (expect_oom and oom):
        raise
      record.update(oom=True, error_text=text[:500])
      return record
    record.update(step_ms=1e3 * seconds, oom=False)
    peak = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
    if peak is not None:
      record["device0_peak_gb"] = peak / 1e9
    return record

  if "deep" in cases and one_process and n > 1:
    picks = {}

    def pick():
      one_layers = args.deep_layers_one or layers_for(1, False, args.deep_fill)[0]
      sharded_layers, base, per_layer = (args.deep_layers_sharded, None, None)
      if not sharded_layers:
        sharded_layers, base, per_layer = layers_for(n, True, args.deep_fill)
      picks.update(one=one_layers, sharded=sharded_layers)
      return {"layers_one_device": one_layers, "layers_sharded": sharded_layers,
              "sharded_base_gb": None if base is None else base / 1e9,
              "sharded_per_layer_gb": None if per_layer is None else per_layer / 1e9,
              "device_limit_gb": device_limit() / 1e9}

    if add("deep pick sizes (memory analysis)", pick) and picks:
      only = f"deep sharded-only layers={picks['sharded']}"
      add(f"{only} devices={n}", functools.partial(deep_case, picks["sharded"], n, True))
      add(f"{only} devices=1 (must run out of memory)",
          functools.partial(deep_case, picks["sharded"], 1, False, expect_oom=True))
      largest = f"deep largest-one-device layers={picks['one']}"
      add(f"{largest} devices=1", functools.partial(deep_case, picks["one"], 1, False),
          group=largest)
      add(f"{largest} devices={n}", functools.partial(deep_case, picks["one"], n, True),
          group=largest)

  # Efficiency against the one-device step of the same group.
  base = {r["group"]: r["step_ms"] for r in results
          if r.get("devices") == 1 and "step_ms" in r and "group" in r}
  for record in results:
    if "step_ms" in record and record.get("devices", 1) > 1 and record.get("group") in base:
      record["efficiency"] = base[record["group"]] / (record["devices"] * record["step_ms"])
  save()
  if lead:
    print(_harness.table(results, ["case", "n_params", "step_ms", "efficiency",
                                   "update_max_abs_diff", "bit_exact", "param_gb",
                                   "device0_peak_gb", "oom", "skipped", "error"]))


if __name__ == "__main__":
  main()
