"""Cost of the entropy probe as a ratio to a training step (verl's real DataParallelPPOActor.update_policy).

    python bench/probe.py [--rounds 7] [--batch 16] [--response 32]

One process (gloo, world size 1), the demo Qwen3 in fp32, one optimizer step per update. Reports, per
update: plain update; probe without the realised re-forward (the two-backward form); probe with it; and the
per-sequence kernel K1 (one backward per sequence, the attribution-on-request cost), each as a ratio to the
plain update measured in the same interleaved rounds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--response", type=int, default=32)
    args = parser.parse_args()

    from hydra import compose, initialize_config_module
    from omegaconf import open_dict
    from tensordict import TensorDict
    from transformers import AutoModelForCausalLM
    from verl import DataProto
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.actor import DataParallelPPOActor

    from egpo.demo.build import build_model
    from egpo.probe.actor_probe import ActorProbe
    from egpo.probe.attribution import sequence_kernel
    from egpo.probe.settings import ProbeSettings
    from egpo.probe.step_probe import grads_of

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29671", rank=0, world_size=1)
    B, P, R = args.batch, args.prompt, args.response
    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(Path(tmp) / "model")
        with initialize_config_module("egpo.config", version_base=None):
            cfg = compose("egpo_trainer", overrides=[
                f"actor_rollout_ref.actor.ppo_mini_batch_size={B}", f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={B}",
                "actor_rollout_ref.rollout.n=1", "actor_rollout_ref.actor.fsdp_config.dtype=float32",
            ])
        with open_dict(cfg.actor_rollout_ref.actor):
            cfg.actor_rollout_ref.actor.use_remove_padding = False
        actor_cfg = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(5, 80, (B, P + R), generator=g)
        batch = TensorDict({
            "input_ids": ids, "attention_mask": torch.ones(B, P + R, dtype=torch.long),
            "position_ids": torch.arange(P + R).expand(B, -1).clone(), "responses": ids[:, P:],
            "response_mask": torch.ones(B, R), "old_log_probs": torch.full((B, R), -4.3),
            "advantages": torch.randn(B, R, generator=g),
        }, batch_size=B)

        def actor(probe: ProbeSettings | None):
            model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
            a = DataParallelPPOActor(config=actor_cfg, actor_module=model,
                                     actor_optimizer=torch.optim.AdamW(model.parameters(), lr=1e-5))
            if probe is not None:
                ActorProbe(a, probe, "cpu")
            return a

        configs = {
            "update": actor(None),
            "probe (two-backward)": actor(ProbeSettings(enable=True, realised=False)),
            "probe + realised re-forward": actor(ProbeSettings(enable=True, realised=True)),
        }
        kernel_model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
        params = [p for p in kernel_model.parameters()]

        def run_kernel():
            logp = torch.log_softmax(kernel_model(input_ids=ids).logits[:, P - 1 : -1], dim=-1)
            s = logp.gather(-1, ids[:, P:].unsqueeze(-1)).squeeze(-1).sum(-1)
            per_seq = [grads_of(s[j], params, retain_graph=True) for j in range(B)]
            sequence_kernel(per_seq, [torch.ones_like(p) for p in params])

        times = {name: [] for name in [*configs, "kernel K1 (per-sequence)"]}
        for round_ in range(args.rounds + 1):
            for name, a in configs.items():
                start = time.perf_counter()
                a.update_policy(DataProto(batch=batch.clone(), meta_info={"temperature": 1.0, "pad_token_id": 0}))
                if round_:
                    times[name].append(time.perf_counter() - start)
            start = time.perf_counter()
            run_kernel()
            if round_:
                times["kernel K1 (per-sequence)"].append(time.perf_counter() - start)
    base = statistics.median(times["update"])
    print(f"batch {B} x (prompt {P} + response {R}), demo Qwen3 fp32, {args.rounds} rounds (after one warm-up), medians")
    print("| what | seconds | / plain update |")
    print("|---|---|---|")
    for name, ts in times.items():
        t = statistics.median(ts)
        print(f"| {name} | {t:.4f} | {t / base:.2f}x |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
