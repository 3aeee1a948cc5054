"""``EgpoRayPPOTrainer``: where entropy is kept and dropped.

verl methods overridden, nothing else:

* ``_compute_old_log_prob``: the actor's recompute already returns ``entropys``; ``fit`` pops it. With
  ``entropy_source=actor`` the same tensor is also kept under ``egpo_actor_entropy`` so it survives until
  the advantage; an all-zero one (a verl that skipped computing it) stops the run. Whenever the rollout's
  entropy is in the batch too, their agreement is measured here, and with ``entropy_source=surprisal`` the
  surprisal's (the negated rollout log probs) against it.
* ``_compute_old_log_prob``, ``_compute_ref_log_prob``, ``_compute_values``, ``_compute_reward_colocate``: egpo's
  entropy keys stay on the driver while verl ships the batch to a worker group (no worker reads them;
  :func:`entropy_kept_on_driver`).
* ``_update_actor``: with ``algorithm.egpo_token_selection=top_entropy`` the batch's ``response_mask`` is the 80/20
  rule's narrowed mask (``egpo_update_mask``, set with the advantage) for the update call only, and the full mask
  again after it (verl's step metrics read it); egpo's entropy keys are dropped before the update (nothing there
  reads them) and egpo's step metrics are added to the actor's metrics, which ``fit`` logs; a one-line summary is
  printed, and a run that reads the thinking span of a model that never thinks says so once
  (:mod:`egpo.trainer.thought_watch`). The entropy probe's metrics are logged as ``probe/*`` on either worker API.

* ``init_workers``: verl's, with the run's agent-loop and reward-loop workers, and the actors verl leaves to Ray's
  default placement, on the run's own nodes (:mod:`egpo.trainer.placement`), so that in a shared cluster a lost node
  fails only the runs it held.
* ``_val_metrics_update``: verl's validation metrics plus ``val-egpo/pass@k`` from the samples of each validation
  problem (:mod:`egpo.trainer.pass_at_k`).
* ``_save_checkpoint``, ``_validate``: a step that saved validates after verl logged it, not before, so a checkpoint
  never outlives its step's metrics (:mod:`egpo.trainer.validation_after_log`).

The advantage itself is routed by :mod:`egpo.trainer.advantage_step`.
"""

from __future__ import annotations

import warnings

from contextlib import contextmanager

from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from egpo.advantage.registry import register as register_estimator
from egpo.trainer import advantage_step, pass_at_k
from egpo.settings import EgpoSettings
from egpo.keys import ACTOR_ENTROPY, ROLLOUT_ENTROPY, ROLLOUT_LOG_PROBS, STEP_METRICS, TRANSIENT_BATCH_KEYS, UPDATE_MASK
from egpo.options import EgpoOptions, read
from egpo.trainer.metrics import SURPRISAL_PREFIX, entropy_agreement, format_step_summary
from egpo.trainer.thought_watch import NeverThinksWatch

ENGINE_PROBE_PREFIX = "actor/probe/"


# verl 0.9.1's deprecation of the trainer egpo subclasses (its legacy trainer: egpo's configs set trainer.use_v1=false)
DEPRECATED_TRAINER = r"Warning: Class 'verl\.trainer\.ppo\.ray_trainer\.RayPPOTrainer' is deprecated"


class EgpoRayPPOTrainer(RayPPOTrainer):
    trains = True  # False: a subclass that only generates (egpo.generate.trainer)

    def __init__(self, config, *args, **kwargs):
        from egpo.compat.rollout import register_replicas

        register_replicas(config)  # before init_workers: where this verl resolves replicas by name
        with warnings.catch_warnings():  # verl 0.9.1 deprecates the class egpo builds on purpose (trainer.use_v1=false)
            warnings.filterwarnings("ignore", message=DEPRECATED_TRAINER, category=FutureWarning)
            super().__init__(config, *args, **kwargs)
        self.egpo = EgpoSettings.of(config.algorithm)
        register_estimator()
        advantage_step.install()
        pass_at_k.check_verl_shape(RayPPOTrainer)
        self.solved_score = float(read(EgpoOptions, config.get("egpo", None), "egpo").pass_at_k.solved_score)
        advantage_step.set_solved_score(self.solved_score)  # "correct" for GTPO and GRPO-S, as for pass@k
        self.never_thinks = NeverThinksWatch(active=self.egpo.enabled and self.egpo.algo.egpo_span == "cot")
        if self.egpo.enabled and self.trains:
            print(f"[egpo] estimator: {self.egpo.variant}", flush=True)
        self.deferred_validation = None
        if self.trains:
            from egpo.trainer import validation_after_log

            self.deferred_validation = validation_after_log.DeferredValidation(
                super()._validate, config.trainer.default_local_dir)
            validation_after_log.install(self.deferred_validation)

    def _save_checkpoint(self):
        """verl's save; the step's validation, if it has one, then waits for the step's log
        (:mod:`egpo.trainer.validation_after_log`)."""
        result = super()._save_checkpoint()
        if self.deferred_validation is not None:
            self.deferred_validation.saved(self.global_steps)
        return result

    def _validate(self, *args, **kwargs):
        if self.deferred_validation is None:
            return super()._validate(*args, **kwargs)
        if self.deferred_validation.defers(self.global_steps):
            return {}
        metrics = super()._validate(*args, **kwargs)
        self.deferred_validation.validated(self.global_steps)  # before training: what a stopped run owed there
        return metrics

    def init_workers(self):
        from egpo.compat.verl_shapes import check_ray_shape
        from egpo.trainer.placement import default_actors_on, placing_on_run_nodes, pool_node_ids, record_placed_nodes

        check_ray_shape()
        run_nodes = lambda: pool_node_ids(self.resource_pool_manager)  # noqa: E731 - asked anew at each use
        try:
            with placing_on_run_nodes(run_nodes), default_actors_on(run_nodes):
                return super().init_workers()
        finally:  # also where a worker fails to start (a model load, CUDA, an engine): the pools' nodes, once they
            # exist, are what a failed attempt names
            record_placed_nodes(self.config, run_nodes)

    def _compute_old_log_prob(self, batch: DataProto):
        with entropy_kept_on_driver(batch) as kept:
            old_log_prob, mfu = super()._compute_old_log_prob(batch)
        actor_entropy = old_log_prob.batch.get("entropys", None) if old_log_prob.batch is not None else None
        computed = actor_entropy is not None and actor_entropy_computed(actor_entropy, batch.batch["response_mask"])
        if self.egpo.reads_actor_recompute:
            if not computed:
                raise advantage_step.MissingEntropyError(UNCOMPUTED_ACTOR_ENTROPY if actor_entropy is not None else
                                                         "the actor's old-log-prob recompute returned no 'entropys'; "
                                                         "egpo with entropy_source=actor needs it")
            old_log_prob.batch[ACTOR_ENTROPY] = actor_entropy
        if computed and ROLLOUT_ENTROPY in kept:
            advantage_step.add_step_metrics(
                batch, entropy_agreement(kept[ROLLOUT_ENTROPY], actor_entropy, batch.batch["response_mask"])
            )
        if computed and self.egpo.reads_surprisal and ROLLOUT_LOG_PROBS in batch.batch.keys():
            # how far the stand-in is from the entropy, on the same tokens
            advantage_step.add_step_metrics(batch, entropy_agreement(
                advantage_step.source_entropy(batch.batch, self.egpo), actor_entropy, batch.batch["response_mask"],
                SURPRISAL_PREFIX))
        return old_log_prob, mfu

    def _compute_ref_log_prob(self, batch: DataProto):
        with entropy_kept_on_driver(batch):
            return super()._compute_ref_log_prob(batch)

    def _compute_values(self, batch: DataProto):
        with entropy_kept_on_driver(batch):
            return super()._compute_values(batch)

    def _compute_reward_colocate(self, batch: DataProto):
        with entropy_kept_on_driver(batch):
            return super()._compute_reward_colocate(batch)

    def _val_metrics_update(self, data_sources, sample_uids, reward_extra_infos_dict, sample_turns):
        metrics = super()._val_metrics_update(data_sources, sample_uids, reward_extra_infos_dict, sample_turns)
        metrics.update(pass_at_k.pass_at_k_metrics(data_sources, sample_uids, reward_extra_infos_dict["reward"],
                                                   self.solved_score))
        return metrics

    def _update_actor(self, batch: DataProto) -> DataProto:
        step_metrics = batch.meta_info.pop(STEP_METRICS, {})
        for key in TRANSIENT_BATCH_KEYS:
            if key in batch.batch.keys():
                batch.batch.pop(key)
        with update_mask_applied(batch, self.egpo.selects_tokens):
            actor_output = super()._update_actor(batch)
        metrics = actor_output.meta_info.setdefault("metrics", {})
        for key in [k for k in metrics if k.startswith(ENGINE_PROBE_PREFIX)]:  # verl's engine path prefixes "actor/"
            metrics[key[len("actor/"):]] = metrics.pop(key)
        metrics.update(step_metrics)
        if step_metrics:
            step = getattr(self, "global_steps", None)
            print(format_step_summary(step, step_metrics), flush=True)
            self.never_thinks.observe(step_metrics, step)
        return actor_output


@contextmanager
def entropy_kept_on_driver(batch: DataProto):
    """egpo's entropy keys (B x L fp32 each) taken out of ``batch`` while verl sends it to a worker group, and put back
    after; yields them (key -> tensor)."""
    tensors = batch.batch
    kept = {key: tensors.pop(key) for key in TRANSIENT_BATCH_KEYS if tensors is not None and key in tensors.keys()}
    try:
        yield kept
    finally:
        for key, value in kept.items():
            tensors[key] = value


@contextmanager
def update_mask_applied(batch: DataProto, selects_tokens: bool):
    """``batch``'s ``response_mask`` is the 80/20 rule's mask (``egpo_update_mask``, which is taken out of the batch)
    while the actor updates, and the full mask again after it. A run that selects tokens and finds no mask stops:
    training on every token would be a different method under the same name."""
    tensors = batch.batch
    update_mask = tensors.pop(UPDATE_MASK) if UPDATE_MASK in tensors.keys() else None
    if update_mask is None:
        if selects_tokens:
            raise advantage_step.MissingEntropyError(
                "algorithm.egpo_token_selection selects top-entropy tokens, but the batch reached the actor update "
                f"without egpo's '{UPDATE_MASK}': the advantage did not run through egpo's estimator. Run through "
                "`python -m egpo.main` with algorithm.adv_estimator=egpo.")
        yield
        return
    full_mask = tensors["response_mask"]
    tensors["response_mask"] = update_mask
    try:
        yield
    finally:
        tensors["response_mask"] = full_mask


UNCOMPUTED_ACTOR_ENTROPY = (
    "the actor's old-log-prob recompute returned 'entropys' that are 0 on every response token: this verl did not "
    "compute them (verl 0.7.1 and 0.9.1 compute the old-policy entropy unconditionally, which egpo checks at start-up: "
    "egpo.compat.verl_shapes; a verl that gates it on a key is not one egpo was tested with). Take the entropy from "
    "the rollout engine instead: ++algorithm.entropy_source=rollout"
)


def actor_entropy_computed(actor_entropy, response_mask) -> bool:
    """False where verl returned ``entropys`` as zeros on every valid response token (a verl that skipped computing
    them, as two upstream proposals would): a real entropy is never exactly 0 on every token of a batch."""
    return not bool(response_mask.any()) or bool((actor_entropy * response_mask).any())
