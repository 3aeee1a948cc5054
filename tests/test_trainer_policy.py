"""Which entropy keys exist at advantage time and at actor-update time, for both sources and bypass mode.

The trainer's two overridden methods and verl's own ``compute_advantage`` (as ``fit`` reaches it) run for real;
what verl's own ``_compute_old_log_prob`` / ``_update_actor`` do with the workers (a DataProto or TensorDict
round trip, depending on the verl version) is replaced by a recorder, so the same test holds on every verl stack.
The end-to-end tests run the same through ``fit`` on CPU.
"""

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module
from verl import DataProto
from verl.trainer.ppo import ray_trainer as verl_ray_trainer
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from egpo.trainer import advantage_step
from egpo.settings import EgpoSettings
from egpo.keys import ACTOR_ENTROPY, ROLLOUT_ENTROPY, ROLLOUT_LOG_PROBS, STEP_METRICS, UPDATE_MASK
from egpo.trainer.metrics import entropy_agreement
from egpo.trainer.ray_trainer import EgpoRayPPOTrainer
from egpo.trainer.thought_watch import NeverThinksWatch

S, E = 3, 4
BS, P, L = 8, 4, 6


class RecordingWorkerGroup:
    def __init__(self, actor_entropy):
        self.actor_entropy = actor_entropy
        self.update_keys = None
        self.sent_keys = {}  # worker call -> the batch keys it was sent

    def compute_log_prob(self, batch):
        self.sent_keys["compute_log_prob"] = set(batch.batch.keys())
        return DataProto.from_dict({"old_log_probs": torch.zeros(BS, L), "entropys": self.actor_entropy})

    def record(self, call, batch):
        self.sent_keys[call] = set(batch.batch.keys())
        return DataProto.from_dict({"ref_log_prob": torch.zeros(BS, L)})

    def update_actor(self, batch):
        self.update_keys = set(batch.batch.keys())
        self.update_mask = batch.batch["response_mask"].clone()
        self.update_meta = dict(batch.meta_info)
        return DataProto(meta_info={"metrics": {"actor/pg_loss": 0.1}})


@pytest.fixture(autouse=True)
def verl_worker_calls(monkeypatch):
    """verl's methods that egpo's overrides call through super(): straight to the recording worker group."""
    monkeypatch.setattr(verl_ray_trainer.RayPPOTrainer, "_compute_old_log_prob",
                        lambda self, batch: (self.actor_rollout_wg.compute_log_prob(batch), 0.0))
    monkeypatch.setattr(verl_ray_trainer.RayPPOTrainer, "_update_actor",
                        lambda self, batch: self.actor_rollout_wg.update_actor(batch))
    for call in ("_compute_ref_log_prob", "_compute_values", "_compute_reward_colocate"):
        monkeypatch.setattr(verl_ray_trainer.RayPPOTrainer, call,
                            lambda self, batch, call=call: self.actor_rollout_wg.record(call, batch))


def make_trainer(*overrides, markers=True):
    ids = [f"algorithm.cot_start_token_id={S}", f"algorithm.cot_end_token_id={E}"] if markers else []
    with initialize_config_module(config_module="egpo.config", version_base=None):
        cfg = compose(config_name="egpo_trainer", overrides=[*ids, *overrides])
    trainer = EgpoRayPPOTrainer.__new__(EgpoRayPPOTrainer)  # skip worker/resource setup, keep the methods
    trainer.config = cfg
    trainer.egpo = EgpoSettings.from_algorithm(cfg.algorithm)
    trainer.never_thinks = NeverThinksWatch(active=trainer.egpo.enabled and trainer.egpo.algo.egpo_span == "cot")
    trainer.use_legacy_worker_impl = "auto"
    advantage_step.install()
    return trainer


def make_batch(with_rollout_entropy, with_log_probs=True):
    g = torch.Generator().manual_seed(0)
    prompts = torch.tensor([[0, 1, 2, S]] * BS)  # prompt ends inside <think>
    responses = torch.tensor([[5, 6, E, 7, 2, 0]] * BS)
    response_mask = torch.tensor([[1, 1, 1, 1, 1, 0]] * BS)
    rewards = torch.zeros(BS, L)
    rewards[:, 4] = torch.tensor([1.0, 0, 1, 0, 0, 0, 1, 1])
    tensors = {"prompts": prompts, "responses": responses, "response_mask": response_mask,
               "token_level_rewards": rewards}
    if with_rollout_entropy:
        tensors[ROLLOUT_ENTROPY] = torch.rand(BS, L, generator=g) * response_mask
    if with_log_probs:  # verl's, with rollout.calculate_log_probs=true: 0 on padding
        tensors[ROLLOUT_LOG_PROBS] = -3 * torch.rand(BS, L, generator=torch.Generator().manual_seed(2)) * response_mask
    return DataProto.from_dict(tensors, non_tensors={"uid": np.array([f"u{i // 4}" for i in range(BS)], dtype=object)})


def run_step(trainer, batch, bypass):
    """The calls fit() makes between generation and the actor update, in fit()'s order."""
    if not bypass:
        old_log_prob, _ = trainer._compute_old_log_prob(batch)
        old_log_prob.batch.pop("entropys")  # as fit() does
        batch = batch.union(old_log_prob)
    seen = {}
    original = advantage_step.compute_egpo_advantage_step

    def spy(data, *args, **kwargs):
        seen["keys"] = set(data.batch.keys())
        return original(data, *args, **kwargs)

    advantage_step.compute_egpo_advantage_step = spy
    try:
        batch = verl_ray_trainer.compute_advantage(
            batch, adv_estimator=trainer.config.algorithm.adv_estimator, config=trainer.config.algorithm)
    finally:
        advantage_step.compute_egpo_advantage_step = original
    output = trainer._update_actor(batch)
    return batch, seen.get("keys"), output


@pytest.mark.parametrize(
    "source, bypass, rollout_entropy, used",
    [("actor", False, False, ACTOR_ENTROPY), ("actor", False, True, ACTOR_ENTROPY),
     ("rollout", False, True, ROLLOUT_ENTROPY), ("rollout", True, True, ROLLOUT_ENTROPY),
     ("surprisal", False, False, ROLLOUT_LOG_PROBS), ("surprisal", False, True, ROLLOUT_LOG_PROBS),
     ("surprisal", True, False, ROLLOUT_LOG_PROBS)],
)
def test_keep_and_drop(source, bypass, rollout_entropy, used):
    trainer = make_trainer("algorithm.adv_estimator=egpo", f"algorithm.entropy_source={source}",
                           f"algorithm.rollout_correction.bypass_mode={str(bypass).lower()}")
    actor_entropy = torch.rand(BS, L, generator=torch.Generator().manual_seed(1))
    trainer.actor_rollout_wg = RecordingWorkerGroup(actor_entropy)
    batch = make_batch(rollout_entropy)
    log_probs = batch.batch[ROLLOUT_LOG_PROBS].clone()
    expected_entropy = {ROLLOUT_ENTROPY: lambda: batch.batch[ROLLOUT_ENTROPY].clone(), ACTOR_ENTROPY: lambda: actor_entropy,
                        ROLLOUT_LOG_PROBS: lambda: -log_probs}[used]()
    batch, advantage_keys, output = run_step(trainer, batch, bypass)

    assert used in advantage_keys  # kept until the advantage
    assert "entropys" not in advantage_keys  # verl's own key is popped by fit as upstream
    for key in (ACTOR_ENTROPY, ROLLOUT_ENTROPY):
        assert key not in trainer.actor_rollout_wg.update_keys  # never travels to the update
    assert STEP_METRICS not in trainer.actor_rollout_wg.update_meta
    metrics = output.meta_info["metrics"]
    assert metrics["actor/pg_loss"] == 0.1
    assert metrics["egpo/entropy_source_is_rollout"] == float(source == "rollout")
    assert metrics["egpo/entropy_source_is_surprisal"] == float(source == "surprisal")
    assert metrics["egpo/starts_inside_frac"] == 1.0
    # both entropies in one step -> their agreement is logged
    assert ("egpo/entropy_rollout_vs_actor/mean_abs_diff" in metrics) == (rollout_entropy and not bypass)
    # the surprisal source and the actor's entropy in one step -> how far the surprisal is from it
    surprisal_figures = {k: v for k, v in metrics.items() if k.startswith("egpo/surprisal_vs_actor_entropy/")}
    if source == "surprisal" and not bypass:
        assert surprisal_figures == entropy_agreement(-log_probs, actor_entropy, batch.batch["response_mask"],
                                                      "egpo/surprisal_vs_actor_entropy/")
        assert surprisal_figures["egpo/surprisal_vs_actor_entropy/tokens"] == BS * 5
    else:
        assert not surprisal_figures
    # verl's rollout log probs are verl's: unchanged, and still in the batch for its rollout correction
    assert ROLLOUT_LOG_PROBS in trainer.actor_rollout_wg.update_keys
    assert torch.equal(batch.batch[ROLLOUT_LOG_PROBS], log_probs)
    # the advantage used the chosen entropy: H_i = mean over the two tokens before </think>
    h = expected_entropy[:, :2].double().mean(1)
    a = compute_grpo_outcome_advantage(batch.batch["token_level_rewards"], batch.batch["response_mask"],
                                       batch.non_tensor_batch["uid"])[0][:, 0].double()
    expected = a + 0.4 * torch.minimum(h, a.abs() / 2.0)
    torch.testing.assert_close(batch.batch["advantages"][:, 0].double(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("granularity", ["response", "token"])
@pytest.mark.parametrize("markers", [True, False])
def test_response_span_through_the_step(granularity, markers):
    """egpo_span=response: the bonus reads every valid token, with or without thinking markers; the metrics say
    which variant ran, and the CoT figures appear only where the markers are known."""
    trainer = make_trainer("algorithm.adv_estimator=egpo", "algorithm.entropy_source=rollout",
                           "algorithm.egpo_span=response", f"algorithm.egpo_granularity={granularity}", markers=markers)
    trainer.actor_rollout_wg = RecordingWorkerGroup(torch.rand(BS, L))
    batch = make_batch(True)
    entropy = batch.batch[ROLLOUT_ENTROPY].clone()
    batch, _, output = run_step(trainer, batch, bypass=False)
    metrics = output.meta_info["metrics"]
    assert metrics["egpo/span_is_response"] == 1.0
    assert metrics["egpo/granularity_is_token"] == float(granularity == "token")
    assert ("egpo/cot_entropy_mean" in metrics) == markers
    a = compute_grpo_outcome_advantage(batch.batch["token_level_rewards"], batch.batch["response_mask"],
                                       batch.non_tensor_batch["uid"])[0].double()
    mask = batch.batch["response_mask"].double()
    if granularity == "response":
        h = (entropy.double() * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True)
    else:
        h = entropy.double()
    expected = (a + 0.4 * torch.minimum(h, a.abs() / 2.0)) * mask
    torch.testing.assert_close(batch.batch["advantages"].double(), expected, rtol=1e-6, atol=1e-6)


def test_cot_span_without_markers_stops_naming_egpo_span():
    trainer = make_trainer("algorithm.adv_estimator=egpo", "algorithm.entropy_source=rollout", markers=False)
    trainer.actor_rollout_wg = RecordingWorkerGroup(torch.rand(BS, L))
    from egpo.advantage.egpo import MissingThinkMarkersError

    with pytest.raises(MissingThinkMarkersError, match="algorithm.egpo_span=response"):
        run_step(trainer, make_batch(True), bypass=False)


def test_rollout_source_without_rollout_entropy_stops_with_the_fix():
    trainer = make_trainer("algorithm.adv_estimator=egpo", "algorithm.entropy_source=rollout")
    trainer.actor_rollout_wg = RecordingWorkerGroup(torch.rand(BS, L))
    with pytest.raises(advantage_step.MissingEntropyError, match="agent_loop_manager_class"):
        run_step(trainer, make_batch(False), bypass=False)


def test_surprisal_source_without_rollout_log_probs_stops_with_the_fix():
    trainer = make_trainer("algorithm.adv_estimator=egpo", "algorithm.entropy_source=surprisal")
    trainer.actor_rollout_wg = RecordingWorkerGroup(torch.rand(BS, L))
    with pytest.raises(advantage_step.MissingEntropyError,
                       match=r"\+\+actor_rollout_ref\.rollout\.calculate_log_probs=true"):
        run_step(trainer, make_batch(True, with_log_probs=False), bypass=False)


def test_misaligned_rollout_entropy_is_refused():
    trainer = make_trainer("algorithm.adv_estimator=egpo", "algorithm.entropy_source=rollout")
    batch = make_batch(False)
    batch.batch[ROLLOUT_ENTROPY] = torch.rand(BS, L - 1)  # one value short per response
    with pytest.raises(advantage_step.MissingEntropyError, match="aligned 1:1"):
        advantage_step.compute_egpo_advantage_step(batch, trainer.config.algorithm)


def test_non_egpo_estimators_are_untouched():
    trainer = make_trainer("algorithm.adv_estimator=grpo")
    trainer.actor_rollout_wg = RecordingWorkerGroup(torch.rand(BS, L))
    batch = make_batch(False)
    expected = compute_grpo_outcome_advantage(batch.batch["token_level_rewards"], batch.batch["response_mask"],
                                              batch.non_tensor_batch["uid"])[0]
    batch, advantage_keys, output = run_step(trainer, batch, bypass=False)
    assert advantage_keys is None  # the egpo branch was never entered
    assert ACTOR_ENTROPY not in batch.batch.keys()
    assert torch.equal(batch.batch["advantages"], expected)
    assert not any(k.startswith("egpo/") for k in output.meta_info["metrics"])


def test_stock_trainer_path_refuses_egpo_without_entropy():
    # verl's registry route (what a stock RayPPOTrainer reaches) must not silently train GRPO
    from egpo.advantage.registry import EntropyNotSuppliedError, register

    register()  # what `import egpo; egpo.register()` does for a stock verl entry point

    batch = make_batch(True)
    upstream = advantage_step.COMPUTE_ADVANTAGE.original()
    with initialize_config_module(config_module="egpo.config", version_base=None):
        cfg = compose(config_name="egpo_trainer", overrides=["algorithm.adv_estimator=egpo"])
    with pytest.raises(EntropyNotSuppliedError):
        upstream(batch, adv_estimator="egpo", config=cfg.algorithm)


@pytest.mark.parametrize("source", ["actor", "rollout"])
def test_entropy_stays_on_the_driver_during_worker_calls(source):
    """rollout_entropy (and the kept actor entropy) never travel to a worker group before the advantage, and are
    back in the batch after each call."""
    trainer = make_trainer("algorithm.adv_estimator=egpo", f"algorithm.entropy_source={source}")
    trainer.actor_rollout_wg = RecordingWorkerGroup(torch.rand(BS, L, generator=torch.Generator().manual_seed(1)))
    batch = make_batch(True)
    rollout_entropy = batch.batch[ROLLOUT_ENTROPY].clone()
    old_log_prob, _ = trainer._compute_old_log_prob(batch)
    old_log_prob.batch.pop("entropys")
    batch = batch.union(old_log_prob)
    for call in (trainer._compute_ref_log_prob, trainer._compute_values, trainer._compute_reward_colocate):
        call(batch)
        assert torch.equal(batch.batch[ROLLOUT_ENTROPY], rollout_entropy)
        assert (ACTOR_ENTROPY in batch.batch.keys()) == (source == "actor")
    sent = trainer.actor_rollout_wg.sent_keys
    assert set(sent) == {"compute_log_prob", "_compute_ref_log_prob", "_compute_values", "_compute_reward_colocate"}
    for keys in sent.values():
        assert "responses" in keys and ROLLOUT_ENTROPY not in keys and ACTOR_ENTROPY not in keys
    # the agreement was still measured on the driver
    assert "egpo/entropy_rollout_vs_actor/mean_abs_diff" in batch.meta_info[STEP_METRICS]


def test_all_zero_actor_entropy_stops_an_actor_source_run():
    """A verl that skipped the old-policy entropy returns zeros: egpo stops rather than train on H = 0."""
    trainer = make_trainer("algorithm.adv_estimator=egpo", "algorithm.entropy_source=actor")
    trainer.actor_rollout_wg = RecordingWorkerGroup(torch.zeros(BS, L))
    with pytest.raises(advantage_step.MissingEntropyError, match="compute the old-policy entropy unconditionally.*entropy_source=rollout"):
        trainer._compute_old_log_prob(make_batch(True))


def test_all_zero_actor_entropy_gives_no_agreement_figure():
    """With the rollout's entropy, a zero actor entropy is not compared with it (the figure would be made up)."""
    trainer = make_trainer("algorithm.adv_estimator=egpo", "algorithm.entropy_source=rollout")
    trainer.actor_rollout_wg = RecordingWorkerGroup(torch.zeros(BS, L))
    batch = make_batch(True)
    trainer._compute_old_log_prob(batch)
    assert not any(k.startswith("egpo/entropy_rollout_vs_actor") for k in batch.meta_info.get(STEP_METRICS, {}))


def test_zero_entropy_on_padding_only_is_a_real_entropy():
    from egpo.trainer.ray_trainer import actor_entropy_computed

    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert actor_entropy_computed(torch.tensor([[0.0, 0.2, 0.0], [0.0, 0.0, 0.0]]), mask)
    assert not actor_entropy_computed(torch.tensor([[0.0, 0.0, 5.0], [0.0, 3.0, 1.0]]), mask)  # only padding
    assert actor_entropy_computed(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long))  # nothing to read


@pytest.mark.parametrize("source, quantile, variant, scope", [
    ("actor", 0.25, (), "top_entropy"), ("actor", 1.0, (), "top_entropy"), ("rollout", 0.25, (), "top_entropy"),
    ("rollout", 1.0, (), "top_entropy"), ("rollout", 0.25, ("algorithm.egpo_lambda=0",), "top_entropy"),
    ("actor", 0.25, ("algorithm.egpo_granularity=token",), "top_entropy"),
    ("rollout", 0.25, ("algorithm.egpo_span=response",), "top_entropy"),
    ("rollout", 0.25, (), "top_entropy_per_response"), ("actor", 0.5, (), "top_entropy_per_response"),
], ids=["actor", "actor-q1", "rollout", "rollout-q1", "grpo", "token", "respspan", "rollout-per-response",
        "actor-per-response"])
def test_top_entropy_selection_narrows_only_the_update(source, quantile, variant, scope):
    """egpo_token_selection=top_entropy (or top_entropy_per_response): the actor update sees the response mask
    narrowed to the batch's (or each response's) top-entropy tokens of the chosen source (all of them, bit for bit, at
    quantile 1); the advantage, the batch after the update and the mask verl's step metrics read are the full ones."""
    from egpo.advantage.token_selection import top_entropy_mask

    selection = (f"algorithm.egpo_token_selection={scope}", f"algorithm.egpo_top_entropy_quantile={quantile}")
    actor_entropy = torch.rand(BS, L, generator=torch.Generator().manual_seed(1))
    runs = {}
    for selected in (False, True):
        trainer = make_trainer("algorithm.adv_estimator=egpo", f"algorithm.entropy_source={source}", *variant,
                               *(selection if selected else ()))
        trainer.actor_rollout_wg = RecordingWorkerGroup(actor_entropy)
        batch = make_batch(True)
        entropy = actor_entropy if source == "actor" else batch.batch[ROLLOUT_ENTROPY].clone()
        full_mask = batch.batch["response_mask"].clone()
        batch, _, output = run_step(trainer, batch, bypass=False)
        runs[selected] = (batch, trainer.actor_rollout_wg, output.meta_info["metrics"])
    (plain, plain_wg, plain_metrics), (chosen, chosen_wg, metrics) = runs[False], runs[True]
    per_response = scope == "top_entropy_per_response"
    expected = top_entropy_mask(entropy, full_mask, quantile, per_response=per_response)
    if per_response:  # not the batch's selection: each response keeps its own share
        assert not torch.equal(expected.mask, top_entropy_mask(entropy, full_mask, quantile).mask)
    assert torch.equal(plain_wg.update_mask, full_mask)
    assert torch.equal(chosen_wg.update_mask, expected.mask) and chosen_wg.update_mask.dtype == full_mask.dtype
    if quantile == 1.0:
        assert torch.equal(chosen_wg.update_mask, full_mask)
    else:
        assert chosen_wg.update_mask.sum() < full_mask.sum()
    assert torch.equal(chosen.batch["response_mask"], full_mask) and UPDATE_MASK not in chosen.batch.keys()
    assert UPDATE_MASK not in chosen_wg.update_keys
    assert torch.equal(chosen.batch["advantages"], plain.batch["advantages"])
    assert metrics["egpo/token_selection/kept_frac"] == expected.n_kept / expected.n_valid
    if per_response:
        assert metrics["egpo/token_selection/response_threshold_mean"] == expected.response_threshold_mean
    else:
        assert metrics["egpo/token_selection/entropy_threshold"] == expected.threshold
    assert not any(k.startswith("egpo/token_selection/") for k in plain_metrics)


def test_selection_without_its_mask_stops_the_update():
    trainer = make_trainer("algorithm.adv_estimator=egpo", "algorithm.egpo_token_selection=top_entropy")
    trainer.actor_rollout_wg = RecordingWorkerGroup(torch.rand(BS, L))
    with pytest.raises(advantage_step.MissingEntropyError, match="egpo_update_mask"):
        trainer._update_actor(make_batch(False))
    assert trainer.actor_rollout_wg.update_keys is None


@pytest.mark.parametrize("selection", ["all", "top_entropy"])
def test_the_step_batch_bytes_are_the_batch_at_its_fullest(selection):
    """The figures egpo.rehearse holds the preflight's driver memory to, worked by hand: the batch's tensors at the
    advantage (its int64 prompts, responses and mask, fp32 rewards, rollout entropy and log probs), the advantages and
    returns egpo adds (fp32 each) and, with the 80/20 selection, its update mask (the response mask's dtype: int64,
    as verl's); egpo's own keys: the entropy and the mask."""
    from egpo.keys import EGPO_BATCH_BYTES, STEP_BATCH_BYTES

    trainer = make_trainer("algorithm.adv_estimator=egpo", "algorithm.entropy_source=rollout",
                           f"algorithm.egpo_token_selection={selection}")
    batch = make_batch(True)
    advantage_step.compute_egpo_advantage_step(batch, trainer.config.algorithm)
    metrics = batch.meta_info[STEP_METRICS]
    mask = BS * L * 8 if selection == "top_entropy" else 0
    egpo_bytes = BS * L * 4 + mask
    verl_bytes = BS * 4 * 8 + 2 * BS * L * 8 + 2 * BS * L * 4 + 2 * BS * L * 4  # prompts; responses, mask; rewards,
    assert metrics[EGPO_BATCH_BYTES] == egpo_bytes  # log probs; advantages, returns
    assert metrics[STEP_BATCH_BYTES] == verl_bytes + egpo_bytes


@pytest.mark.parametrize("method", ["gtpo", "grpo_s"])
@pytest.mark.parametrize("solved", [1.0, 0.5])
def test_gtpo_and_grpo_s_through_the_trainers_advantage_step(method, solved):
    """The trainer's advantage step (fit()'s calls, the actor's recompute entropy kept until the advantage) gives
    egpo.advantage.gtpo's advantages on the same batch and entropy, with the run's solved score as "correct"; EGPO's
    entropy figures are logged beside, with no bonus applied; the entropy keys are dropped before the update."""
    from egpo.advantage.gtpo import grpo_s_advantage, gtpo_advantage

    trainer = make_trainer("algorithm.adv_estimator=egpo", "algorithm.entropy_source=actor",
                           f"algorithm.egpo_method={method}")
    actor_entropy = torch.rand(BS, L, generator=torch.Generator().manual_seed(3))
    trainer.actor_rollout_wg = RecordingWorkerGroup(actor_entropy)
    batch = make_batch(False)
    batch.batch["token_level_rewards"][1, 4] = 0.5  # a half score: correct only when the solved score is 0.5
    rewards, mask = batch.batch["token_level_rewards"].clone(), batch.batch["response_mask"].clone()
    uid = batch.non_tensor_batch["uid"].copy()
    advantage_step.set_solved_score(solved)
    try:
        batch, _, output = run_step(trainer, batch, bypass=False)
    finally:
        advantage_step.set_solved_score(1.0)
    entropy = actor_entropy * mask
    if method == "gtpo":
        expected = gtpo_advantage(rewards, mask, uid, entropy, solved_score=solved, alpha1=1.0, alpha2=0.1,
                                  norm="per_sign")
    else:
        expected = grpo_s_advantage(rewards, mask, uid, entropy, solved_score=solved, beta1=1.0, beta2=0.1)
    assert torch.allclose(batch.batch["advantages"], expected.advantages.float(), atol=1e-6)
    metrics = output.meta_info["metrics"]
    assert metrics[f"egpo/{method}/correct_frac"] == pytest.approx((4 + (solved == 0.5)) / BS)
    assert metrics["egpo/applied_bonus_mean"] == 0.0 and "egpo/cot_entropy_mean" in metrics
    assert ACTOR_ENTROPY not in trainer.actor_rollout_wg.update_keys


def test_the_registered_estimator_refuses_gtpo_and_grpo_s_in_one_line():
    """verl's registry route (a stock trainer) cannot hand the run's solved score: refused, never computed with a
    default the run did not set."""
    from egpo.advantage.registry import EntropyNotSuppliedError, egpo_estimator

    batch = make_batch(True)
    for method in ("gtpo", "grpo_s"):
        with pytest.raises(EntropyNotSuppliedError, match=f"egpo_method={method} counts a response correct at the "
                                                          "run's solved score"):
            egpo_estimator(batch.batch["token_level_rewards"], batch.batch["response_mask"],
                           index=batch.non_tensor_batch["uid"], config={"egpo_method": method},
                           token_level_entropy=batch.batch[ROLLOUT_ENTROPY], responses=batch.batch["responses"])


METHOD_ARMS = {  # the method's every part: the advantage's kind, its form and span, STARE, the 80/20 selection
    "egpo": [],
    "egpo_token_response_span": ["algorithm.egpo_granularity=token", "algorithm.egpo_span=response"],
    "stare": ["algorithm.egpo_token_reweighting=stare"],
    "gtpo": ["algorithm.egpo_method=gtpo"],
    "grpo_s": ["algorithm.egpo_method=grpo_s"],
    "top_entropy": ["algorithm.egpo_token_selection=top_entropy"],
    "top_entropy_per_response": ["algorithm.egpo_token_selection=top_entropy_per_response"],
}


@pytest.mark.parametrize("arm", sorted(METHOD_ARMS))
def test_the_trainer_and_verls_registry_compute_one_method_or_the_registry_refuses_in_one_line(arm):
    """One home for the method (egpo.advantage.method): the trainer's advantage step and the registered estimator,
    handed the same batch, entropy, old log probs and solved score, give the same advantages; what the registry
    cannot hand back (the update mask) or was not handed (old log probs, the solved score) is refused in one line,
    never computed without it."""
    from egpo.advantage.method import MethodInputError, compose_method
    from egpo.advantage.registry import EntropyNotSuppliedError, egpo_estimator

    trainer = make_trainer("algorithm.adv_estimator=egpo", "algorithm.entropy_source=rollout", *METHOD_ARMS[arm])
    batch = make_batch(True)
    old_log_probs = -2 * torch.rand(BS, L, generator=torch.Generator().manual_seed(5)) * batch.batch["response_mask"]
    batch.batch["old_log_probs"] = old_log_probs
    handed = dict(token_level_rewards=batch.batch["token_level_rewards"].clone(),
                  response_mask=batch.batch["response_mask"].clone(), index=batch.non_tensor_batch["uid"].copy(),
                  token_level_entropy=batch.batch[ROLLOUT_ENTROPY].clone(), responses=batch.batch["responses"].clone(),
                  prompts=batch.batch["prompts"].clone(), old_log_probs=old_log_probs.clone(), solved_score=1.0)
    advantage_step.compute_egpo_advantage_step(batch, trainer.config.algorithm)
    config = trainer.config.algorithm
    if arm.startswith("top_entropy"):
        with pytest.raises(EntropyNotSuppliedError) as refused:
            egpo_estimator(config=config, **handed)
        assert str(refused.value).count("\n") == 0 and "cannot hand on to the actor" in str(refused.value)
        assert UPDATE_MASK in batch.batch.keys()  # the trainer's step puts it in the batch
        return
    advantages, returns = egpo_estimator(config=config, **handed)
    assert torch.equal(advantages, batch.batch["advantages"]) and torch.equal(returns, batch.batch["returns"])
    for needed in {"stare": ["old_log_probs"], "gtpo": ["solved_score"], "grpo_s": ["solved_score"]}.get(arm, []):
        with pytest.raises(EntropyNotSuppliedError) as refused:
            egpo_estimator(config=config, **{**handed, needed: None})
        assert str(refused.value).count("\n") == 0 and "this caller does not hand it" in str(refused.value)
        with pytest.raises(MethodInputError):  # the method itself, whoever calls it
            compose_method(EgpoSettings.of(config).algo, entropy=handed["token_level_entropy"],
                           **{k: v for k, v in handed.items() if k != "token_level_entropy"} | {needed: None})


def test_the_trainers_step_names_what_its_batch_lacks_for_the_method():
    """STARE without verl's old log probs in the batch: the method's own refusal, said as the trainer's, with the fix."""
    trainer = make_trainer("algorithm.adv_estimator=egpo", "algorithm.entropy_source=rollout",
                           "algorithm.egpo_token_reweighting=stare")
    batch = make_batch(True)
    with pytest.raises(advantage_step.MissingEntropyError) as refused:
        advantage_step.compute_egpo_advantage_step(batch, trainer.config.algorithm)
    assert str(refused.value).startswith("algorithm.egpo_token_reweighting=stare reads each token's surprisal from "
                                         "verl's old_log_probs")
    assert str(refused.value).endswith(": this batch lacks it; run through `python -m egpo.main`")
