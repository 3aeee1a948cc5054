"""egpo's task runner building :class:`egpo.generate.trainer.GenerationTrainer` (in its own module, as
:mod:`egpo.runner` is: Ray pickles the class by reference)."""

from __future__ import annotations

from pathlib import Path

from egpo.runner import EgpoTaskRunner


class GenerateTaskRunner(EgpoTaskRunner):
    def trainer_class(self) -> type:
        from egpo.generate.trainer import GenerationTrainer

        return GenerationTrainer

    @staticmethod
    def kept_files(config) -> tuple:
        """A generation run keeps its configuration in its run.json (``config``) and logs no metrics."""
        from egpo.generate.options import GenerateOptions
        from egpo.runs.state import RUN

        return f"{Path(GenerateOptions.from_config(config).out) / RUN} (its config)", None

    def finished(self, config, seconds: float) -> None:
        """The end marks the driver waits for before the command's closing line (:mod:`egpo.runner_console`)."""
        from egpo.runner_console import end_runner_output

        end_runner_output(seconds)
