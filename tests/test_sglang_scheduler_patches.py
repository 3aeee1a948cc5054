"""The scheduler-side entropy patches, driven through sglang 0.5.6.post2's real output-processor methods.

A minimal scheduler object carries only the attributes those methods read; requests are real ``Req``
objects going prefill -> decode -> finish, streaming and not, with the overlap scheduler's extra step.
"""

from types import SimpleNamespace

import pytest
import torch

from egpo.patching import remove_all
from egpo.rollout.entropy import EntropyOptions
from egpo.rollout.sglang.versions import SglangPatchTargetError
from sglang_required import import_sglang_sampler

import_sglang_sampler()
from sglang.srt.disaggregation.utils import DisaggregationMode  # noqa: E402
from sglang.srt.layers.logits_processor import LogitsProcessorOutput  # noqa: E402
from sglang.srt.managers import schedule_batch  # noqa: E402
from sglang.srt.managers import scheduler_output_processor_mixin as mixin  # noqa: E402
from sglang.srt.managers.schedule_batch import FINISH_ABORT, Req  # noqa: E402
from sglang.srt.managers.utils import GenerationBatchResult  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

from egpo.rollout.sglang import scheduler_patches  # noqa: E402
from egpo.rollout.sglang.sampler_patch import SAMPLER_FORWARD  # noqa: E402


def remove_patches():
    remove_all((*scheduler_patches.PATCHES, SAMPLER_FORWARD))


class RecordingSender:
    def __init__(self):
        self.sent = []

    def send_output(self, output, *args, **kwargs):
        self.sent.append(output)


class Event:
    def __init__(self, log):
        self.log = log

    def record(self):
        self.log.append("record")

    def synchronize(self):
        self.log.append("sync")


def default_server_args(**overrides) -> SimpleNamespace:
    """sglang's ServerArgs defaults (whatever fields this sglang version has), with ``overrides``."""
    import dataclasses

    from sglang.srt.server_args import ServerArgs

    defaults = {f.name: f.default for f in dataclasses.fields(ServerArgs) if f.default is not dataclasses.MISSING}
    return SimpleNamespace(**{**defaults, **overrides})


class MiniScheduler(mixin.SchedulerOutputProcessorMixin):
    def __init__(self, overlap: bool):
        self.is_generation = True
        self.enable_overlap = overlap
        self.num_generated_tokens = 0
        self.token_to_kv_pool_allocator = SimpleNamespace(free_group_begin=lambda: None, free_group_end=lambda: None)
        self.server_args = default_server_args(disaggregation_decode_enable_offload_kvcache=False,
                                               enable_request_time_stats_logging=False, decode_log_interval=40,
                                               multi_item_scoring_delimiter=None)
        self.tree_cache = SimpleNamespace(cache_unfinished_req=lambda *a, **k: None)
        self.model_config = SimpleNamespace(is_multimodal_gen=False, think_end_id=None)  # the last: sglang 0.5.12
        self.stream_interval = 1
        self.spec_algorithm = SpeculativeAlgorithm.NONE
        self.disaggregation_mode = DisaggregationMode.NULL
        self.attn_tp_rank = 0
        self.send_to_detokenizer = RecordingSender()
        self.forward_ct_decode = 0
        # sglang 0.5.12's additions (absent from 0.5.6.post2's mixin, harmless there)
        self.enable_hisparse = False
        self.enable_overlap_mlx = False
        self.enable_metrics = False
        self.dp_rank = 0
        self.decode_offload_manager = None
        self.hisparse_coordinator = None

    def current_scheduler_metrics_enabled(self):
        return False

    # sglang 0.5.12 reports the scheduler's load with every output and its stats after each batch
    def get_loads(self, *args, **kwargs):
        return None

    def report_prefill_stats(self, *args, **kwargs):
        pass

    def report_decode_stats(self, *args, **kwargs):
        pass


@pytest.fixture(autouse=True)
def patched(monkeypatch):
    monkeypatch.setattr(mixin, "release_kv_cache", lambda *a, **k: None)
    server_args = default_server_args(speculative_algorithm=None, disaggregation_mode="null")
    monkeypatch.setattr(schedule_batch, "get_global_server_args", lambda: server_args)
    scheduler_patches.apply_scheduler_patches(EntropyOptions())
    yield
    remove_patches()


def make_req(rid, max_new_tokens, stream):
    params = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)
    params.normalize(None)
    req = Req(rid, "", [1, 2, 3], params, return_logprob=True, stream=stream, vocab_size=100)
    req.logprob_start_len = len(req.origin_input_ids)
    return req


def result_for(reqs, step, log, overlap):
    n = len(reqs)
    out = LogitsProcessorOutput(next_token_logits=None, next_token_logprobs=-torch.arange(n, dtype=torch.float32) - step)
    # each value encodes (step, request): which token of which request it belongs to
    out.next_token_entropy = torch.tensor([100.0 * step + int(r.rid) for r in reqs])
    result = GenerationBatchResult(
        logits_output=out,
        next_token_ids=torch.full((n,), 10 + step),
        copy_done=Event(log) if overlap else None,
        extend_input_len_per_req=[3] * n,
        extend_logprob_start_len_per_req=[3] * n,
    )
    if overlap:
        result.copy_to_cpu(return_logprob=True)
    return result


def batch(reqs):
    return SimpleNamespace(reqs=reqs, return_logprob=True, spec_algorithm=SpeculativeAlgorithm.NONE,
                           is_v2_eagle=False, decoding_reqs=None,
                           is_spec_v2=False, prefill_stats=None, dp_cooperation_info=None,  # sglang 0.5.12
                           batch_size=lambda: len(reqs))


def received(sched):
    """What the tokenizer side accumulates per rid: (log probs, entropy), concatenated over messages."""
    got = {}
    for msg in sched.send_to_detokenizer.sent:
        assert msg.output_token_entropy_val is not None
        for rid, lp, ent in zip(msg.rids, msg.output_token_logprobs_val, msg.output_token_entropy_val, strict=True):
            assert len(lp) == len(ent)  # aligned in every message
            old = got.get(rid, ([], []))
            got[rid] = (old[0] + lp, old[1] + ent)
    return got


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("stream", [False, True])
def test_prefill_decode_finish(overlap, stream):
    sched = MiniScheduler(overlap)
    reqs = [make_req("0", 3, stream), make_req("1", 5, stream)]
    log = []
    sched.process_batch_result_prefill(batch(reqs), result_for(reqs, 0, log, overlap))
    step = 1
    while not all(r.finished() for r in reqs) or step < 6:  # overlap: finished requests ride one more step
        live = [r for r in reqs if not r.finished() or overlap]
        sched.process_batch_result_decode(batch(live), result_for(live, step, log, overlap))
        step += 1
        if step > 8:
            break
    got = received(sched)
    for i, req in enumerate(reqs):
        n = req.sampling_params.max_new_tokens
        assert req.finished() and len(req.output_ids) == n
        logprobs, entropy = got[req.rid]
        assert len(entropy) == len(logprobs) == n
        assert entropy[0] == 0 * 100 + i  # the prefill token's entropy is first
        assert entropy[-1] == (n - 1) * 100 + i  # the last token's entropy arrived before the final message
        assert getattr(req, scheduler_patches.REQ_VALUES) is None  # nothing left on a finished request
    if overlap:
        assert log[:2] == ["record", "sync"]  # the entropy copy was issued before copy_done.record()


def test_aborted_request_sends_what_it_has_and_keeps_nothing():
    sched = MiniScheduler(overlap=False)
    reqs = [make_req("0", 10, False), make_req("1", 10, False)]
    sched.process_batch_result_prefill(batch(reqs), result_for(reqs, 0, [], False))
    sched.process_batch_result_decode(batch(reqs), result_for(reqs, 1, [], False))
    reqs[1].to_finish = FINISH_ABORT("aborted by the trainer")
    sched.process_batch_result_decode(batch(reqs), result_for(reqs, 2, [], False))
    assert reqs[1].finished() and not reqs[0].finished()
    logprobs, entropy = received(sched)["1"]
    assert len(entropy) == len(logprobs) == 3
    assert getattr(reqs[1], scheduler_patches.REQ_VALUES) is None


def test_copy_to_cpu_moves_the_entropy_before_the_event():
    log = []
    out = LogitsProcessorOutput(next_token_logits=None, next_token_logprobs=torch.zeros(2))

    class Moved:
        def to(self, device, non_blocking=False):
            log.append(("copy", device, non_blocking))
            return self

    out.next_token_entropy = Moved()
    GenerationBatchResult(logits_output=out, next_token_ids=torch.zeros(2), copy_done=Event(log)).copy_to_cpu(True)
    assert log == [("copy", "cpu", True), "record"]


def test_patches_are_idempotent_and_guarded(monkeypatch):
    scheduler_patches.apply_scheduler_patches(EntropyOptions(top_k=4))  # second application: no double wrap
    decode = scheduler_patches.DECODE
    assert decode.applied() and not hasattr(decode.original(), "__egpo_patch__")  # wrapped once, around sglang's
    remove_patches()

    def altered(self, batch, result, extra):
        return None

    monkeypatch.setattr(mixin.SchedulerOutputProcessorMixin, "process_batch_result_decode", altered)
    with pytest.raises(SglangPatchTargetError, match="process_batch_result_decode has parameters"):
        scheduler_patches.apply_scheduler_patches(EntropyOptions())
    # nothing was half-applied
    assert GenerationBatchResult.copy_to_cpu is not scheduler_patches.copy_to_cpu_with_entropy
