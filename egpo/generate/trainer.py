"""``GenerationTrainer``: egpo's trainer with ``fit`` replaced by a generation loop (no update, no optimizer step).

verl's task runner builds it as it builds the trainer (data sets, workers, rollout replicas, reward loop), so the
rollout path is the training run's: the same engines, agent loop, sampling and rollout entropy
(:mod:`egpo.rollout.agent_loop`). ``fit`` loads the checkpoint it was given (verl's own loader), pushes those weights
to the rollout, and then, a chunk of prompts at a time:

* generate: ``generate_sequences`` on ``n`` copies of each prompt; each row's tokens, the engine's per-token entropy
  (``rollout_entropy``) and log probabilities (``rollout_log_probs``) and its reward (``rm_scores``) are written as one
  part file (:mod:`egpo.runs.generation_store`);
* score: another run's rows, part by part, teacher-forced through the actor (verl's old-log-prob recompute: the
  entropy of ``logits / temperature``, the log probability of each given token), written with the same ``index``,
  ``sample`` and ``response_ids``.

Parts already written are skipped, so a rerun finishes an interrupted one.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from verl import DataProto
from verl.protocol import pad_dataproto_to_divisor, unpad_dataproto

from egpo.errors import EntropyError
from egpo.generate.options import GenerateOptions
from egpo.generate.progress import Progress
from egpo.runs.generation_rows import arrow_lists, padded, rows_table
from egpo.runs.generation_store import SampleStore, iter_parts
from egpo.keys import ROLLOUT_ENTROPY
from egpo.trainer.ray_trainer import EgpoRayPPOTrainer

ROLLOUT_LOG_PROBS = "rollout_log_probs"


class GenerationTrainer(EgpoRayPPOTrainer):
    trains = False

    def init_workers(self):
        """A score run never samples: it builds no rollout servers where verl can leave them out (no engine started,
        no weights loaded into one; :func:`egpo.compat.rollout.no_rollout_servers`)."""
        from egpo.compat.rollout import no_rollout_servers

        if GenerateOptions.from_config(self.config).mode != "score":
            return super().init_workers()
        with no_rollout_servers() as empty:
            result = super().init_workers()
        if empty:
            print("[egpo] generate --score: no rollout servers started (the actor's recompute only)", flush=True)
        return result

    def fit(self):
        options = GenerateOptions.from_config(self.config)
        store = SampleStore(options.out)
        self.global_steps = 0
        self._load_checkpoint()  # trainer.resume_mode / resume_from_path: set by egpo.generate from --checkpoint
        started = time.monotonic()
        if options.mode == "score":
            rows = self._score(options, store)
        else:
            self.checkpoint_manager.update_weights(self.global_steps)  # the rollout samples from this model
            rows = self._generate(options, store)
        store.finish({"rows": rows, "tokens": store.response_tokens(), "global_steps": self.global_steps,
                      "seconds_last_attempt": round(time.monotonic() - started, 1)})

    # ------------------------------------------------------------------ generate
    def _generate(self, options: GenerateOptions, store: SampleStore) -> int:
        from verl.utils.dataset.rl_dataset import collate_fn

        dataset = self.val_dataset if options.split == "val" else self.train_dataset
        total = len(dataset) if options.max_rows is None else min(options.max_rows, len(dataset))
        parts = math.ceil(total / options.chunk)
        rollout = self.config.actor_rollout_ref.rollout
        progress = Progress("generate", total_rows=total * options.n, unit_rows="samples")
        for k in range(parts):
            lo, hi = k * options.chunk, min(total, (k + 1) * options.chunk)
            if store.has_part(k):
                progress.skip((hi - lo) * options.n)
                continue
            batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(lo, hi)]))
            # the data-set row is the row's index: each request's seed (hf) and its sample key are its own
            batch.non_tensor_batch["index"] = np.arange(lo, hi).astype(object)
            batch.non_tensor_batch["uid"] = np.array([str(i) for i in range(lo, hi)], dtype=object)
            gen = self._get_gen_batch(batch)
            gen.meta_info.update(global_steps=self.global_steps, temperature=rollout.temperature)
            gen = gen.repeat(repeat_times=options.n, interleave=True)  # rows come back in this order
            gen, pad = pad_dataproto_to_divisor(gen, int(rollout.agent.num_workers))
            out = unpad_dataproto(self.async_rollout_manager.generate_sequences(gen), pad_size=pad)
            missing = [key for key in (ROLLOUT_ENTROPY, ROLLOUT_LOG_PROBS) if key not in out.batch.keys()]
            if missing:
                raise EntropyError(f"the rollout returned no {' or '.join(missing)}: egpo.generate needs a rollout "
                                   "that returns per-token entropy (hf, sglang, vllm, through egpo's agent-loop "
                                   "manager) with actor_rollout_ref.rollout.calculate_log_probs=true")
            width = out.batch["prompts"].shape[1]
            mask = out.batch["response_mask"]
            scores = out.batch["rm_scores"].sum(-1).tolist() if "rm_scores" in out.batch.keys() else None
            store.write_part(k, rows_table(
                index=np.repeat(np.arange(lo, hi), options.n), prompts=out.batch["prompts"],
                prompt_mask=out.batch["attention_mask"][:, :width], responses=out.batch["responses"],
                response_mask=mask, entropy=out.batch[ROLLOUT_ENTROPY], log_prob=out.batch[ROLLOUT_LOG_PROBS],
                scores=scores, tokenizer=self.tokenizer))
            progress.advance(len(out), int(mask.sum()))
        progress.close()
        return total * options.n

    # ------------------------------------------------------------------ score
    def _score(self, options: GenerateOptions, store: SampleStore) -> int:
        from egpo.runs.generation_store import read_done

        source_rows = int(read_done(options.source).get("rows", 0)) or None
        progress = Progress("score", total_rows=source_rows, unit_rows="samples")
        # the recompute splits each worker's share into micro-batches of the rollout's log-prob size (verl's engine
        # workers need whole ones): the batch is padded to a multiple of both, the padding dropped after
        rollout = self.config.actor_rollout_ref.rollout
        micro = 1 if rollout.get("log_prob_use_dynamic_bsz", False) else int(
            rollout.get("log_prob_micro_batch_size_per_gpu", None) or 1)
        divisor = int(self.config.trainer.n_gpus_per_node) * int(self.config.trainer.nnodes) * micro
        temperature = float(rollout.temperature)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        rows = 0
        for k, table in iter_parts(options.source, columns=["index", "sample", "prompt_ids", "response_ids", "score"]):
            rows += table.num_rows
            if store.has_part(k):
                progress.skip(table.num_rows)
                continue
            prompt_ids, prompt_lengths = arrow_lists(table.column("prompt_ids"))
            response_ids, response_lengths = arrow_lists(table.column("response_ids"))
            prompts, prompt_mask = padded(prompt_ids, prompt_lengths, int(prompt_lengths.max()), pad_id, left=True)
            responses, response_mask = padded(response_ids, response_lengths, max(1, int(response_lengths.max())),
                                              pad_id, left=False)
            attention = torch.cat([prompt_mask, response_mask], dim=1)
            batch = DataProto.from_dict(tensors={
                "prompts": prompts, "responses": responses, "response_mask": response_mask,
                "input_ids": torch.cat([prompts, responses], dim=1), "attention_mask": attention,
                "position_ids": (attention.cumsum(dim=1) - 1).clamp(min=0),
            }, meta_info={"temperature": temperature, "global_token_num": attention.sum(-1).tolist()})
            batch, pad = pad_dataproto_to_divisor(batch, divisor)
            recomputed, _ = self._compute_old_log_prob(batch)
            recomputed = unpad_dataproto(recomputed, pad_size=pad)
            store.write_part(k, rows_table(
                index=table.column("index").to_numpy(), sample=table.column("sample").to_numpy(),
                prompts=prompts, prompt_mask=prompt_mask, responses=responses, response_mask=response_mask,
                entropy=recomputed.batch["entropys"], log_prob=recomputed.batch["old_log_probs"],
                scores=table.column("score"),
                tokenizer=self.tokenizer))
            progress.advance(table.num_rows, int(response_mask.sum()))
        progress.close()
        return rows
