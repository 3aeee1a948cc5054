"""egpo.generate's parts without Ray: tensors -> rows, the run folder (whole parts, the fingerprint), the checkpoint
it is given, the progress line."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from egpo.generate.options import (CheckpointError, GenerateOptions, check_checkpoint_world_size,
                                   resolve_checkpoint)
from egpo.generate.progress import Progress
from egpo.runner_console import duration
from egpo.runs.generation_rows import arrow_lists, padded, ragged, rows_table, sample_numbers
from egpo.runs.generation_store import COLUMNS, GenerationRunError, SampleStore, iter_parts, part_numbers


class Chars:
    """A tokenizer whose token i is chr(97 + i)."""

    def batch_decode(self, rows, skip_special_tokens=False):
        return ["".join(chr(97 + t) for t in row) for row in rows]


def test_ragged_takes_each_rows_masked_values_in_order():
    import pyarrow as pa

    values = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    mask = torch.tensor([[0, 1, 1], [0, 0, 0], [1, 1, 1]])
    assert ragged(values, mask, pa.int32()).to_pylist() == [[2, 3], [], [7, 8, 9]]


def test_sample_numbers_count_within_each_run_of_a_data_set_row():
    assert sample_numbers(np.array([4, 4, 4, 7, 7, 2])).tolist() == [0, 1, 2, 0, 1, 0]
    assert sample_numbers(np.array([], dtype=np.int64)).tolist() == []


def test_padded_left_and_right():
    ids, mask = padded([5, 6, 7], [2, 1], 3, pad=0, left=True)
    assert ids.tolist() == [[0, 5, 6], [0, 0, 7]] and mask.tolist() == [[0, 1, 1], [0, 0, 1]]
    ids, mask = padded(np.array([5, 6]), np.array([2, 0]), 3, pad=-1, left=False)
    assert ids.tolist() == [[5, 6, -1], [-1, -1, -1]] and mask.tolist() == [[1, 1, 0], [0, 0, 0]]
    with pytest.raises(ValueError, match="more than the width"):
        padded([1, 2, 3, 4], [4], 3, pad=0, left=False)


def test_arrow_lists_give_the_values_in_order_and_each_rows_length():
    import pyarrow as pa

    values, lengths = arrow_lists(pa.chunked_array([pa.array([[1, 2], []]), pa.array([[3]])]))
    assert values.tolist() == [1, 2, 3] and lengths.tolist() == [2, 0, 1]


def chunk_table(scores=(1.0, 0.0)):
    """Two rows of one prompt: left-padded prompts, right-padded responses, as the agent loop returns them."""
    prompts = torch.tensor([[9, 1, 2], [9, 1, 2]])
    prompt_mask = torch.tensor([[0, 1, 1], [0, 1, 1]])
    responses = torch.tensor([[3, 4, 0], [5, 0, 0]])
    response_mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    entropy = torch.tensor([[0.5, 0.25, 9.0], [1.5, 9.0, 9.0]])
    log_prob = -entropy
    return rows_table(index=np.array([3, 3]), prompts=prompts, prompt_mask=prompt_mask, responses=responses,
                      response_mask=response_mask, entropy=entropy, log_prob=log_prob, scores=scores,
                      tokenizer=Chars())


def test_rows_table_holds_exactly_the_masked_tokens_and_their_values():
    rows = chunk_table().to_pylist()
    assert [r["index"] for r in rows] == [3, 3] and [r["sample"] for r in rows] == [0, 1]
    assert rows[0]["prompt_ids"] == [1, 2] and rows[0]["prompt"] == "bc"
    assert rows[0]["response_ids"] == [3, 4] and rows[0]["response"] == "de"
    assert rows[1]["response_ids"] == [5] and rows[1]["entropy"] == [1.5]
    assert rows[0]["entropy"] == [0.5, 0.25] and rows[0]["log_prob"] == [-0.5, -0.25]
    assert [r["score"] for r in rows] == [1.0, 0.0]
    assert chunk_table(scores=None).column("score").null_count == 2
    assert chunk_table().column_names == list(COLUMNS)


FINGERPRINT = {"mode": "generate", "model": "m", "n": 2}


def test_a_part_is_whole_or_absent_and_a_rerun_keeps_the_written_ones(tmp_path):
    store = SampleStore(tmp_path / "run")
    run = store.start(dict(FINGERPRINT), {"entropy": {"of": "logits"}})
    assert run["responses_id"] and not store.has_part(0)
    (store.samples / ".part-00001.parquet.tmp").write_bytes(b"cut off")  # a write a kill interrupted
    store.write_part(0, chunk_table())
    again = SampleStore(tmp_path / "run").start(dict(FINGERPRINT), {"entropy": {"of": "logits"}})
    assert again["responses_id"] == run["responses_id"]  # the same run: its id is kept
    assert not list(store.samples.glob(".*.tmp")) and part_numbers(store.out) == [0]
    assert pq.read_table(store.samples / "part-00000.parquet").to_pylist() == chunk_table().to_pylist()
    assert [k for k, _ in iter_parts(store.out)] == [0]
    assert store.response_tokens() == 3
    with pytest.raises(ValueError, match="lacks"):
        store.write_part(1, chunk_table().drop(["entropy"]))


def test_a_rerun_with_other_settings_is_refused_naming_what_differs(tmp_path, capsys):
    first = SampleStore(tmp_path).start(dict(FINGERPRINT), {})
    # a run that wrote no rows (it failed before its first part) holds nothing: the corrected command takes the folder
    second = SampleStore(tmp_path).start({**FINGERPRINT, "n": 3}, {})
    assert second["fingerprint"]["n"] == 3 and second["responses_id"] != first["responses_id"]
    assert "wrote no rows; it is replaced" in capsys.readouterr().out
    SampleStore(tmp_path).write_part(0, chunk_table())
    with pytest.raises(GenerationRunError, match=r"n: 3 there, 4 now.*give another --out"):
        SampleStore(tmp_path).start({**FINGERPRINT, "n": 4}, {})


def test_the_checkpoint_is_a_step_folder_or_a_runs_latest(tmp_path):
    run = tmp_path / "run"
    for step in (2, 4):
        (run / f"global_step_{step}" / "actor").mkdir(parents=True)
    assert resolve_checkpoint(str(run)) == (run / "global_step_4").resolve()  # no pointer: the last step
    (run / "latest_checkpointed_iteration.txt").write_text("2")
    assert resolve_checkpoint(str(run)) == (run / "global_step_2").resolve()  # verl's resume pointer
    assert resolve_checkpoint(str(run / "global_step_4")) == (run / "global_step_4").resolve()
    with pytest.raises(CheckpointError, match="no verl checkpoint") as refused:
        resolve_checkpoint(str(tmp_path))
    assert "trainer.save_freq=N" in str(refused.value)  # how a run leaves one, not the folder given again
    (tmp_path / "global_step_1").mkdir()
    with pytest.raises(CheckpointError, match="no actor/ folder"):
        resolve_checkpoint(str(tmp_path / "global_step_1"))


def test_a_checkpoint_saved_by_another_world_size_is_refused_with_the_fix(tmp_path):
    from omegaconf import OmegaConf

    step = tmp_path / "global_step_3"
    (step / "actor").mkdir(parents=True)
    for rank in range(2):
        (step / "actor" / f"model_world_size_2_rank_{rank}.pt").write_bytes(b"")
    config = OmegaConf.create({"trainer": {"n_gpus_per_node": 8, "nnodes": 1}})
    with pytest.raises(CheckpointError, match="saved by 2 actor processes.*trainer.n_gpus_per_node=2"):
        check_checkpoint_world_size(step, config)
    check_checkpoint_world_size(step, OmegaConf.create({"trainer": {"n_gpus_per_node": 2, "nnodes": 1}}))


def test_options_travel_in_the_config():
    from omegaconf import OmegaConf

    config = OmegaConf.create({"trainer": {}})
    options = GenerateOptions(out="/x", n=3, chunk=2, max_rows=5)
    options.into(config)
    assert GenerateOptions.from_config(OmegaConf.create(json.loads(json.dumps(OmegaConf.to_container(config))))) \
        == options


def test_progress_line():
    lines = []
    progress = Progress("generate", total_rows=40, unit_rows="samples", echo=lambda line, flush: lines.append(line))
    progress.skip(10)
    progress.advance(10, 500)
    assert lines[-1].startswith("[egpo] generate [##########----------] 20/40 samples, ")
    assert "tok/s" in lines[-1] and lines[-1].endswith(" left")
    assert duration(3725) == "1h02m" and duration(125) == "2m05s" and duration(4) == "4s"


def test_a_score_run_of_a_bypass_arm_prepares_the_fp32_entropy_it_reads(tmp_path, demo):
    """--score reads the actor's recompute. An ablation arm in bypass mode (which skips that recompute in training)
    passes its overrides to the score run: the run is not bypassed, so egpo's fp32 chunked entropy is on and verl's
    compile of it off, as for any run that reads the actor's entropy."""
    from argparse import Namespace

    from test_recipes import RECIPES

    from egpo.ablation.arms import ARMS
    from egpo.generate.setup import generation_config
    from egpo.preflight.actor_entropy import actor_entropy_keys, compiles_chunked_entropy

    chunked = ["actor_rollout_ref.model.use_remove_padding=true",
               "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true"]
    args = Namespace(config_path=str(RECIPES), config_name="cpu_smoke", out=tmp_path / "scored", checkpoint=None,
                     overrides=[f"egpo_demo.out={demo}", *ARMS["egpo_rollout_bypass"], *chunked])
    config, _ = generation_config(args)
    assert config.algorithm.rollout_correction.bypass_mode is False
    assert actor_entropy_keys(config).chunked == "actor_rollout_ref.actor.entropy_from_logits_with_chunking"
    assert compiles_chunked_entropy(config) == []  # verl's compile of the chunked entropy (on by default) turned off


def test_scoring_a_folder_that_holds_no_run_names_a_command_that_makes_one_with_this_commands_recipe(tmp_path):
    """The fix a refusal prints is a command that works as printed: the recipe options the user gave, parsed by
    egpo.generate's own parser to the same recipe and output folder. A folder that does not exist is said to be
    missing instead (tests/test_folders.py): no fix writes into a misspelled name."""
    import shlex

    from egpo.errors import EgpoError
    from egpo.generate.__main__ import parser
    from egpo.generate.setup import prepare_generation

    missing = tmp_path / "gen" / "base"
    argv = ["--config-path", "/somewhere/recipes", "--config-name=cpu_warm", "--score", str(missing), "--out",
            str(tmp_path / "scored"), "trainer.seed=3"]
    with pytest.raises(EgpoError, match=f"--score {missing}: no such folder"):
        prepare_generation(parser().parse_intermixed_args(argv))
    missing.mkdir(parents=True)  # there, and empty
    with pytest.raises(EgpoError) as refused:
        prepare_generation(parser().parse_intermixed_args(argv))
    message = str(refused.value)
    fix = message[message.index("python -m egpo.generate"):]
    args = parser().parse_intermixed_args(shlex.split(fix)[3:])
    assert (args.config_path, args.config_name, args.out) == ("/somewhere/recipes", "cpu_warm", missing)
