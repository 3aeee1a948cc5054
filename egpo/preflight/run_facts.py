"""The facts of a run that the pass's checks read, each read once: its ``algorithm`` settings, its rollout engine's
descriptor, the installed verl and its table entry, the worker family verl builds, the device, the actor strategy.

:func:`read_run` builds a :class:`Run` at the start of the pass (:mod:`egpo.preflight.checks`), before any check;
every check takes ``(config, run)`` and reads these from it instead of deriving them again from the config or the
installed packages. A fact that could not be read (verl not a tested one, ``algorithm.*`` refused) is None, its
refusal is one of :func:`read_run`'s findings, and the checks that need it are skipped with one warning that names
them. What is learnt during the pass is kept here for the steps after it: the tokenizer (``python -m
egpo.preflight`` reads it for the prompt lengths), the data files' rows (the budget and the disk figures count steps
from them) and the steps skipped so far.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from omegaconf import DictConfig, OmegaConf

from egpo.errors import EgpoError
from egpo.preflight.findings import Finding, refused

if TYPE_CHECKING:
    from egpo.compat.versions import ActorEntropyKeys, VerlStack, WorkerFamily
    from egpo.engines import Engine
    from egpo.settings import EgpoSettings


@dataclass
class Run:
    # read once, by read_run
    settings: EgpoSettings | None  # the run's algorithm.* settings; None where they are refused
    rollout: str | None  # actor_rollout_ref.rollout.name (None while unset)
    engine: Engine | None  # its descriptor (None: an engine egpo reads no entropy from)
    verl: str | None  # the installed verl's version (None: not one egpo is tested with)
    stack: VerlStack | None  # verl's table entry for it (None with verl)
    family: str | None  # the actor workers verl builds: "legacy" or "engine" (None with verl)
    workers: WorkerFamily | None  # that family's entry (None with verl)
    on_cpu: bool  # trainer.device=cpu
    strategy: str  # actor_rollout_ref.actor.strategy
    say: Callable[[str], None] = print  # where the pass says what it set in the config
    cuda: bool | None = None  # whether this machine has a GPU (None: asked of torch when a check needs it)
    # learnt during the pass
    tokenizer: object = None  # the model's tokenizer, where python -m egpo.preflight read it
    rows: dict = field(default_factory=dict)  # data key -> the rows a run reads (None: unknown)
    skipped: set = field(default_factory=set)  # the steps skipped for a need that did not hold

    @property
    def cuda_here(self) -> bool:
        if self.cuda is None:
            import torch

            self.cuda = torch.cuda.is_available()
        return self.cuda

    @property
    def entropy_keys(self) -> ActorEntropyKeys | None:
        """Where the actor verl builds reads its entropy settings (None: a strategy the table has no entry for)."""
        return self.workers.entropy_keys(self.strategy)


def read_settings(config: DictConfig, rollout: str | None):
    """-> (the run's ``algorithm`` settings, or None where they are refused; the findings). ``rollout``:
    actor_rollout_ref.rollout.name."""
    from egpo.settings import EgpoSettings

    try:
        return EgpoSettings.from_algorithm(config.algorithm, rollout_name=rollout), []
    except EgpoError as err:
        return None, [refused("algorithm", err)]


def read_run(config: DictConfig, say=print, cuda: bool | None = None, **given) -> tuple[Run, list[Finding]]:
    """The run's facts and the refusals of those that could not be read. ``given``: facts to take as they are
    (a test's settings) instead of reading them."""
    from egpo.compat.versions import verl_stack, verl_version
    from egpo.compat.workers import worker_family
    from egpo.engines import engine
    from egpo.settings import rollout_name

    found: list[Finding] = []
    facts = {}
    try:
        facts["verl"] = verl_version()
    except EgpoError as err:
        found.append(refused("stack", err))
        facts.update(verl=None, stack=None, family=None, workers=None)
    else:
        facts["stack"] = verl_stack(facts["verl"])
        facts["family"] = worker_family(config, facts["verl"])
        facts["workers"] = facts["stack"].workers[facts["family"]]
    name = rollout_name(config)
    if "settings" not in given:
        facts["settings"], settings_found = read_settings(config, name)
        found += settings_found
    facts.update(rollout=name, engine=engine(name),
                 on_cpu=str(OmegaConf.select(config, "trainer.device", default="cuda")) == "cpu",
                 strategy=str(OmegaConf.select(config, "actor_rollout_ref.actor.strategy", default="fsdp")))
    facts.update(given)
    return Run(**facts, say=say, cuda=cuda), found


def facts(config: DictConfig, **given) -> Run:
    """The run's facts alone, for a check called by itself (a test; a tool outside the pass); what cannot be read is
    None."""
    return read_run(config, **given)[0]


def with_facts(config: DictConfig, **given) -> tuple[DictConfig, Run]:
    """``(config, its facts)``: the arguments of one step called by itself, ``check(*with_facts(config))``."""
    return config, facts(config, **given)
