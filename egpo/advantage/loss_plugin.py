"""egpo's policy losses in verl's registry, in every process of a run (verl calls a policy loss in its actor workers).

On verl 0.9.1 verl imports this module itself, in every process that imports verl (its ``verl.plugins`` entry
point, pyproject.toml); on verl 0.7.1, which has no plugin group, Ray runs :func:`setup` at the start of each of the
run's worker processes (``ray_kwargs.ray_init.runtime_env.worker_process_setup_hook``, which the preflight sets where
a run asks for egpo's loss: :mod:`egpo.preflight.policy_loss`)."""

from egpo.advantage.sequence_loss import register


def setup() -> None:
    """Ray's worker-process setup hook: egpo's losses registered before the worker runs anything."""
    register()


register()
