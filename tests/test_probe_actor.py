"""The probe around verl's real DataParallelPPOActor.update_policy (one process, plain module)."""

import math

import pytest
import torch
import torch.distributed as dist

from conftest import VERL
from probe_figures import CONDITIONED_EPS, assert_same_figures_across_splits

if VERL != "0.7.1":
    pytest.skip(f"verl {VERL} has no DataParallelPPOActor; its probe is tested around the engine's TrainingWorker "
                "(tests/test_probe_engine.py)", allow_module_level=True)
from hydra import compose, initialize_config_module
from omegaconf import open_dict
from tensordict import TensorDict
from verl import DataProto
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.actor import DataParallelPPOActor

from egpo.demo.build import build_model
from egpo.probe.actor_probe import ActorProbe
from egpo.probe.settings import ProbeSettings
from ray_cluster import free_ports

B, P, R = 8, 6, 10


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    created = False
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_ports(1)[0]}", rank=0, world_size=1)
        created = True
    path = build_model(tmp_path_factory.mktemp("probe_actor") / "model")
    with initialize_config_module("egpo.config", version_base=None):
        cfg = compose("egpo_trainer", overrides=[
            "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.rollout.n=1", "actor_rollout_ref.actor.fsdp_config.dtype=float32",  # no bf16 autocast
        ])
    with open_dict(cfg.actor_rollout_ref.actor):
        cfg.actor_rollout_ref.actor.use_remove_padding = False
    yield path, omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    if created:
        dist.destroy_process_group()


def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 80, (B, P + R), generator=g)
    return TensorDict({
        "input_ids": ids, "attention_mask": torch.ones(B, P + R, dtype=torch.long),
        "position_ids": torch.arange(P + R).expand(B, -1).clone(), "responses": ids[:, P:],
        "response_mask": torch.ones(B, R), "old_log_probs": torch.full((B, R), -4.3),
        "advantages": torch.randn(B, R, generator=g),
    }, batch_size=B)


def shard(model):
    """FSDP2 as verl applies it (decoder layers, then the root without resharding after forward)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (1,))
    policy = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    return model


def train(setup, probe: bool, lr: float, updates: int = 2, fsdp2: bool = False):
    from transformers import AutoModelForCausalLM

    path, actor_cfg = setup
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    if fsdp2:
        model = shard(model)
    actor = DataParallelPPOActor(config=actor_cfg, actor_module=model,
                                 actor_optimizer=torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01))
    if probe:
        ActorProbe(actor, ProbeSettings(enable=True), "cpu")
    metrics = [actor.update_policy(DataProto(batch=batch().clone(), meta_info={"temperature": 1.0, "pad_token_id": 0}))
               for _ in range(updates)]
    return model, metrics


@pytest.mark.parametrize("fsdp2", [False, True])
def test_probe_does_not_change_the_update(setup, fsdp2):
    plain, _ = train(setup, probe=False, lr=1e-3, fsdp2=fsdp2)
    probed, metrics = train(setup, probe=True, lr=1e-3, fsdp2=fsdp2)

    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    for (name, a), b in zip(plain.state_dict().items(), probed.state_dict().values()):
        assert torch.equal(local(a), local(b)), name
    for m in metrics:
        probe = {k: v for k, v in m.items() if k.startswith("probe/")}
        assert {"probe/delta_h_pred", "probe/delta_h_pred_fresh", "probe/delta_h_pred_momentum",
                "probe/delta_h_pred_weight_decay", "probe/delta_h_realised", "probe/entropy_before"} <= set(probe)
        assert all(math.isfinite(v) for v in probe.values())
        parts = probe["probe/delta_h_pred_fresh"] + probe["probe/delta_h_pred_momentum"] + probe["probe/delta_h_pred_weight_decay"]
        # fp32 weights: the parts are the step's exact math, the total is the step as rounded to fp32
        assert parts == pytest.approx(probe["probe/delta_h_pred"], rel=1e-4)
        assert abs(probe["probe/delta_h_pred"]) > 1e-9  # a real prediction, not an empty sum


def test_prediction_matches_the_realised_change_at_a_small_learning_rate(setup):
    _, metrics = train(setup, probe=True, lr=1e-5, updates=3)
    for m in metrics:
        # fp32 weights, float64 reductions: a 1e-5 AdamW step's realised change is resolved to a few percent
        assert m["probe/delta_h_realised"] == pytest.approx(m["probe/delta_h_pred"], rel=0.1), m


def test_every_n_th_update_is_probed(setup):
    from transformers import AutoModelForCausalLM

    path, actor_cfg = setup
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    actor = DataParallelPPOActor(config=actor_cfg, actor_module=model, actor_optimizer=torch.optim.AdamW(model.parameters()))
    ActorProbe(actor, ProbeSettings(enable=True, every=2, realised=False), "cpu")
    probed = ["probe/delta_h_pred" in actor.update_policy(DataProto(batch=batch().clone(), meta_info={"temperature": 1.0}))
              for _ in range(3)]
    assert probed == [True, False, True]


def test_settings_are_validated():
    with pytest.raises(ValueError, match=r"unknown key egpo.probe.enabled \(did you mean .enable.\?\)"):
        ProbeSettings.from_config({"enabled": True})
    with pytest.raises(ValueError, match="every must be >= 1"):
        ProbeSettings.from_config({"enable": True, "every": 0})


def test_attribution_splits_the_fresh_part_by_prompt_pairs(setup):
    """One on-policy step (ratio 1, no clipping): the attribution's total is the probe's fresh-gradient part."""
    import dataclasses

    import numpy as np
    from transformers import AutoModelForCausalLM

    path, actor_cfg = setup
    actor_cfg = dataclasses.replace(actor_cfg, grad_clip=1e9)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    actor = DataParallelPPOActor(config=actor_cfg, actor_module=model,
                                 actor_optimizer=torch.optim.AdamW(model.parameters(), lr=1e-5))
    ActorProbe(actor, ProbeSettings(enable=True, realised=False, attribution=True), "cpu")
    data = DataProto(batch=batch().clone(), meta_info={"temperature": 1.0, "pad_token_id": 0, "micro_batch_size": B,
                                                       "use_dynamic_bsz": False})
    data.non_tensor_batch["uid"] = np.array([f"p{i // 2}" for i in range(B)], dtype=object)
    data.batch["old_log_probs"] = actor.compute_log_prob(data)["log_probs"]  # on-policy: ratio 1
    m = actor.update_policy(data)
    assert m["probe/attr_same_prompt"] + m["probe/attr_cross_prompt"] == pytest.approx(m["probe/attr_total"], rel=1e-9)
    assert m["probe/attr_total"] == pytest.approx(m["probe/delta_h_pred_fresh"], rel=1e-3)
    assert m["probe/pred_cross_prompt"] == pytest.approx(m["probe/attr_cross_prompt"] * 4 / 3, rel=1e-9)
    assert all(math.isfinite(m[k]) for k in m if k.startswith("probe/"))


def attribution_update(setup, **actor_changes):
    """One on-policy probed update with attribution (groups of 4 rows) under the given actor settings, its first
    AdamW step conditioned (CONDITIONED_EPS)."""
    import dataclasses

    import numpy as np
    from transformers import AutoModelForCausalLM

    path, actor_cfg = setup
    actor_cfg = dataclasses.replace(actor_cfg, grad_clip=1e9, **actor_changes)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    actor = DataParallelPPOActor(config=actor_cfg, actor_module=model,
                                 actor_optimizer=torch.optim.AdamW(model.parameters(), lr=1e-5, eps=CONDITIONED_EPS))
    ActorProbe(actor, ProbeSettings(enable=True, attribution=True), "cpu")
    data = DataProto(batch=batch().clone(), meta_info={"temperature": 1.0, "pad_token_id": 0, "micro_batch_size": B,
                                                       "use_dynamic_bsz": False})
    data.non_tensor_batch["uid"] = np.array([f"p{i // 4}" for i in range(B)], dtype=object)
    data.batch["old_log_probs"] = actor.compute_log_prob(data)["log_probs"]
    return model, actor.update_policy(data)


def test_probe_splits_by_token_budget_under_dynamic_batch_sizes(setup, monkeypatch):
    """use_dynamic_bsz (every Qwen3 recipe): ppo_micro_batch_size_per_gpu is None; the probe splits by the token
    budget as verl does. A budget of two sequences splits each 4-row prompt group in two; every probe figure and
    the update equal those of the fixed split."""
    from verl.utils import seqlen_balancing

    calls = []
    original = seqlen_balancing.prepare_dynamic_batch

    def counting(data, max_token_len, **kwargs):
        micro, idx = original(data, max_token_len=max_token_len, **kwargs)
        calls.append((len(data), max_token_len, [len(m) for m in micro]))
        return micro, idx

    monkeypatch.setattr(seqlen_balancing, "prepare_dynamic_batch", counting)
    fixed_model, fixed = attribution_update(setup)
    dynamic_model, dynamic = attribution_update(setup, use_dynamic_bsz=True, ppo_micro_batch_size_per_gpu=None,
                                                ppo_max_token_len_per_gpu=2 * (P + R))
    # the probe's own passes went through the budget: whole batch (entropy before/after) and each 4-row group
    probe_calls = [c for c in calls if c[1] == 2 * (P + R)]
    assert (4, 2 * (P + R), [2, 2]) in probe_calls and any(c[0] == B and c[2] == [2, 2, 2, 2] for c in probe_calls)
    assert_same_figures_across_splits(fixed, dynamic)
    for a, b in zip(fixed_model.state_dict().values(), dynamic_model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
