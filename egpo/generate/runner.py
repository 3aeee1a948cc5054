"""egpo's task runner building :class:`egpo.generate.trainer.GenerationTrainer` (in its own module, as
:mod:`egpo.runner` is: Ray pickles the class by reference)."""

from __future__ import annotations

from egpo.runner import EgpoTaskRunner


class GenerateTaskRunner(EgpoTaskRunner):
    def trainer_class(self) -> type:
        from egpo.generate.trainer import GenerationTrainer

        return GenerationTrainer

    def finished(self, config, seconds: float) -> None:  # the generation loop said what it wrote
        return None
