"""The probe around verl 0.9.1's real engine-worker actor (``TrainingWorker.train_mini_batch``, FSDP2 engine on the
CPU, one process): the same checks as around 0.7.1's actor (tests/test_probe_actor.py)."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from conftest import VERL
from probe_figures import CONDITIONED_EPS, REALISED_RESOLUTION, SPLIT_TOLERANCE, assert_same_figures_across_splits

if VERL == "0.7.1":
    pytest.skip("verl 0.7.1's probe runs around DataParallelPPOActor (tests/test_probe_actor.py)", allow_module_level=True)

from engine_actor import (  # noqa: E402
    B, P, R, batch, compose_actor_config, engine_batch, make_worker, on_policy, select_cpu, weights,
)
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding  # noqa: E402

from egpo.demo.build import build_model  # noqa: E402
from egpo.probe.engine_probe import EngineProbe  # noqa: E402
from egpo.probe.settings import ProbeSettings  # noqa: E402
from ray_cluster import free_ports


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("probe_engine") / "model")


@pytest.fixture(scope="module")
def setup(model_path):
    created = False
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_ports(1)[0]}", rank=0, world_size=1)
        created = True
    cfg = compose_actor_config(model_path)
    restore = select_cpu(cfg)
    yield cfg
    restore()
    if created:
        dist.destroy_process_group()


def train(cfg, probe: ProbeSettings | None, lr: float, updates: int = 2, **worker_kw):
    worker = make_worker(cfg, lr, **worker_kw)
    if probe is not None:
        worker.egpo_probe = EngineProbe(worker, probe)
    metrics = [tu.get(worker.train_mini_batch(engine_batch(batch())), "metrics") for _ in range(updates)]
    return worker, metrics


def test_probe_does_not_change_the_update(setup):
    plain, _ = train(setup, None, lr=1e-3)
    probed, metrics = train(setup, ProbeSettings(enable=True), lr=1e-3)
    a, b = weights(plain), weights(probed)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    for m in metrics:
        probe = {k: v for k, v in m.items() if k.startswith("probe/")}
        assert {"probe/delta_h_pred", "probe/delta_h_pred_fresh", "probe/delta_h_pred_momentum",
                "probe/delta_h_pred_weight_decay", "probe/delta_h_realised", "probe/entropy_before"} <= set(probe)
        assert all(math.isfinite(v) for v in probe.values()) and probe["probe/optimizer_steps"] == 1
        parts = probe["probe/delta_h_pred_fresh"] + probe["probe/delta_h_pred_momentum"] + probe["probe/delta_h_pred_weight_decay"]
        assert parts == pytest.approx(probe["probe/delta_h_pred"], rel=1e-4)
        assert abs(probe["probe/delta_h_pred"]) > 1e-9  # a real prediction, not an empty sum
    # verl's own metrics are still there
    assert {"actor/pg_loss", "grad_norm"} <= set(metrics[0])


def test_entropy_before_is_the_token_mean_entropy_verl_computes(setup):
    """The probe's entropy against the engine's own recompute (compute_log_prob's entropy) of the same batch."""
    worker = make_worker(setup, lr=1e-3)
    td = left_right_2_no_padding(batch().to_tensordict())
    tu.assign_non_tensor(td, calculate_entropy=True, compute_loss=False)
    entropy = no_padding_2_padding(tu.get(worker.infer_batch(td), "entropy"), td).double()
    worker.egpo_probe = EngineProbe(worker, ProbeSettings(enable=True, realised=False))
    m = tu.get(worker.train_mini_batch(engine_batch(batch())), "metrics")
    assert m["probe/entropy_before"] == pytest.approx(float(entropy.mean()), rel=1e-6)


def test_prediction_matches_the_realised_change_at_a_small_learning_rate(setup):
    _, metrics = train(setup, ProbeSettings(enable=True), lr=1e-5, updates=3)
    for m in metrics:
        # fp32 weights, float64 reductions: a 1e-5 AdamW step's realised change is resolved to a few percent
        assert m["probe/delta_h_realised"] == pytest.approx(m["probe/delta_h_pred"], rel=0.1), m


def test_every_n_th_update_is_probed(setup):
    _, metrics = train(setup, ProbeSettings(enable=True, every=2, realised=False), lr=1e-5, updates=3)
    assert ["probe/delta_h_pred" in m for m in metrics] == [True, False, True]


def attribution_update(cfg, groups_of: int, dynamic_budget: int | None = None, eps: float | None = None):
    worker = make_worker(cfg, lr=1e-5, clip=1e9, dynamic_budget=dynamic_budget, eps=eps)
    worker.egpo_probe = EngineProbe(worker, ProbeSettings(enable=True, attribution=True))
    data = on_policy(worker, batch(groups_of))  # ratio 1: the update's gradient is the on-policy one
    return worker, tu.get(worker.train_mini_batch(engine_batch(data)), "metrics")


def test_attribution_splits_the_fresh_part_by_prompt_pairs(setup):
    """One on-policy step (ratio 1, no clipping): the attribution's total is the probe's fresh-gradient part."""
    _, m = attribution_update(setup, groups_of=2)
    assert m["probe/attr_same_prompt"] + m["probe/attr_cross_prompt"] == pytest.approx(m["probe/attr_total"], rel=1e-9)
    assert m["probe/attr_total"] == pytest.approx(m["probe/delta_h_pred_fresh"], rel=1e-3)
    assert m["probe/pred_cross_prompt"] == pytest.approx(m["probe/attr_cross_prompt"] * 4 / 3, rel=1e-9)
    assert all(math.isfinite(m[k]) for k in m if k.startswith("probe/"))


def test_probe_splits_by_token_budget_under_dynamic_batch_sizes(setup, monkeypatch):
    """use_dynamic_bsz (every Qwen3 recipe): the probe splits by the token budget as the engine does (verl's
    prepare_micro_batches). A budget of two sequences splits each 4-row prompt group in two; every probe figure and
    the update equal those of the fixed split."""
    from verl.workers.engine import utils as engine_utils

    calls = []
    original = engine_utils.prepare_micro_batches

    def counting(data, *args, **kwargs):
        micro, idx = original(data, *args, **kwargs)
        calls.append((len(data), [len(m) for m in micro]))
        return micro, idx

    monkeypatch.setattr(engine_utils, "prepare_micro_batches", counting)
    fixed_worker, fixed = attribution_update(setup, groups_of=4, eps=CONDITIONED_EPS)
    dynamic_worker, dynamic = attribution_update(setup, groups_of=4, dynamic_budget=2 * (P + R), eps=CONDITIONED_EPS)
    assert (4, [2, 2]) in calls and (B, [2, 2, 2, 2]) in calls  # a prompt group, and the whole batch
    assert_same_figures_across_splits(fixed, dynamic)
    a, b = weights(fixed_worker), weights(dynamic_worker)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-7)


def run_ranks(model_path, out, world: int, port: int, uids: list[str] | None = None) -> dict:
    env = {**os.environ, "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    script = os.path.join(os.path.dirname(__file__), "probe_ranks.py")
    args = [sys.executable, script, str(model_path), str(out)] + ([",".join(uids)] if uids else [])
    procs = [subprocess.Popen(args, env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    with open(out) as f:
        return json.load(f)


def test_two_ranks_with_prompt_groups_across_them_give_the_one_rank_figures(model_path, tmp_path):
    """FSDP2 over two gloo ranks, rows split 4 | 4 and prompt groups of 3, so one group straddles the ranks and the
    ranks hold different numbers of groups and micro-batches. The probe's passes stay collective-safe (no hang) and
    its global groups give the figures of one rank holding the whole batch."""
    one = run_ranks(model_path, tmp_path / "one.json", world=1, port=free_ports(1)[0])
    two = run_ranks(model_path, tmp_path / "two.json", world=2, port=free_ports(1)[0])
    assert two["probe/optimizer_steps"] == one["probe/optimizer_steps"] == 1
    # fp32 rounding alone, the first AdamW step conditioned (CONDITIONED_EPS); entropy_before in one pass each
    for key, rel in {**SPLIT_TOLERANCE, "probe/entropy_before": 1e-9}.items():
        assert math.isfinite(two[key])
        assert two[key] == pytest.approx(one[key], rel=rel), key
    assert two["probe/delta_h_realised"] == pytest.approx(one["probe/delta_h_realised"], abs=REALISED_RESOLUTION)
    assert two["param_checksum"] == pytest.approx(one["param_checksum"], rel=1e-9)
    # control: had each rank grouped only its own rows, the straddling group would count as two, and the same-prompt
    # part would lose its cross-rank pairs: a change far outside the tolerance above
    per_rank = run_ranks(model_path, tmp_path / "split.json", world=1, port=free_ports(1)[0],
                         uids=["p0", "p0", "p0", "p1", "p1b", "p1b", "p2", "p2"])
    assert abs(per_rank["probe/attr_same_prompt"] / one["probe/attr_same_prompt"] - 1) > 0.1
