"""The entropy probe's math on a tiny real model (Qwen3 architecture, float64), with a real AdamW."""

import numpy as np
import pytest
import torch

from egpo.demo.build import build_model
from egpo.probe.adamw import adamw_step_parts
from egpo.probe.attribution import block_totals, sequence_kernel
from egpo.probe.step_probe import AdamWStepProbe, dot64, grads_of
from egpo.probe.surrogate import (
    leave_one_out_coefficients,
    sequence_entropy_surrogate,
    sequence_log_probs,
    token_entropy_surrogate,
)

P_LEN, R_LEN, N, GROUP = 4, 8, 8, 2


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("probe") / "model")


def fresh_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", torch_dtype=torch.float64).train()


def batch(seed=0, vocab=80):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (N, P_LEN + R_LEN), generator=g)
    mask = torch.ones(N, R_LEN, dtype=torch.float64)
    mask[1, -3:] = 0  # a shorter response
    return ids, mask


def response_logits(model, ids):
    return model(input_ids=ids).logits[:, P_LEN - 1 : -1]


def seq_log_probs(model, ids, mask):
    logp = torch.log_softmax(response_logits(model, ids), dim=-1)
    token = logp.gather(-1, ids[:, P_LEN:].unsqueeze(-1)).squeeze(-1)
    return sequence_log_probs(token, mask)


def pg_loss(model, ids, mask, adv):
    """verl's on-policy token-mean policy-gradient loss at ratio 1: -(1/Z) sum_i A_i S_i."""
    return -(adv * seq_log_probs(model, ids, mask)).sum() / mask.sum()


def token_entropy(model, ids, mask):
    return token_entropy_surrogate(response_logits(model, ids), mask)


def params_of(model):
    return [p for p in model.parameters() if p.requires_grad]


def test_adamw_parts_sum_to_the_real_step(model_path):
    model = fresh_model(model_path)
    params = params_of(model)
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.05)
    ids, mask = batch()
    for step in range(3):
        before = [p.detach().clone() for p in params]
        m_prev = [opt.state[p]["exp_avg"].clone() if p in opt.state else torch.zeros_like(p) for p in params]
        opt.zero_grad()
        pg_loss(model, ids, mask, torch.randn(N, dtype=torch.float64)).backward()
        torch.nn.utils.clip_grad_norm_(params, 0.05)
        opt.step()
        parts = adamw_step_parts(before, [p.grad for p in params], m_prev, [opt.state[p]["exp_avg_sq"] for p in params],
                                 step=step + 1, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05)
        for k, p in enumerate(params):
            summed = parts.fresh[k] + parts.momentum[k] + parts.weight_decay[k]
            torch.testing.assert_close(summed, p.detach() - before[k], rtol=1e-9, atol=1e-15)
        if step == 0:
            assert all(m.abs().sum() == 0 for m in parts.momentum)  # no momentum before the first step


def test_bilinearity_kernel_form_equals_two_backward_dot_form(model_path):
    model = fresh_model(model_path)
    params = params_of(model)
    ids, mask = batch(seed=1)
    adv = torch.randn(N, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    a = -adv / mask.sum()  # loss = sum_i a_i S_i
    s = seq_log_probs(model, ids, mask)
    c = leave_one_out_coefficients(s)
    precond = [torch.rand_like(p) + 0.1 for p in params]

    # kernel form: one gradient per sequence
    per_seq = [grads_of(s[j], params, retain_graph=True) for j in range(N)]
    kernel = sequence_kernel(per_seq, precond)
    kernel_form = -float(c.double() @ kernel @ a)

    # dot form: two backward passes
    u = grads_of(sequence_entropy_surrogate(seq_log_probs(model, ids, mask)), params)
    g = grads_of(pg_loss(model, ids, mask, adv), params)
    dot_form = -dot64(u, [pk * gk for pk, gk in zip(precond, g)])
    assert abs(kernel_form - dot_form) <= 1e-6 * abs(dot_form)

    # block totals from per-group aggregated gradients, against the kernel's blocks
    groups = [list(range(k, k + GROUP)) for k in range(0, N, GROUP)]
    s = seq_log_probs(model, ids, mask)
    group_u = [grads_of((c[idx] * s[idx]).sum(), params, retain_graph=True) for idx in groups]
    group_g = [grads_of((a[idx] * s[idx]).sum(), params, retain_graph=True) for idx in groups]
    blocks = block_totals(group_u, group_g, precond)
    same = -sum(float(c[idx].double() @ kernel[np.ix_(idx, idx)] @ a[idx]) for idx in groups)
    assert blocks["total"] == pytest.approx(dot_form, rel=1e-6)
    assert blocks["same_prompt"] == pytest.approx(same, rel=1e-6)
    assert blocks["same_prompt"] + blocks["cross_prompt"] == pytest.approx(blocks["total"], rel=1e-12)


def test_leave_one_out_coefficients():
    s = torch.tensor([1.0, 2.0, 4.0])
    c = leave_one_out_coefficients(s)
    assert torch.allclose(c, -(s - torch.tensor([3.0, 2.5, 1.5])) / 3)


def run_steps(model_path, lr, steps=20):
    """Predicted vs realised change of verl's actor/entropy on the trained contexts, over real AdamW steps."""
    torch.manual_seed(0)
    model = fresh_model(model_path)
    params = params_of(model)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    probe = AdamWStepProbe(opt)
    ids, mask = batch(seed=3)
    gen = torch.Generator().manual_seed(4)
    predicted, realised, plan = [], [], []
    for _ in range(steps):
        h_before = token_entropy(model, ids, mask)
        u = grads_of(h_before, params)
        v_prev = [opt.state[p]["exp_avg_sq"].clone() if p in opt.state else torch.zeros_like(p) for p in params]
        opt.zero_grad()
        pg_loss(model, ids, mask, torch.randn(N, dtype=torch.float64, generator=gen)).backward()
        opt.step()
        with torch.no_grad():
            realised.append(float(token_entropy(model, ids, mask) - h_before.detach()))
        predicted.append(probe.predict(u).total)
        # the plan's preconditioner: fresh gradient only, P = 1 / (sqrt(v_{t-1}) + eps)
        plan.append(dot64(u, [-lr * p.grad / (v.sqrt() + 1e-8) for p, v in zip(params, v_prev)]))
    return np.array(predicted), np.array(realised), np.array(plan)


def fit(pred, real):
    r = float(np.corrcoef(pred, real)[0, 1])
    slope = float((pred * real).sum() / (pred * pred).sum())  # realised = slope * predicted
    return r, slope


def test_first_order_accuracy_at_small_and_large_learning_rates(model_path):
    pred, real, plan = run_steps(model_path, lr=1e-4)
    r, slope = fit(pred, real)
    assert r >= 0.99 and abs(slope - 1) <= 0.05, (r, slope)
    # the plan's Adam preconditioner does measurably worse on the same steps
    r_plan, slope_plan = fit(plan, real)
    assert abs(slope_plan - 1) > 10 * abs(slope - 1) or r_plan < r - 0.05, (r_plan, slope_plan, r, slope)

    pred_big, real_big, _ = run_steps(model_path, lr=3e-2)
    r_big, slope_big = fit(pred_big, real_big)
    assert r_big < r or abs(slope_big - 1) > abs(slope - 1), (r_big, slope_big)  # curvature shows
    print(f"lr 1e-4: r={r:.5f} slope={slope:.4f}; plan r={r_plan:.3f} slope={slope_plan:.3g}; "
          f"lr 3e-2: r={r_big:.3f} slope={slope_big:.3f}")


def test_probe_parts_add_up_and_refuse_other_optimizers(model_path):
    model = fresh_model(model_path)
    params = params_of(model)
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1)
    probe = AdamWStepProbe(opt)
    ids, mask = batch(seed=5)
    for _ in range(2):
        u = grads_of(token_entropy(model, ids, mask), params)
        opt.zero_grad()
        pg_loss(model, ids, mask, torch.randn(N, dtype=torch.float64)).backward()
        opt.step()
        pred = probe.predict(u)
    assert pred.momentum != 0 and pred.weight_decay != 0
    assert pred.fresh + pred.momentum + pred.weight_decay == pytest.approx(pred.total, rel=1e-9)
    assert set(pred.as_metrics()) == {"probe/delta_h_pred", "probe/delta_h_pred_fresh",
                                      "probe/delta_h_pred_momentum", "probe/delta_h_pred_weight_decay"}
    with pytest.raises(TypeError, match="AdamW"):
        AdamWStepProbe(torch.optim.SGD(params, lr=0.1))


def test_block_matrix_and_bias_free_variants(model_path):
    from egpo.probe.attribution import block_matrix, fresh_part_variants

    model = fresh_model(model_path)
    params = params_of(model)
    ids, mask = batch(seed=6)
    adv = torch.randn(N, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    s = seq_log_probs(model, ids, mask)
    c, a = leave_one_out_coefficients(s), -adv / mask.sum()
    precond = [torch.rand_like(p) + 0.1 for p in params]
    groups = [list(range(k, k + GROUP)) for k in range(0, N, GROUP)]
    group_u = [grads_of((c[idx] * s[idx]).sum(), params, retain_graph=True) for idx in groups]
    group_g = [grads_of((a[idx] * s[idx]).sum(), params, retain_graph=True) for idx in groups]
    m = block_matrix(group_u, group_g, precond)
    totals = block_totals(group_u, group_g, precond)
    v = fresh_part_variants(m)
    assert v["same_batch"] == pytest.approx(totals["total"], rel=1e-9)
    assert v["same_prompt"] == pytest.approx(totals["same_prompt"], rel=1e-9)
    b = len(groups)
    assert v["cross_prompt"] == pytest.approx(totals["cross_prompt"] * b / (b - 1), rel=1e-9)
    # cross-fitting reads only the off-half blocks: changing a same-half block leaves it alone
    m2 = m.clone()
    m2[0, 1] += 1.0
    assert fresh_part_variants(m2)["cross_fit"] == pytest.approx(v["cross_fit"], rel=1e-12)
    with pytest.raises(ValueError, match="square block matrix"):
        fresh_part_variants(torch.zeros(1, 1))
