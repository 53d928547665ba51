"""Train an nnx MLP on scikit-learn's digits with virtual-noise ES (CPU, < 1 min)."""
import argparse, jax, jax.numpy as jnp, optax
from flax import nnx
from sklearn.datasets import load_digits
import jaxnoise
argparse.ArgumentParser(description=__doc__).parse_args()  # --help prints the docstring, exits
images, labels = load_digits(return_X_y=True)  # 1797 8x8 images: train on 1500, test on 297
x, y = jnp.asarray(images / 16.0, jnp.float32), jnp.asarray(labels)
model = nnx.Sequential(nnx.Linear(64, 32, rngs=nnx.Rngs(0)), nnx.relu,
                       nnx.Linear(32, 10, rngs=nnx.Rngs(1)))
es = jaxnoise.optim.evolution_strategy(sigma=0.05, optimizer=optax.adam(0.03), pop_size=256)
state = es.init(model)

def fitness(model, x, y):  # one individual: minus its cross-entropy on a minibatch
  return -optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

@nnx.jit
def step(model, state):
  batch = jax.random.choice(jax.random.key(state.generation), 1500, (256,))
  seeds, state = es.ask(state)
  fitnesses = es.evaluate(model, seeds, fitness, x[batch], y[batch])  # fused, one op per layer
  updates, state = es.update(fitnesses, state, model)
  nnx.update(model, optax.apply_updates(nnx.state(model, nnx.Param), updates))
  return state

for generation in range(300):
  state = step(model, state)
accuracy = jnp.mean(jnp.argmax(model(x[1500:]), -1) == y[1500:])
print(f"test accuracy after {generation + 1} generations: {accuracy:.3f}")
