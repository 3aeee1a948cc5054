"""egpo adds no memory to the actor update: for every arm of ``--arms entropy_methods``, the update a run egpo
prepared computes no update-time entropy unless the arm itself asks for one (an entropy bonus), and then the bytes it
saves for the backward pass are what the preflight states.

Three levels, each against what verl itself does:

* the config egpo prepares (both stacks): ``actor.calculate_entropy`` stays false on the qwen3 recipes;
* verl 0.9.1's own ``RayPPOTrainer._update_actor`` (through egpo's trainer; the worker group a recorder): the flag it
  sends the workers is false for every arm but the entropy bonus;
* verl 0.9.1's real engine-worker actor (FSDP2 on the CPU) at Qwen3's vocabulary (151,936): the bytes autograd saves
  in one update (``saved_tensors_hooks``), per arm, against GRPO's. The entropy bonus saves what the preflight states
  for that actor (its fp32 padded forward: one fp32 softmax, ``tokens x vocabulary x 4`` bytes) more; every other arm
  nothing vocabulary-sized.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from conftest import VERL
from test_preflight import composed, overrides_for, workdir  # noqa: F401 - the data the qwen3 recipes read

from egpo.ablation import ARM_SETS, ARMS, seed_overrides
from ray_cluster import free_ports
from egpo.preflight.run_facts import with_facts

ARMS_UNDER_TEST = ARM_SETS["entropy_methods"]
BONUS_ARMS = {"grpo_entbonus"}  # the arms whose method is the update-time entropy
QWEN3_VOCAB = 151_936
HIDDEN = 32  # the wide model's: its embedding (hidden x vocabulary) is no micro-batch's token count (64)


def prepared(recipe: str, arm: str, demo, monkeypatch):
    from egpo.preflight.prepare import prepare_config

    # verl 0.7.1 runs the 80/20 rule on its engine workers only (egpo.preflight.token_selection.check_token_selection)
    engine = ("trainer.use_legacy_worker_impl=disable",) if VERL == "0.7.1" and "8020" in arm else ()
    cfg = composed(recipe, [*overrides_for(recipe, demo), *engine, *ARMS[arm], *seed_overrides(1)])
    return prepare_config(cfg, preflight=None)


@pytest.mark.parametrize("recipe", ["qwen3_1.7b", "qwen3_4b", "qwen3_8b"])
def test_egpo_never_turns_on_the_update_entropy(recipe, demo, workdir, monkeypatch):  # noqa: F811
    monkeypatch.chdir(workdir)
    for arm in ARMS_UNDER_TEST:
        cfg = prepared(recipe, arm, demo, monkeypatch)
        actor = cfg.actor_rollout_ref.actor
        assert actor.calculate_entropy is False, arm
        assert (float(actor.entropy_coeff) != 0) is (arm in BONUS_ARMS), arm


class RecordingActorGroup:
    def __init__(self):
        self.calculate_entropy = []

    def update_actor(self, td):
        from verl.utils import tensordict_utils as tu

        self.calculate_entropy.append(tu.get_non_tensor_data(td, "calculate_entropy", None))
        return tu.get_tensordict({}, non_tensor_dict={"metrics": {"mfu": 0.0}})


def verl_update_flag(cfg) -> bool:
    """What verl 0.9.1's own _update_actor sends the actor workers as ``calculate_entropy``, through egpo's trainer."""
    import numpy as np
    from verl import DataProto

    from egpo.settings import EgpoSettings
    from egpo.trainer.ray_trainer import EgpoRayPPOTrainer
    from egpo.trainer.thought_watch import NeverThinksWatch

    trainer = object.__new__(EgpoRayPPOTrainer)
    trainer.config, trainer.actor_rollout_wg = cfg, RecordingActorGroup()
    trainer.egpo = EgpoSettings.from_algorithm(cfg.algorithm)
    trainer.never_thinks = NeverThinksWatch(active=False)
    batch = DataProto.from_dict({
        "input_ids": torch.ones(2, 6, dtype=torch.long), "attention_mask": torch.ones(2, 6, dtype=torch.long),
        "position_ids": torch.arange(6).expand(2, -1).clone(), "responses": torch.ones(2, 3, dtype=torch.long),
        "response_mask": torch.ones(2, 3), "advantages": torch.zeros(2, 3), "old_log_probs": torch.zeros(2, 3),
        **({"egpo_update_mask": torch.ones(2, 3)} if trainer.egpo.selects_tokens else {}),
    }, non_tensors={"uid": np.array(["a", "a"], dtype=object)})
    trainer._update_actor(batch)
    (flag,) = trainer.actor_rollout_wg.calculate_entropy
    return bool(flag)


@pytest.mark.skipif(VERL != "0.9.1", reason="verl 0.7.1's legacy worker reads the same two keys from its own config "
                                            "(dp_actor.update_policy), checked above")
def test_verls_own_update_call_asks_for_no_entropy_but_the_bonus(demo, workdir, monkeypatch):  # noqa: F811
    monkeypatch.chdir(workdir)
    for arm in ARMS_UNDER_TEST:
        assert verl_update_flag(prepared("qwen3_4b", arm, demo, monkeypatch)) is (arm in BONUS_ARMS), arm


# --- the real actor update at Qwen3's vocabulary (verl 0.9.1's engine worker) ---------------------------------------


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory):
    """A one-layer Qwen3 with Qwen3's vocabulary (151,936): the logits are Qwen3-sized per token."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from egpo.demo.tokenizer import build_tokenizer

    out = tmp_path_factory.mktemp("wide_model")
    tokenizer = build_tokenizer()
    config = Qwen3Config(vocab_size=QWEN3_VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                         tie_word_embeddings=True, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, torch_dtype="float32", attn_implementation="eager")
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def is_embedding(tensor) -> bool:
    """The tied embedding, which FSDP all-gathers anew for every micro-batch: a parameter, not an activation."""
    return tensor.numel() == HIDDEN * QWEN3_VOCAB


def saved_bytes(fn, skip=lambda tensor: False) -> int:
    """``bench/saved_tensors.py``'s counter (the verl update bench counts with it too)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "saved_tensors.py"
    spec = importlib.util.spec_from_file_location("egpo_bench_saved_tensors", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.saved_bytes(fn, skip)


@pytest.mark.skipif(VERL != "0.9.1", reason="verl 0.9.1's engine worker (the one whose update backpropagates the "
                                            "entropy)")
def test_the_update_saves_nothing_vocabulary_sized_but_the_bonus(wide_model, demo, workdir, monkeypatch):  # noqa: F811
    from engine_actor import B, P, R, batch, compose_actor_config, engine_batch, make_worker, select_cpu
    from verl.utils import tensordict_utils as tu

    from egpo.preflight.scale import entropy_saved_bytes
    from egpo.settings import EgpoSettings
    from egpo.preflight.actor_entropy import prepare_actor_entropy
    from egpo.preflight.findings import refuse

    monkeypatch.chdir(workdir)
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_ports(1)[0]}", rank=0, world_size=1)
    base = compose_actor_config(wide_model)
    restore = select_cpu(base)
    try:
        measured, flags = {}, {}
        for arm in ARMS_UNDER_TEST:
            flags[arm] = verl_update_flag(prepared("qwen3_4b", arm, demo, monkeypatch))
            # the arm's actor settings on the CPU actor, prepared by egpo as a run would be
            actor_overrides = [o for o in ARMS[arm] if o.startswith("actor_rollout_ref.actor.")]
            cfg = OmegaConf.merge(base, OmegaConf.from_dotlist(actor_overrides))
            refuse(prepare_actor_entropy(*with_facts(cfg, settings=EgpoSettings.from_algorithm(cfg.algorithm), say=lambda line: None)))
            worker = make_worker(cfg, lr=1e-3)
            data = batch()
            data.batch["input_ids"] = torch.randint(0, QWEN3_VOCAB, (B, P + R), generator=torch.Generator()
                                                    .manual_seed(2))
            td = engine_batch(data)
            tu.assign_non_tensor(td, calculate_entropy=flags[arm])
            measured[arm] = saved_bytes(lambda: worker.train_mini_batch(td), skip=is_embedding)
        tokens = B * (P + R)  # every micro-batch of the mini-batch, together
        logits = tokens * QWEN3_VOCAB * 4
        for arm in ARMS_UNDER_TEST:
            extra = measured[arm] - measured["grpo"]
            if arm in BONUS_ARMS:
                expected = entropy_saved_bytes(cfg, tokens, QWEN3_VOCAB)
                assert expected == logits  # the CPU actor's fp32 padded path: one fp32 softmax
                assert abs(extra - expected) < 0.02 * expected, (arm, extra, expected)
            else:
                assert extra < 0.05 * logits, (arm, extra, measured)
    finally:
        restore()
        if created:
            dist.destroy_process_group()


@pytest.mark.parametrize("chunked", [True, False])
def test_verls_entropy_on_bf16_logits_saves_what_the_preflight_states(chunked, demo, workdir, monkeypatch):  # noqa: F811
    """The GPU recipes' path (remove-padding, bf16 logits): verl's chunked entropy saves each chunk's fp32 upcast
    and softmax (2 x tokens x vocabulary x 4 B), its plain entropy one bf16 softmax; the preflight's figure for the
    qwen3_4b recipe's config, at these tokens, is the one measured."""
    from verl.utils import torch_functional as verl_F

    from egpo.preflight.scale import entropy_saved_bytes

    monkeypatch.chdir(workdir)
    cfg = prepared("qwen3_4b", "grpo_entbonus", demo, monkeypatch)
    cfg.actor_rollout_ref.actor.entropy_from_logits_with_chunking = chunked
    tokens = 512
    logits = torch.randn(tokens, QWEN3_VOCAB, dtype=torch.bfloat16).requires_grad_()
    logits_storage = logits.untyped_storage().data_ptr()

    def entropy():
        if chunked:
            return verl_F.entropy_from_logits_with_chunking(logits, chunk_size=128)
        return verl_F.entropy_from_logits(logits)

    # the logits themselves are saved by the log-prob path in every arm: what the entropy adds is the rest
    extra = saved_bytes(entropy, skip=lambda t: t.untyped_storage().data_ptr() == logits_storage)
    expected = entropy_saved_bytes(cfg, tokens, QWEN3_VOCAB)
    assert expected == tokens * QWEN3_VOCAB * (8 if chunked else 2)
    assert abs(extra - expected) < 0.02 * expected, (extra, expected)
