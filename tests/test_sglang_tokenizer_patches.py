"""``meta_info["output_token_entropy"]`` through sglang 0.5.6.post2's real ``TokenizerManager._handle_batch_output``."""

import asyncio
import dataclasses
import time
from types import SimpleNamespace

import pytest

from egpo.patching import remove_all
from egpo.rollout.sglang.versions import SglangPatchTargetError
from sglang_required import import_sglang_sampler

import_sglang_sampler()
from sglang.srt.managers.io_struct import BatchStrOutput, GenerateReqInput  # noqa: E402
from sglang.srt.managers.tokenizer_manager import ReqState, TokenizerManager  # noqa: E402

from egpo.rollout.sglang import tokenizer_patches  # noqa: E402


@pytest.fixture(autouse=True)
def patched():
    tokenizer_patches.apply_tokenizer_patches()
    yield
    remove_all(tokenizer_patches.PATCHES)


def manager():
    from sglang.srt.server_args import ServerArgs

    tm = object.__new__(TokenizerManager)
    tm.rid_to_state = {}
    defaults = {f.name: f.default for f in dataclasses.fields(ServerArgs) if f.default is not dataclasses.MISSING}
    tm.server_args = SimpleNamespace(**{**defaults, **dict(weight_version="0", skip_tokenizer_init=True,
                                                           stream_output=False, speculative_algorithm=None,
                                                           enable_lora=False)})
    tm.enable_metrics = False
    tm.dump_requests_folder = None
    tm.crash_dump_folder = None
    return tm


def add_state(tm, rid, return_logprob=True):
    obj = GenerateReqInput(input_ids=[1, 2, 3], rid=rid, return_logprob=return_logprob)
    obj.top_logprobs_num, obj.token_ids_logprob, obj.return_text_in_logprobs = 0, None, False
    fields = {f.name for f in dataclasses.fields(ReqState)}
    if "created_time" in fields:  # sglang 0.5.6.post2
        timing = {"created_time": time.time()}
    else:  # sglang 0.5.12
        from sglang.srt.managers import tokenizer_manager

        timing = {"time_stats": tokenizer_manager.APIServerReqTimeStats()}
    tm.rid_to_state[rid] = ReqState(out_list=[], finished=False, event=asyncio.Event(), obj=obj, **timing)
    return tm.rid_to_state[rid]


def handle(tm, msg) -> None:
    """``TokenizerManager._handle_batch_output`` (a coroutine since sglang 0.5.12)."""
    import inspect

    result = tm._handle_batch_output(msg)
    if inspect.iscoroutine(result):
        asyncio.run(result)


def message(rids, tokens, logprobs, entropy, finished):
    n = len(rids)
    fields = {f.name: [None] * n for f in dataclasses.fields(BatchStrOutput) if f.init and f.name not in ("rids", "http_worker_ipcs")}
    fields.update(
        finished_reasons=[{"type": "length"} if f else None for f in finished],
        output_strs=[""] * n, output_ids=tokens, prompt_tokens=[3] * n, completion_tokens=[len(t) for t in tokens],
        cached_tokens=[0] * n, retraction_counts=[0] * n,
        input_token_logprobs_val=[[] for _ in rids], input_token_logprobs_idx=[[] for _ in rids],
        output_token_logprobs_val=logprobs, output_token_logprobs_idx=tokens,
        output_top_logprobs_val=[[] for _ in rids], output_top_logprobs_idx=[[] for _ in rids],
        input_top_logprobs_val=[[] for _ in rids], input_top_logprobs_idx=[[] for _ in rids],
        output_token_entropy_val=entropy, output_hidden_states=None,
        **({"customized_info": None} if "customized_info" in fields else {}),  # sglang 0.5.12: a dict per batch
    )
    return BatchStrOutput(rids=rids, **fields)


def test_entropy_accumulates_aligned_with_output_logprobs():
    tm = manager()
    a, b = add_state(tm, "a"), add_state(tm, "b")
    handle(tm, message(["a", "b"], [[5], [6, 7]], [[-0.1], [-0.2, -0.3]], [[1.0], [2.0, 2.5]], [False, False]))
    handle(tm, message(["a", "b"], [[8, 9], [4]], [[-0.4, -0.5], [-0.6]], [[1.5, 1.7], [3.0]], [True, True]))
    for state, expected in ((a, [1.0, 1.5, 1.7]), (b, [2.0, 2.5, 3.0])):
        meta = state.out_list[-1]["meta_info"]
        assert meta["output_token_entropy"] == expected
        assert len(meta["output_token_entropy"]) == len(meta["output_token_logprobs"])
        assert [t for _, t, _ in meta["output_token_logprobs"]] == state.output_ids
    assert tm.rid_to_state == {}  # finished states are gone, and the values with them


def test_request_without_logprobs_gets_no_entropy_key():
    tm = manager()
    s = add_state(tm, "a", return_logprob=False)
    handle(tm, message(["a"], [[5]], [[-0.1]], [[1.0]], [True]))
    assert "output_token_entropy" not in s.out_list[-1]["meta_info"]


def test_unpatched_scheduler_sends_none_and_meta_info_stays_verls():
    tm = manager()
    s = add_state(tm, "a")
    handle(tm, message(["a"], [[5]], [[-0.1]], None, [True]))
    assert "output_token_entropy" not in s.out_list[-1]["meta_info"]


def test_idempotent_and_guarded(monkeypatch):
    tokenizer_patches.apply_tokenizer_patches()
    convert = tokenizer_patches.CONVERT
    assert convert.applied() and not hasattr(convert.original(), "__egpo_patch__")  # wrapped once, around sglang's
    remove_all(tokenizer_patches.PATCHES)

    def altered(self, meta_info, state, top_logprobs_num, token_ids_logprob, return_text_in_logprobs, recv_obj):
        return None

    monkeypatch.setattr(TokenizerManager, "convert_logprob_style", altered)
    with pytest.raises(SglangPatchTargetError, match="convert_logprob_style has parameters"):
        tokenizer_patches.apply_tokenizer_patches()
    assert TokenizerManager.add_logprob_to_meta_info is not tokenizer_patches.add_logprob_to_meta_info_with_entropy
