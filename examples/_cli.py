"""Command-line helpers shared by the example scripts (not part of the library)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence


def apply_quick_defaults(args: argparse.Namespace, argv: Sequence[str] | None,
                         defaults: Mapping[str, object]) -> None:
  """With ``--quick``, set each ``--option: value`` of ``defaults`` the user did not give."""
  if not args.quick:
    return
  given = set(argv if argv is not None else sys.argv[1:])
  for option, value in defaults.items():
    if option not in given:
      setattr(args, option[2:].replace("-", "_"), value)


def check_population_and_counts(parser: argparse.ArgumentParser, args: argparse.Namespace,
                                counts: Sequence[str]) -> None:
  """``--pop`` even and >= 2 (antithetic pairs); each of ``counts`` (dest names) >= 1."""
  if args.pop < 2 or args.pop % 2:
    parser.error(f"--pop must be even and >= 2 (antithetic pairs), got {args.pop}")
  for option in counts:
    if getattr(args, option) < 1:
      parser.error(f"--{option.replace('_', '-')} must be >= 1, got {getattr(args, option)}")


def optional_tqdm():
  """``tqdm.tqdm``, or None without it (it is in the "examples" extra; then plain prints)."""
  try:
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  return tqdm
