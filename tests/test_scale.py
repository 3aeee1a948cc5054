"""The preflight's scale model (egpo.preflight.scale), each figure against an independent reference: the parameter
count against transformers' own Qwen3 (built on the meta device), the checkpoint bytes against a real checkpoint of
the demo model written by verl, the disk findings against hand arithmetic, and the figures docs/gpu.md quotes against
what the preflight prints for the three qwen3 recipes."""

from __future__ import annotations

import re
from collections import namedtuple
from pathlib import Path

import pytest


from conftest import VERL
from hydra import compose, initialize_config_dir

from test_recipes import RECIPES

from egpo.preflight import scale
from egpo.preflight.run_facts import facts
from egpo.preflight.scale import KNOWN_SHAPES, ModelShape, ablation_disk_finding, checkpoint_bytes, model_shape

QWEN3 = ("qwen3_1.7b", "qwen3_4b", "qwen3_8b")
GPU_DOC = Path(__file__).resolve().parent.parent / "docs" / "gpu.md"
Usage = namedtuple("Usage", "total used free")


def recipe(name: str, *overrides: str):
    with initialize_config_dir(config_dir=str(RECIPES), version_base=None):
        return compose(config_name=name, overrides=list(overrides))


def transformers_parameters(fields: dict) -> int:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config(**fields))
    return sum(p.numel() for p in model.parameters())  # tied weights are one parameter


@pytest.mark.parametrize("name", sorted(KNOWN_SHAPES))
def test_parameter_count_is_transformers_own(name):
    shape = ModelShape.from_dict(name, KNOWN_SHAPES[name])
    assert shape.parameters == transformers_parameters(KNOWN_SHAPES[name])


def test_the_recipes_models_are_read_from_egpos_table_and_a_local_model_from_its_config(demo):
    cfg = recipe("qwen3_4b")
    shape = model_shape(cfg)
    assert shape.source == "egpo's table for Qwen/Qwen3-4B" and shape.vocab_size == 151_936
    cfg = recipe("qwen3_4b", f"actor_rollout_ref.model.path={demo / 'model'}")
    shape = model_shape(cfg)
    assert shape.source == str(demo / "model" / "config.json")
    import json

    assert shape.parameters == transformers_parameters(
        {k: v for k, v in json.loads((demo / "model" / "config.json").read_text()).items()
         if k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "tie_word_embeddings")})
    assert model_shape(recipe("qwen3_4b", "actor_rollout_ref.model.path=someone/unknown-model")) is None


@pytest.mark.e2e
@pytest.mark.skipif(VERL == "0.7.1", reason="verl's FSDP checkpoint of the demo model: on verl 0.9.1, whose ablation "
                    "run (the one the resume tests compare with) wrote it")
def test_the_checkpoint_estimate_is_a_real_checkpoints_size(uninterrupted_run, demo):
    """A checkpoint verl wrote for the demo model (the CPU smoke recipe, 3 steps): its model and optimizer shards
    hold exactly the estimate's tensors, the fp32 model and Adam's two moments (12 bytes a parameter; the demo's tied
    embedding is in the model's state dict twice); the files add only pickling's fixed overhead (tens of KB here,
    nothing at a real model's size)."""
    import torch

    checkpoints = sorted((uninterrupted_run / "checkpoints").glob("global_step_*"))
    shards = [p for p in (checkpoints[-1] / "actor").glob("*.pt") if p.name.startswith(("model_", "optim_"))]
    assert {p.name.split("_")[0] for p in shards} == {"model", "optim"}
    tensor_bytes = 0
    for shard in shards:
        state = torch.load(shard, weights_only=False, map_location="cpu")
        stack = [state]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                stack.extend(item.values())
            elif isinstance(item, (list, tuple)):
                stack.extend(item)
            elif hasattr(item, "to_local"):
                stack.append(item.to_local())
            elif isinstance(item, torch.Tensor) and item.dim() > 0:  # Adam's step counts are 0-d
                tensor_bytes += item.numel() * item.element_size()
    cfg = recipe("cpu_smoke", f"egpo_demo.out={demo}")
    estimate = checkpoint_bytes(cfg, model_shape(cfg))
    shape = model_shape(cfg)
    assert shape.tie_word_embeddings
    assert estimate == 12 * shape.parameters + 4 * shape.vocab_size * shape.hidden_size == tensor_bytes
    on_disk = sum(p.stat().st_size for p in shards)
    assert estimate <= on_disk < estimate + 100_000, (on_disk, estimate)


def free_disk(monkeypatch, gb: float):
    monkeypatch.setattr(scale.shutil, "disk_usage", lambda path: Usage(10 * gb * 1e9, 0, int(gb * 1e9)))


def test_an_ablation_that_cannot_hold_its_checkpoints_is_refused(monkeypatch, tmp_path):
    """qwen3_8b, 4 arms x 3 seeds, --keep 2 on a disk with 100 GB free: 98 GB a checkpoint x 3 at the peak x 12."""
    free_disk(monkeypatch, 100)
    cfg = recipe("qwen3_8b")
    per = checkpoint_bytes(cfg, model_shape(cfg))
    assert per == 12 * 8_190_735_360  # Qwen3-8B's embedding is not tied
    finding = ablation_disk_finding(cfg, 12, 2, tmp_path)
    assert finding.level == "error"
    assert f"{per / 1e9:,.1f} GB per checkpoint x 3 at the peak x 12 runs = {per * 36 / 1e9:,.1f} GB" in finding.text
    assert "keep fewer" not in finding.text  # --keep 2 is the fewest a run may keep: no such fix is offered
    free_disk(monkeypatch, 10_000)
    assert ablation_disk_finding(cfg, 12, 2, tmp_path).level == "fact"
    free_disk(monkeypatch, per * 12 * 3.5 / 1e9)  # room for 3 per run, not --keep 4's 5
    finding = ablation_disk_finding(cfg, 12, 4, tmp_path)
    fix = re.search(r"keep fewer: (--keep \d+)", finding.text).group(1)
    assert fix == "--keep 2" and ablation_disk_finding(cfg, 12, 2, tmp_path).level != "error"


def test_a_runs_disk_fix_works_when_applied(monkeypatch, tmp_path):
    """qwen3_4b keeps every checkpoint (verl's default): 200 steps / save_freq 50 = 4 of 48 GB. On 150 GB free the
    preflight refuses it and offers a max_actor_ckpt_to_keep that fits."""
    free_disk(monkeypatch, 150)
    out = f"trainer.default_local_dir={tmp_path}"
    finding = scale.run_checkpoint_finding(recipe("qwen3_4b", out), model_shape(recipe("qwen3_4b")), 200)
    assert finding.level == "error" and "x 4 at the peak" in finding.text
    fix = re.search(r"keep fewer: (\S+)", finding.text).group(1)
    assert fix == "trainer.max_actor_ckpt_to_keep=3"
    fixed = recipe("qwen3_4b", out, fix)
    assert scale.run_checkpoint_finding(fixed, model_shape(fixed), 200).level != "error"


def verl_rotation_peak(keep: int, saves: int, root: Path) -> int:
    """The most checkpoint folders on disk at once when verl's own CheckpointManager rotates ``saves`` saves with
    ``max_ckpt_to_keep=keep`` (its capacity check before each save, the folder written, then its registration)."""
    from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager

    manager = BaseCheckpointManager.__new__(BaseCheckpointManager)  # the rotation needs no model, only its list
    manager.previous_saved_paths, manager.rank = [], 0
    peak = 0
    for step in range(1, saves + 1):
        manager.ensure_checkpoint_capacity(keep)
        path = root / f"global_step_{step}"
        path.mkdir(parents=True)
        peak = max(peak, sum(1 for _ in root.glob("global_step_*")))
        manager.register_checkpoint(str(path), keep)
    return peak


@pytest.mark.parametrize("keep", [1, 2, 3, 4])
def test_the_checkpoint_peak_is_verls_own_rotation(keep, tmp_path):
    assert scale.peak_checkpoints(keep) == verl_rotation_peak(keep, 6, tmp_path)


def test_keep_one_is_counted_at_its_two_checkpoint_peak_and_never_offered(monkeypatch, tmp_path):
    """qwen3_4b on 72 GB free: one 49.8 GB checkpoint fits, two do not. keep=1 holds two while the next is written, so
    it is refused, and no keep is offered (none fits); on 120 GB keep=2 is the fix, and it passes."""
    out = f"trainer.default_local_dir={tmp_path}"
    free_disk(monkeypatch, 72)
    shape = model_shape(recipe("qwen3_4b"))
    finding = scale.run_checkpoint_finding(recipe("qwen3_4b", out), shape, 200)
    assert finding.level == "error" and "keep fewer" not in finding.text, finding.text
    one = scale.run_checkpoint_finding(recipe("qwen3_4b", out, "trainer.max_actor_ckpt_to_keep=1"), shape, 200)
    assert one.level == "error" and "x 2 at the peak" in one.text and "holds 2 while the next is written" in one.text
    free_disk(monkeypatch, 120)
    fix = re.search(r"keep fewer: (\S+)", scale.run_checkpoint_finding(recipe("qwen3_4b", out), shape, 200).text)
    assert fix.group(1) == "trainer.max_actor_ckpt_to_keep=2"
    assert scale.run_checkpoint_finding(recipe("qwen3_4b", out, fix.group(1)), shape, 200).level != "error"


def test_a_resumed_main_jobs_leftover_checkpoints_are_counted(monkeypatch, tmp_path):
    """A main job resumed in its run directory finds the earlier attempt's checkpoints, which verl's rotation never
    removes: the disk line names them and their size on disk; a fresh run (no resume pointer) names none."""
    free_disk(monkeypatch, 2_000)
    for step in (50, 100):
        (tmp_path / f"global_step_{step}" / "actor").mkdir(parents=True)
        (tmp_path / f"global_step_{step}" / "actor" / "model.pt").write_bytes(b"x" * 3_000_000)
    shape = model_shape(recipe("qwen3_4b"))
    fresh = scale.run_checkpoint_finding(recipe("qwen3_4b", f"trainer.default_local_dir={tmp_path}"), shape, 200)
    assert "attempt it resumes" not in fresh.text
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("100")
    resumed = scale.run_checkpoint_finding(recipe("qwen3_4b", f"trainer.default_local_dir={tmp_path}"), shape, 200)
    assert "2 checkpoint(s) of the attempt it resumes, 6.0 MB, stay beside them" in resumed.text, resumed.text
    off = recipe("qwen3_4b", f"trainer.default_local_dir={tmp_path}", "trainer.resume_mode=disable")
    assert "attempt it resumes" not in scale.run_checkpoint_finding(off, shape, 200).text


def test_the_update_entropy_warning_and_its_fix(monkeypatch):
    """An entropy bonus on qwen3_4b: 2 x 34,816 tokens x 151,936 x 4 B = 42.3 GB saved per GPU, warned; the fix
    offered (fused kernels) leaves nothing of it."""
    cfg = recipe("qwen3_4b", "actor_rollout_ref.actor.entropy_coeff=0.001")
    (update,) = [f for f in scale.gpu_findings(cfg, model_shape(cfg), facts(cfg)) if "actor update" in f.text]
    assert update.level == "warning" and f"{2 * 34_816 * 151_936 * 4 / 1e9:,.1f} GB per GPU" in update.text
    fix = update.text.rsplit(": ", 1)[1]
    fixed = recipe("qwen3_4b", "actor_rollout_ref.actor.entropy_coeff=0.001", fix)
    (update,) = [f for f in scale.gpu_findings(fixed, model_shape(fixed), facts(fixed)) if "actor update" in f.text]
    assert update.level == "fact" and "saves 0.0 MB" in update.text
    plain = recipe("qwen3_4b")
    (update,) = [f for f in scale.gpu_findings(plain, model_shape(plain), facts(plain)) if "actor update" in f.text]
    assert update.level == "fact" and "egpo adds nothing" in update.text


DOC_BLOCKS = [(name, ()) for name in QWEN3] + [
    ("qwen3_4b", ("algorithm.entropy_source=rollout", "algorithm.egpo_token_selection=top_entropy")),
    ("qwen3_4b", ("actor_rollout_ref.actor.entropy_coeff=0.001",)),
    ("qwen3_4b", ("trainer.max_actor_ckpt_to_keep=1",)),
]


def doc_lines(name: str, overrides, monkeypatch) -> list[str]:
    """The scale lines the preflight prints for a recipe, with 2 TB free on /data (as docs/gpu.md shows them)."""
    monkeypatch.setattr(scale, "free_bytes", lambda where: (2_000 * 10**9, Path("/data")))
    cfg = recipe(name, *overrides)
    return [f.line().rstrip() for f in scale.scale_findings(cfg, 200, facts(cfg))]


@pytest.mark.parametrize("name, overrides", DOC_BLOCKS)
def test_docs_gpu_shows_what_the_preflight_prints(name, overrides, monkeypatch):
    doc = GPU_DOC.read_text()
    header = " ".join((name, *overrides))
    block = re.search(rf"```text\n# {re.escape(header)}\n(.*?)```", doc, re.S)
    assert block, f"docs/gpu.md has no ```text block starting '# {header}'"
    assert [line.rstrip() for line in block.group(1).splitlines()] == doc_lines(name, overrides, monkeypatch)


PEAK = """
import sys, torch
torch.set_num_threads(1)
from egpo.advantage.stare import stare_weights
from egpo.advantage.token_selection import top_entropy_mask
from egpo.trainer.metrics import entropy_agreement
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage  # a run's driver has verl imported


def status(field):
    line = next(l for l in open("/proc/self/status") if l.startswith(field + ":"))
    return int(line.split()[1]) * 1024


B, L = 256, 16384
entropy = torch.rand(B, L, generator=torch.Generator().manual_seed(0))
actor, mask = entropy + 0.01, torch.ones(B, L)
long_mask = torch.ones(B, L, dtype=torch.long)  # verl's response_mask, int64
if sys.argv[1] == "stare":  # half the responses right, half wrong; below STARE's target entropy: the gate is on
    entropy, old_log_probs = entropy * 0.2, -torch.rand(B, L, generator=torch.Generator().manual_seed(1)) * 3
    advantages = torch.where(torch.arange(B)[:, None] % 2 == 0, 1.0, -1.0).expand(B, L).contiguous()
log_probs = -entropy
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak resident size (VmHWM) starts again from the resident size now
before = status("VmRSS")
if sys.argv[1] == "agreement":
    entropy_agreement(entropy, actor, mask)
elif sys.argv[1] == "surprisal":  # the source itself: the negated rollout log probs
    surprisal = log_probs.neg()
elif sys.argv[1] == "surprisal_agreement":
    entropy_agreement(log_probs.neg(), actor, mask)
elif sys.argv[1] in ("gtpo", "grpo_s"):  # half the responses correct, groups of 16, every token valid
    import numpy as np
    from egpo.advantage.gtpo import grpo_s_advantage, gtpo_advantage  # verl's GRPO: imported above, as in a run
    rewards = torch.zeros(B, L)
    rewards[::2, -1] = 1.0
    index = np.array([f"g{i // 16}" for i in range(B)], dtype=object)
    shape = gtpo_advantage if sys.argv[1] == "gtpo" else grpo_s_advantage
    weights = dict(alpha1=1.0, alpha2=0.1, norm="per_sign") if sys.argv[1] == "gtpo" else dict(beta1=1.0, beta2=0.1)
    shaped = shape(rewards, long_mask, index, entropy, solved_score=1.0, **weights)
elif sys.argv[1] == "stare":
    found = stare_weights(advantages, old_log_probs, entropy, mask, variant="C2", top_ratio=0.1, w=1.1, m=0.9,
                          target_entropy=0.3)
    assert found.gate_on
    reweighted = advantages * found.weights
else:
    top_entropy_mask(entropy, mask, 0.2)
print((status("VmHWM") - before) / (B * L))
"""


PAGES = 0.01  # bytes a token: a few 4 KiB pages over 4M tokens


@pytest.mark.parametrize("what, estimate", [("agreement", scale.AGREEMENT_BYTES), ("selection", scale.SELECTION_BYTES),
                                            ("stare", scale.STARE_BYTES), ("surprisal", scale.SURPRISAL_BYTES),
                                            ("surprisal_agreement", scale.SURPRISAL_BYTES + scale.AGREEMENT_BYTES),
                                            ("gtpo", scale.GTPO_BYTES), ("grpo_s", scale.GRPO_S_BYTES)])
def test_the_driver_figures_are_the_measured_peaks(what, estimate):
    """Each function's peak resident memory per response token, measured in a process of its own at 4M tokens, every
    one valid (the worst case), as Linux counts it (the peak reset just before the call): at most the preflight's
    figure (to a few pages: 4 B is one fp32 tensor, and Linux counts whole pages), and at least half of it (it varies by a few bytes a token from run to run: 33-41 B for the agreement,
    measured over 16 runs; 41-55 B for STARE's weights, over 4; 62-94 B for GTPO, 32-42 B for GRPO-S, over 4)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", PEAK, what], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    measured = float(proc.stdout.strip().splitlines()[-1])
    assert 0.5 * estimate <= measured <= estimate + PAGES, (what, measured, estimate)


def test_a_resumed_main_job_counts_only_the_saves_still_to_come(monkeypatch, tmp_path):
    """Resumed near its end, a run has fewer saves left than its keep: its peak is those saves, not the keep a fresh
    run reaches (a resumed job on a disk that holds it was refused)."""
    free_disk(monkeypatch, 2_000)
    cfg = recipe("qwen3_4b", f"trainer.default_local_dir={tmp_path}", "trainer.save_freq=20",
                 "trainer.max_actor_ckpt_to_keep=3")
    shape = model_shape(cfg)
    assert " x 3 at the peak" in scale.run_checkpoint_finding(cfg, shape, 200).text  # a fresh run: 10 saves, keep 3
    (tmp_path / "global_step_180").mkdir()
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("180")
    resumed = scale.run_checkpoint_finding(cfg, shape, 200).text
    assert " x 1 at the peak" in resumed, resumed  # the step-200 save alone is still to come
    assert scale.saves_per_run(cfg, 200, after=180) == 1 and scale.saves_per_run(cfg, 205, after=180) == 2
    assert scale.saves_per_run(cfg, 200, after=0) == 10 and scale.saves_per_run(cfg, 200, after=200) == 0


def test_the_heads_memory_is_the_runs_at_once_times_verls_step_batch():
    """On a cluster, each running run's driver and trainer (and so its step batch) sit on the head: the ablation says
    how much, by hand arithmetic from the recipe's lengths."""
    from hydra import compose, initialize_config_dir

    from egpo.ablation.cli import head_memory_line
    from egpo.preflight.scale import step_batch_bytes
    from test_recipes import RECIPES

    with initialize_config_dir(config_dir=str(RECIPES), version_base=None):
        config = compose(config_name="qwen3_4b")
    rows = config.data.train_batch_size * config.actor_rollout_ref.rollout.n
    prompt, response = config.data.max_prompt_length, config.data.max_response_length
    # three int64 tensors over the sequence; two int64 and eight fp32 over the response
    assert step_batch_bytes(config) == rows * ((prompt + response) * 24 + response * (16 + 32))
    line = head_memory_line(config, 4)
    assert line.startswith("[ablation] the head node holds each running run's driver and trainer")
    assert f"4 at once x about {step_batch_bytes(config) / 1e9:.1f} GB" in line and line.endswith("--max-parallel")
