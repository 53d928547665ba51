"""XLA's GPU compile of the kernels, without a GPU (issue 14's offline reproduction).

    python benchmarks/compile_offline.py --plugin PATH/xla_cuda_plugin.so [--only forward]

Each case of :mod:`compile_probe` is lowered for CUDA here (any jax, on CPU)
and compiled for an H200 (sm_90a) by the XLA of a PJRT CUDA plugin: a
*deviceless* compile (``PJRT_TopologyDescription_Create`` with a
``target_config``, then ``PJRT_Compile`` with no client) through the plugin's
C API and ctypes. That is the whole GPU compiler: XLA's HLO passes, its Triton
pipeline for each Pallas kernel, LLVM to PTX, and ``ptxas`` (found on
``PATH``; CUDA 13's for jax 0.11). Only the driver's work at the first call is
left out.

The plugin is ``jax_plugins/xla_cuda13/xla_cuda_plugin.so`` from the wheel
``jax-cuda13-pjrt`` (pure C ABI, so any Python can load it; ``pip download
--no-deps jax-cuda13-pjrt==0.11.2`` and unzip it). The struct offsets below
follow ``xla/pjrt/c/pjrt_c_api.h``, whose function table only ever grows at
its end.

Every compile runs in its own subprocess with a timeout, so a slow case is
recorded as ``> timeout`` and the rest go on. Prints one line per case and
writes ``compile_offline.json`` under ``$OUT`` (default ``benchmarks/out``).
The pipeline depth is chosen as on an H200 (227 KiB of shared memory), not
from this machine.

Found with it (2026-11-30, jax-cuda13-pjrt 0.11.2, ptxas 13.0): the forward
at offset 2**32 + 5 took 9.5 s (``uniform``) and 124 s (``normal``) against
1.0-1.7 s at offset 0, the H200's numbers; ``perf`` put 90% of it in MLIR
greedy rewrites of XLA's Triton pipeline over an IR grown far beyond the
kernel's 500 ops (see ``benchmarks/RESULTS.md``, "Compile time").
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import functools
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

# A GpuTargetConfigProto (text) for an H200: the H100 SXM spec of XLA's
# gpu_specs with the H200's memory and bandwidth.
H200_TARGET_CONFIG = """
gpu_device_info {
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: 4800000000000
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: 150000000000
  shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 }
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 10 patch: 0 }
device_description_str: "NVIDIA H200"
"""
H200_SHARED_MEMORY_OPTIN = 232448

# ---------------------------------------------------------------------------
# The PJRT C API, as much as a deviceless compile needs.

_P = ctypes.c_void_p
# Indices into PJRT_Api's function table (after struct_size, extension_start
# and the 24-byte PJRT_Api_Version).
_ERROR_MESSAGE, _PLUGIN_INITIALIZE, _TOPOLOGY_CREATE, _COMPILE = 1, 3, 82, 89


def _struct(name, fields):
  """A PJRT ``*_Args`` struct: its size and an extension pointer, then ``fields``."""
  return type(name, (ctypes.Structure,),
              {"_fields_": [("struct_size", ctypes.c_size_t), ("extension_start", _P)] + fields})


_ErrorMessage = _struct("ErrorMessage", [("error", _P), ("message", _P),
                                          ("message_size", ctypes.c_size_t)])
_Initialize = _struct("Initialize", [])
_NamedValue = _struct("NamedValue", [("name", ctypes.c_char_p), ("name_size", ctypes.c_size_t),
                                      ("type", ctypes.c_int), ("value", _P),
                                      ("value_size", ctypes.c_size_t)])
_TopologyCreate = _struct("TopologyCreate", [
    ("topology_name", ctypes.c_char_p), ("topology_name_size", ctypes.c_size_t),
    ("create_options", _P), ("num_options", ctypes.c_size_t), ("topology", _P)])
_Program = _struct("Program", [("code", ctypes.c_char_p), ("code_size", ctypes.c_size_t),
                                ("format", ctypes.c_char_p), ("format_size", ctypes.c_size_t)])
_Compile = _struct("Compile", [("topology", _P), ("program", _P),
                                ("compile_options", ctypes.c_char_p),
                                ("compile_options_size", ctypes.c_size_t), ("client", _P),
                                ("executable", _P)])


class DevicelessCompiler:
  """A PJRT GPU plugin compiling for a GPU described by a target config."""

  def __init__(self, plugin_path: str, target_config: str = H200_TARGET_CONFIG):
    self._lib = ctypes.CDLL(plugin_path, mode=ctypes.RTLD_GLOBAL)
    self._lib.GetPjrtApi.restype = _P
    self._api = self._lib.GetPjrtApi()
    self._call(_PLUGIN_INITIALIZE, _Initialize(ctypes.sizeof(_Initialize), None))
    keep = [b"target_config", target_config.encode(), b"topology", b"1x1x1"]
    options = (_NamedValue * 2)(*[
        _NamedValue(ctypes.sizeof(_NamedValue), None, keep[i], len(keep[i]), 0,
                    ctypes.cast(ctypes.c_char_p(keep[i + 1]), _P), len(keep[i + 1]))
        for i in (0, 2)])
    args = _TopologyCreate(ctypes.sizeof(_TopologyCreate), None, b"", 0,
                           ctypes.addressof(options), 2, None)
    self._call(_TOPOLOGY_CREATE, args)
    self._topology = args.topology

  def _function(self, index):
    address = ctypes.cast(self._api + 40 + 8 * index, ctypes.POINTER(_P))[0]
    return ctypes.CFUNCTYPE(_P, _P)(address)

  def _call(self, index, args):
    error = self._function(index)(ctypes.addressof(args))
    if error:
      message = _ErrorMessage(ctypes.sizeof(_ErrorMessage), None, error, None, 0)
      self._function(_ERROR_MESSAGE)(ctypes.addressof(message))
      raise RuntimeError(ctypes.string_at(message.message, message.message_size).decode(
          errors="replace"))

  def compile(self, module: bytes, compile_options: bytes) -> None:
    """Compiles StableHLO text or bytecode; raises RuntimeError with XLA's message."""
    program = _Program(ctypes.sizeof(_Program), None, module, len(module), b"mlir", 4)
    self._call(_COMPILE, _Compile(ctypes.sizeof(_Compile), None, self._topology,
                                  ctypes.addressof(program), compile_options,
                                  len(compile_options), None, None))


def _varint(value: int) -> bytes:
  out = bytearray()
  while True:
    byte, value = value & 0x7F, value >> 7
    out.append(byte | (0x80 if value else 0))
    if not value:
      return bytes(out)


def debug_option_bytes(fields: dict[int, bool]) -> bytes:
  """``DebugOptions`` booleans by field number, to append to a serialized CompileOptionsProto.

  The field numbers of the plugin's XLA (read from the descriptor inside its ``.so``): a
  flag newer than this machine's jaxlib cannot be set through jaxlib's options object,
  and the plugin reads no ``XLA_FLAGS``. A message field given twice is merged, so this
  is ``executable_build_options`` (3) holding ``debug_options`` (3) holding the fields.
  """
  if not fields:
    return b""
  if any(number < 1 for number in fields):
    raise ValueError(f"DebugOptions field numbers are positive, got {sorted(fields)}")
  inner = b"".join(_varint(number << 3) + _varint(int(value))
                   for number, value in sorted(fields.items()))
  message = lambda number, payload: _varint(number << 3 | 2) + _varint(len(payload)) + payload  # noqa: E731
  return message(3, message(3, inner))


def optimized_module(plugin_path: str, lowered, debug_fields: dict[int, bool] | None = None
                     ) -> str:
  """XLA's optimised HLO module (text) for ``lowered`` (a ``jax.stages.Lowered`` for CUDA),
  compiled deviceless by the plugin at ``plugin_path``, with the ``DebugOptions`` booleans
  ``debug_fields`` (field number -> value, see :func:`debug_option_bytes`)."""
  from jax._src import compiler  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as directory:
    options = compiler.get_compile_options(num_replicas=1, num_partitions=1)
    options.executable_build_options.debug_options.xla_dump_to = directory
    DevicelessCompiler(plugin_path).compile(
        lowered.as_text().encode(),
        options.SerializeAsString() + debug_option_bytes(debug_fields or {}))
    (optimized,) = pathlib.Path(directory).glob("*gpu_after_optimizations.txt")
    return optimized.read_text()


def optimized_entry(plugin_path: str, lowered, debug_fields: dict[int, bool] | None = None
                    ) -> str:
  """The ENTRY computation of :func:`optimized_module`."""
  return optimized_module(plugin_path, lowered, debug_fields).split("\nENTRY ", 1)[1]


# ---------------------------------------------------------------------------
# Cases.


def _cases(only):
  """compile_probe's cases, plus the forward's old transposed noise tile for comparison."""
  import compile_probe  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.virtual_noise import config as vn_config  # pylint: disable=g-import-not-at-top
  out = list(compile_probe.cases(only))
  for name, fn, kwargs in list(out):
    if name.startswith("forward "):
      x = kwargs["x"]
      base = vn_config.perturbed_linear_heuristics(x.shape[-2], kwargs["weight"].shape[0],
                                                   x.shape[-1], fn.keywords["kind"], 1)
      old = dataclasses.replace(base, transposed_noise=False)
      out.append((name.replace("forward", "forward transposed_noise=False"),
                  functools.partial(fn, config=old), kwargs))
  return out


@contextlib.contextmanager
def traced_as_on_a_gpu():
  """While tracing, ``jax.default_backend()`` says ``"gpu"``: the library's ops then take
  their GPU paths (``implementation="auto"`` and ``"pallas"`` resolve to the kernels) on a
  machine without one, to be lowered for CUDA."""
  import jax  # pylint: disable=g-import-not-at-top
  real = jax.default_backend
  jax.default_backend = lambda: "gpu"
  try:
    yield
  finally:
    jax.default_backend = real


def _lower(cases, directory: pathlib.Path):
  import jax  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops import _pallas  # pylint: disable=g-import-not-at-top
  # Pipeline depths as on an H200, whatever this machine has (restored after).
  machine = _pallas.max_shared_memory_per_block
  _pallas.max_shared_memory_per_block = lambda: H200_SHARED_MEMORY_OPTIN
  files = {}
  try:
    for name, fn, kwargs in cases:
      with traced_as_on_a_gpu():
        lowered = jax.jit(lambda kw, fn=fn: fn(**kw)).trace(kwargs).lower(
            lowering_platforms=("cuda",))
      path = directory / (name.replace(" ", "_").replace("=", "") + ".mlir")
      path.write_text(lowered.as_text())
      files[name] = path
  finally:
    _pallas.max_shared_memory_per_block = machine
  return files


def _compile_options(directory: pathlib.Path) -> pathlib.Path:
  from jax._src import compiler  # pylint: disable=g-import-not-at-top
  options = compiler.get_compile_options(num_replicas=1, num_partitions=1)
  path = directory / "compile_options.pb"
  path.write_bytes(options.SerializeAsString())
  return path


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--plugin", required=True, help="xla_cuda_plugin.so of jax-cuda13-pjrt")
  parser.add_argument("--only", default="", help="comma-separated ops (first word of a case)")
  parser.add_argument("--timeout-s", type=float, default=60.0, help="per compile")
  parser.add_argument("--compile-one", nargs=2, metavar=("MODULE", "OPTIONS"),
                      help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.compile_one:
    compiler = DevicelessCompiler(args.plugin)
    module, options = (pathlib.Path(p).read_bytes() for p in args.compile_one)
    start = time.perf_counter()
    compiler.compile(module, options)
    print(f"COMPILE_S {time.perf_counter() - start:.3f}")
    return

  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  here = pathlib.Path(__file__).resolve().parent
  sys.path[:0] = [str(here), str(here.parent)]
  out_dir = pathlib.Path(os.environ.get("OUT", "benchmarks/out"))
  modules = out_dir / "compile_offline_modules"
  modules.mkdir(parents=True, exist_ok=True)
  files = _lower(_cases(set(filter(None, args.only.split(",")))), modules)
  options = _compile_options(modules)
  results = {}
  for name, path in files.items():
    command = [sys.executable, __file__, "--plugin", args.plugin, "--compile-one", str(path),
               str(options)]
    start = time.perf_counter()
    try:
      done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout_s,
                            check=False)
      wall = time.perf_counter() - start
      lines = [l for l in done.stdout.splitlines() if l.startswith("COMPILE_S")]
      if lines:
        results[name] = {"compile_s": float(lines[-1].split()[1]), "process_s": wall}
      else:
        results[name] = {"error": (done.stderr or done.stdout)[-600:], "process_s": wall}
    except subprocess.TimeoutExpired:
      results[name] = {"timeout_s": args.timeout_s}
    entry = results[name]
    summary = (f"compile {entry['compile_s']:7.2f} s" if "compile_s" in entry else
               f"> {args.timeout_s:.0f} s" if "timeout_s" in entry else
               "error " + entry["error"].strip().splitlines()[-1][:150])
    print(f"{name:<64} {summary}", flush=True)
  (out_dir / "compile_offline.json").write_text(json.dumps(
      {"plugin": args.plugin, "target": "H200 (sm_90a)", "cases": results}, indent=2))
  slow = [n for n, e in results.items() if e.get("compile_s", float("inf")) > 5]
  print(f"wrote {out_dir / 'compile_offline.json'}; over 5 s or failed: {slow or 'none'}")


if __name__ == "__main__":
  main()
