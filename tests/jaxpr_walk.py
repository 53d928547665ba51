"""A helper of the tests: the equations of a jaxpr and of every jaxpr nested in them."""

import jax.extend.core as jex


def equations(jaxpr, predicate=lambda eqn: True):
  """All equations (recursively, through every sub-jaxpr) satisfying ``predicate``."""
  found = []
  for eqn in jaxpr.eqns:
    if predicate(eqn):
      found.append(eqn)
    for value in eqn.params.values():
      for item in value if isinstance(value, (list, tuple)) else (value,):
        if isinstance(item, jex.ClosedJaxpr):
          found.extend(equations(item.jaxpr, predicate))
        elif isinstance(item, jex.Jaxpr):
          found.extend(equations(item, predicate))
  return found
