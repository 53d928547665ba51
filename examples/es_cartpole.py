"""Solve gymnax CartPole-v1 (or Acrobot-v1) with virtual-noise evolution strategies.

A small nnx MLP policy (observation -> tanh hidden layer -> action logits,
greedy action) is trained by OpenES (antithetic pairs, centered ranks, Adam).
A generation's fitness is each individual's episode return, from a jitted
gymnax rollout (``lax.scan`` over the episode's steps) run for the whole
population at once by :meth:`EvolutionStrategy.evaluate`: every
``nnx.Linear`` call inside the rollout is the fused virtual-noise op, so the
population's perturbed weights are never stored. All individuals of a
generation play the same episodes (common random numbers), whose keys derive
from ``(--seed, generation)``.

The policy is then evaluated, unperturbed, on 100 fresh episodes. CartPole-v1
counts as solved at a mean return of 475 (the maximum is 500), Acrobot-v1 at
-100.

The last line printed is ``mean_return=<v> generations=<n> seconds=<s>``
(``seconds``: training time after compilation).

    python examples/es_cartpole.py                  # CartPole-v1: mean return 500
    python examples/es_cartpole.py --env acrobot    # Acrobot-v1: about -80
    python examples/es_cartpole.py --quick          # a short smoke run (tests)
"""

from __future__ import annotations

import argparse
import pathlib
import dataclasses
import sys
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import jaxnoise

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _cli  # noqa: E402  pylint: disable=g-import-not-at-top

IMPLEMENTATIONS = ("auto", "pallas", "interpret", "reference")


@dataclasses.dataclass(frozen=True)
class Task:
  env_id: str  # gymnax id
  generations: int  # default training length
  solved_at: float  # mean return over 100 episodes that counts as solved


TASKS = {
    "cartpole": Task("CartPole-v1", generations=50, solved_at=475.0),
    "acrobot": Task("Acrobot-v1", generations=100, solved_at=-100.0),
}


class Policy(nnx.Module):
  """Observation -> tanh(hidden) -> action logits."""

  def __init__(self, obs_size: int, hidden: int, n_actions: int, *, rngs: nnx.Rngs):
    self.hidden = nnx.Linear(obs_size, hidden, rngs=rngs)
    self.logits = nnx.Linear(hidden, n_actions, rngs=rngs)

  def __call__(self, obs):
    return self.logits(jnp.tanh(self.hidden(obs)))


def make_env(task: Task):
  """The gymnax environment and its default parameters."""
  import gymnax  # pylint: disable=g-import-not-at-top

  return gymnax.make(task.env_id)


def make_policy(env, env_params, hidden: int, seed: int) -> Policy:
  obs_size = env.observation_space(env_params).shape[0]
  return Policy(obs_size, hidden, env.num_actions, rngs=nnx.Rngs(seed))


def make_episode_return(env, env_params):
  """``episode_return(policy, key)``: the return of one greedy episode, jit- and vmap-able.

  The scan runs the episode's full time limit; rewards after the episode ends
  (gymnax auto-resets) are masked out.
  """

  def episode_return(policy, key):
    reset_key, steps_key = jax.random.split(key)
    obs, state = env.reset(reset_key, env_params)

    def one_step(carry, step_key):
      obs, state, total, running = carry
      action = jnp.argmax(policy(obs))
      obs, state, reward, terminated, truncated, _ = env.step(step_key, state, action,
                                                              env_params)
      total = total + jnp.where(running, reward, 0.0)
      return (obs, state, total, running & ~(terminated | truncated)), None

    step_keys = jax.random.split(steps_key, env_params.max_steps_in_episode)
    carry = (obs, state, jnp.zeros((), jnp.float32), jnp.ones((), bool))
    (_, _, total, _), _ = jax.lax.scan(one_step, carry, step_keys)
    return total

  return episode_return


def make_step(es, graphdef, rest, episode_return, *, episodes: int, rollout_key: jax.Array):
  """One generation: every individual plays the generation's ``episodes`` episodes."""

  def fitness(policy, keys):
    return jnp.mean(jax.vmap(lambda key: episode_return(policy, key))(keys))

  @jax.jit
  def step(params, es_state):
    policy = nnx.merge(graphdef, params, rest)
    keys = jax.random.split(jax.random.fold_in(rollout_key, es_state.generation), episodes)
    seeds, es_state = es.ask(es_state)
    returns = es.evaluate(policy, seeds, fitness, keys)
    updates, es_state = es.update(returns, es_state, policy)
    return optax.apply_updates(params, updates), es_state, jnp.mean(returns)

  return step


def make_evaluate(graphdef, rest, episode_return, episodes: int):
  """``evaluate(params, key)``: mean return of the unperturbed policy over ``episodes``."""

  @jax.jit
  def evaluate(params, key):
    policy = nnx.merge(graphdef, params, rest)
    keys = jax.random.split(key, episodes)
    return jnp.mean(jax.vmap(lambda key: episode_return(policy, key))(keys))

  return evaluate


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument("--env", choices=sorted(TASKS), default="cartpole",
                      help="gymnax task: cartpole (CartPole-v1) or acrobot (Acrobot-v1)")
  parser.add_argument("--generations", type=int, default=None,
                      help="ES generations (None: 50 for cartpole, 100 for acrobot)")
  parser.add_argument("--pop", type=int, default=256, help="population (even: antithetic pairs)")
  parser.add_argument("--sigma", type=float, default=0.3, help="perturbation std")
  parser.add_argument("--lr", type=float, default=0.05, help="Adam learning rate")
  parser.add_argument("--hidden", type=int, default=32, help="hidden units of the policy")
  parser.add_argument("--episodes", type=int, default=1,
                      help="episodes per individual and generation (fitness = mean return)")
  parser.add_argument("--eval-episodes", type=int, default=100,
                      help="episodes of the final evaluation")
  parser.add_argument("--eval-every", type=int, default=10,
                      help="generations between evaluations shown in the progress bar")
  parser.add_argument("--seed", type=int, default=0,
                      help="seed of the initial policy, the ES noise and the episodes")
  parser.add_argument("--kind", default=jaxnoise.DEFAULT_KIND, choices=sorted(jaxnoise.KINDS),
                      help="noise kind")
  parser.add_argument("--implementation", default="auto", choices=IMPLEMENTATIONS,
                      help="op implementation (auto: Pallas kernels on a GPU, the pure-JAX "
                           "reference elsewhere)")
  parser.add_argument("--quick", action="store_true",
                      help="a short smoke run for CI: 10 generations, pop 64, 20 evaluation "
                           "episodes, unless those options are given")
  args = parser.parse_args(argv)
  _cli.apply_quick_defaults(args, argv, {"--generations": 10, "--pop": 64, "--eval-episodes": 20})
  if args.generations is None:
    args.generations = TASKS[args.env].generations
  _cli.check_population_and_counts(
      parser, args, ("generations", "hidden", "episodes", "eval_episodes", "eval_every"))
  return args


def main(argv: Sequence[str] | None = None) -> dict:
  args = parse_args(argv)
  tqdm = _cli.optional_tqdm()

  task = TASKS[args.env]
  env, env_params = make_env(task)
  policy = make_policy(env, env_params, args.hidden, args.seed)
  graphdef, params, rest = nnx.split(policy, nnx.Param, ...)
  es = jaxnoise.optim.evolution_strategy(
      args.sigma, optax.adam(args.lr), pop_size=args.pop, kind=args.kind,
      implementation=args.implementation, seed=args.seed)
  es_state = es.init(policy)
  episode_return = make_episode_return(env, env_params)
  key = jax.random.key(args.seed)
  rollout_key, progress_key, final_key = jax.random.split(key, 3)
  step = make_step(es, graphdef, rest, episode_return, episodes=args.episodes,
                   rollout_key=rollout_key)
  evaluate = make_evaluate(graphdef, rest, episode_return, args.eval_episodes)
  n_params = sum(leaf.size for leaf in jax.tree.leaves(params))
  print(f"jaxnoise ES on {task.env_id}: policy with {n_params} parameters, pop {args.pop} "
        f"(antithetic), sigma {args.sigma}, {args.generations} generations, "
        f"{args.episodes} episode(s) of up to {env_params.max_steps_in_episode} steps per "
        f"individual, backend {jax.default_backend()}")

  compile_start = time.perf_counter()
  step = step.lower(params, es_state).compile()
  jax.block_until_ready(evaluate(params, progress_key))
  print(f"compiled in {time.perf_counter() - compile_start:.1f} s")

  start = time.perf_counter()
  bar = tqdm(total=args.generations, desc="ES", unit="gen") if tqdm is not None else None
  for generation in range(1, args.generations + 1):
    params, es_state, population_return = step(params, es_state)
    if generation % args.eval_every == 0 or generation == args.generations:
      # Progress only: these episodes are not the final evaluation's.
      shown = float(evaluate(params, jax.random.fold_in(progress_key, generation)))
      if bar is not None:
        bar.set_postfix(population=f"{float(population_return):.1f}", policy=f"{shown:.1f}")
      else:
        print(f"generation {generation}: population mean return {float(population_return):.1f}"
              f", policy {shown:.1f}")
    if bar is not None:
      bar.update(1)
  if bar is not None:
    bar.close()
  seconds = time.perf_counter() - start

  mean_return = float(evaluate(params, final_key))
  verdict = "solved" if mean_return >= task.solved_at else "not solved"
  print(f"{task.env_id}: mean return {mean_return:.1f} over {args.eval_episodes} fresh episodes "
        f"({verdict}: the threshold is {task.solved_at:g})")
  print(f"mean_return={mean_return:.2f} generations={args.generations} seconds={seconds:.1f}")
  return {"mean_return": mean_return, "generations": args.generations, "seconds": seconds,
          "params": params}


if __name__ == "__main__":
  main()
