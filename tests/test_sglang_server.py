"""egpo's sglang server/replica on top of verl's, without an engine: generate's entropy contract and refusals."""

import asyncio
from types import SimpleNamespace

import pytest

from conftest import bare_sglang_server
from egpo.keys import ROLLOUT_ENTROPY
from sglang_required import import_sglang_sampler

import_sglang_sampler()
from egpo.rollout.sglang.versions import sglang_targets  # noqa: E402

DP_REACHES = sglang_targets().data_parallel_reaches_schedulers
from egpo.rollout.sglang.replica import EntropySGLangReplica  # noqa: E402  (through verl's sglang loader)
from egpo.rollout.sglang.limits import UnsupportedRolloutSettingError, refuse_unsupported_settings  # noqa: E402
from egpo.rollout.sglang.server import EntropySGLangHttpServer, capture_entropy  # noqa: E402


class FakeTokenizerManager:
    """Yields what sglang's TokenizerManager yields for a finished, non-streamed request."""

    def __init__(self, entropy_for, tokens=(7, 8, 9), finish="stop"):
        self.entropy_for = entropy_for
        self.tokens, self.finish = list(tokens), finish
        self.requests = []

    async def generate_request(self, obj, request=None):
        self.requests.append(obj)
        tokens = self.tokens
        meta = {"finish_reason": {"type": self.finish}, "output_token_logprobs": [(-0.5, t, None) for t in tokens]}
        entropy = self.entropy_for(tokens)
        if entropy is not None:
            meta["output_token_entropy"] = entropy
        yield {"output_ids": tokens, "meta_info": meta}


def server(entropy_for, **manager):
    s = bare_sglang_server(EntropySGLangHttpServer, max_model_len=64, response_length=16, prompt_length=16)
    s.global_steps = 4
    s.tokenizer_manager = FakeTokenizerManager(entropy_for, **manager)
    capture_entropy(s)
    return s


def generate(s, **params):
    return asyncio.run(s.generate([1, 2, 3], dict(params), request_id="r1"))


def test_entropy_comes_back_with_the_tokens_and_log_probs_only_when_asked():
    s = server(lambda tokens: [0.1 * t for t in tokens])
    out = generate(s, temperature=1.0)
    assert list(out.token_ids) == [7, 8, 9]
    assert out.extra_fields[ROLLOUT_ENTROPY] == pytest.approx([0.7, 0.8, 0.9])
    assert out.log_probs is None
    assert s.tokenizer_manager.requests[-1].return_logprob is True  # asked for, to carry the entropy
    assert list(generate(s, temperature=1.0, logprobs=True).log_probs) == [-0.5, -0.5, -0.5]
    assert s._entropy_by_rid == {}  # nothing kept after a request returns


def test_a_request_aborted_before_its_first_token_is_not_blamed_on_patches():
    """sglang answers an abort in the waiting queue with no tokens and an empty log-prob list (which verl's own
    generate cannot unpack): an empty response with no entropy, not 'missing patches'."""
    for entropy_for in (lambda tokens: [], lambda tokens: None):  # patched manager: []; an older message: absent
        s = server(entropy_for, tokens=(), finish="abort")
        out = generate(s, temperature=1.0)
        assert list(out.token_ids) == [] and out.stop_reason == "abort" and out.log_probs is None
        assert out.extra_fields[ROLLOUT_ENTROPY] == [] and out.extra_fields["global_steps"] == 4
        assert s._entropy_by_rid == {}


def test_only_egpos_own_requests_are_captured():
    """Requests other callers send through the same tokenizer manager (sglang's HTTP routes) leave nothing behind."""
    s = server(lambda tokens: [0.5] * len(tokens))

    async def other_caller():
        async for _ in s.tokenizer_manager.generate_request(SimpleNamespace(rid="http-1"), None):
            pass
        async for _ in s.tokenizer_manager.generate_request(SimpleNamespace(rid=["b-1", "b-2"]), None):
            pass

    asyncio.run(other_caller())
    assert s._entropy_by_rid == {}
    assert generate(s, temperature=1.0).extra_fields[ROLLOUT_ENTROPY] == [0.5, 0.5, 0.5]
    assert s._entropy_by_rid == {}


def test_missing_or_misaligned_entropy_fails_loudly():
    with pytest.raises(RuntimeError, match="without egpo's patches"):
        generate(server(lambda tokens: None))
    with pytest.raises(RuntimeError, match="2 entropy values for 3 tokens"):
        generate(server(lambda tokens: [1.0, 2.0]))


@pytest.mark.parametrize(
    "change, message",
    [
        pytest.param({"data_parallel_size": 2}, "data_parallel_size=2", marks=pytest.mark.skipif(
            DP_REACHES, reason="sglang 0.5.12's data-parallel controller runs egpo's scheduler entry")),
        ({"pipeline_model_parallel_size": 2}, "pipeline_model_parallel_size=2"),
        ({"mtp": SimpleNamespace(enable=True, enable_rollout=True)}, "mtp.enable_rollout=true"),
        pytest.param({"engine_kwargs": {"sglang": {"dp_size": 2}}}, "engine_kwargs.sglang.dp_size=2",
                     marks=pytest.mark.skipif(DP_REACHES, reason="as data_parallel_size")),
        ({"engine_kwargs": {"sglang": {"enable_dp_attention": True}}}, "enable_dp_attention=True"),
        ({"engine_kwargs": {"sglang": {"speculative_algorithm": "EAGLE"}}}, "speculative_algorithm=EAGLE"),
        ({"disaggregation": SimpleNamespace(enabled=True)}, "disaggregation.enabled=false"),
    ],
)
def test_unsupported_settings_are_refused(change, message):
    config = dict(data_parallel_size=1, pipeline_model_parallel_size=1, mtp=SimpleNamespace(enable=False, enable_rollout=False))
    refuse_unsupported_settings(SimpleNamespace(**config))
    with pytest.raises(UnsupportedRolloutSettingError, match=message):
        refuse_unsupported_settings(SimpleNamespace(**{**config, **change}))


def test_replica_serves_egpos_server():
    from egpo.compat.rollout import replica_class

    assert replica_class("sglang") is EntropySGLangReplica
    assert EntropySGLangReplica.__mro__[1].__name__ == "SGLangReplica"


def test_process_entries_are_installed_once_and_picklable():
    import pickle

    import sglang.srt.entrypoints.engine as engine
    from sglang.srt.managers import detokenizer_manager, scheduler

    from egpo.rollout.entropy import EntropyOptions
    from egpo.rollout.sglang import process_entries
    from egpo.rollout.engine_options import read_options
    from egpo.rollout.sglang.versions import sglang_targets

    on_class = sglang_targets().engine_entries_on_class  # sglang 0.5.12: Engine's class attributes too
    assert engine.run_scheduler_process is scheduler.run_scheduler_process
    try:
        process_entries.install_process_entries(EntropyOptions(top_k=7))
        process_entries.install_process_entries(EntropyOptions(top_k=7))
        # this CPU machine: the children's entries carry the stand-ins (0.5.6.post2's also apply the patches)
        assert engine.run_scheduler_process is process_entries.scheduler_entry()
        assert engine.run_detokenizer_process is process_entries.run_detokenizer_process_with_standins
        if on_class:
            assert engine.Engine.run_scheduler_process_func is process_entries.scheduler_entry()
            assert engine.Engine.run_detokenizer_process_func is process_entries.run_detokenizer_process_with_standins
        if sglang_targets().data_parallel_reaches_schedulers:  # its controller process needs the stand-ins too
            assert engine.run_data_parallel_controller_process is process_entries.run_data_parallel_controller_with_standins
        for entry in (engine.run_scheduler_process, engine.run_detokenizer_process):
            assert pickle.loads(pickle.dumps(entry)) is entry  # by reference: the child imports egpo's module
        assert read_options() == EntropyOptions(top_k=7)  # what the spawned process will read
    finally:
        process_entries.remove_process_entries()
    assert engine.run_scheduler_process is scheduler.run_scheduler_process
    assert engine.run_detokenizer_process is detokenizer_manager.run_detokenizer_process
    if on_class:
        assert engine.Engine.run_scheduler_process_func is scheduler.run_scheduler_process
    if sglang_targets().data_parallel_reaches_schedulers:
        from sglang.srt.managers import data_parallel_controller

        assert engine.run_data_parallel_controller_process is data_parallel_controller.run_data_parallel_controller_process


def test_scheduler_entry_warms_the_kernel_before_sglang_builds_its_scheduler(monkeypatch):
    import sglang.srt.managers.scheduler as scheduler

    from egpo.rollout.sglang import process_entries, sampler_patch, scheduler_patches
    from egpo.rollout.sglang.versions import sglang_targets

    if sglang_targets().patches_via_plugin:
        pytest.skip("sglang 0.5.12's scheduler gets the patches from egpo's plugin (test_plugin_...)")
    order = []
    monkeypatch.setattr(scheduler_patches, "apply_scheduler_patches", lambda options: order.append("patch"))
    monkeypatch.setattr(sampler_patch, "warm_sampler_kernel",
                        lambda server_args, gpu_id, options: order.append(("warm", server_args, gpu_id)))
    monkeypatch.setattr(scheduler, "run_scheduler_process", lambda *a, **k: order.append(("sglang", a)))
    process_entries.run_scheduler_process_with_entropy("SERVER_ARGS", "PORT_ARGS", 3, 0, 0, 0, None, "WRITER")
    assert order == ["patch", ("warm", "SERVER_ARGS", 3),
                     ("sglang", ("SERVER_ARGS", "PORT_ARGS", 3, 0, 0, 0, None, "WRITER"))]


def test_plugin_patches_only_the_children_of_an_engine_egpo_launched(monkeypatch):
    """sglang 0.5.12 loads egpo's sglang.srt.plugins entry point in every scheduler process: it patches there (and
    hooks the kernel warm-up before configure_scheduler_process), and nowhere else."""
    import multiprocessing

    from egpo.rollout.sglang import plugin, process_entries, scheduler_patches
    from egpo.rollout.engine_options import ENV_VAR
    from egpo.rollout.sglang.versions import sglang_targets

    if not sglang_targets().patches_via_plugin:
        pytest.skip("sglang 0.5.6.post2 has no plugin group; its scheduler entry applies the patches")
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    process_entries.check_plugin_registered()  # pip install -e . put the entry point where sglang looks
    applied, hooks = [], []
    monkeypatch.setattr(scheduler_patches, "apply_scheduler_patches", lambda options: applied.append(options))
    monkeypatch.setattr(HookRegistry, "register", classmethod(lambda cls, target, hook, kind: hooks.append((target, kind))))
    monkeypatch.setenv(ENV_VAR, '{"top_k": 3, "temperature_scaled": false}')
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: None)
    plugin.load()  # the launching process (sglang's Engine.__init__ loads plugins too)
    assert applied == [] and hooks == []
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())
    plugin.load()  # a scheduler process
    assert [o.top_k for o in applied] == [3]
    assert hooks == [("sglang.srt.managers.scheduler.configure_scheduler_process", HookType.BEFORE)]
    monkeypatch.delenv(ENV_VAR)
    plugin.load()  # another sglang user's engine in the same environment
    assert len(applied) == 1
    monkeypatch.setenv("SGLANG_PLUGINS", "someone_else")
    with pytest.raises(process_entries.SglangPatchTargetError, match="SGLANG_PLUGINS"):
        process_entries.check_plugin_registered()


def test_an_unsupported_sglang_version_or_a_moved_module_names_the_supported_ones(monkeypatch):
    from egpo.rollout.sglang import versions

    with pytest.raises(versions.UnsupportedSglangError,
                       match=r"supports sglang 0\.5\.6\.post2; 0\.5\.12; 0\.5\.20 to 0\.5\.23 \(tested: 0\.5\.6\.post2 "
                             r"\(verl 0\.7\.1\), 0\.5\.12 \(verl 0\.9\.1\), 0\.5\.20 \(verl's next release, no verl stack "
                             r"yet\), 0\.5\.23 .*\); this environment has sglang 0\.5\.19"):
        versions.sglang_targets("0.5.19")
    with pytest.raises(versions.SglangPatchTargetError,
                       match=r"sglang\.srt\.managers\.moved cannot be imported.*0\.5\.6\.post2, 0\.5\.12, 0\.5\.20, 0\.5\.23"):
        versions.import_target("sglang.srt.managers.moved")


def test_warm_sampler_kernel_compiles_for_the_models_vocabulary(demo, monkeypatch):
    import torch
    from torch._dynamo.utils import counters
    from transformers import AutoConfig

    from egpo.rollout import entropy
    from egpo.rollout.entropy import EntropyOptions, token_entropy
    from egpo.rollout.sglang.sampler_patch import kernel_width, warm_sampler_kernel

    monkeypatch.setattr(entropy, "_kernel", {"compiled": None, "fallback_reason": None})
    args = SimpleNamespace(model_path=str(demo / "model"), trust_remote_code=False)
    vocab = AutoConfig.from_pretrained(demo / "model").vocab_size
    assert kernel_width(args, EntropyOptions()) == vocab and kernel_width(args, EntropyOptions(top_k=5)) == 5
    if not torch.cuda.is_available():
        assert warm_sampler_kernel(args, 0, EntropyOptions()) is None  # the CPU samples with the eager kernel
    torch._dynamo.reset()
    assert warm_sampler_kernel(args, 0, EntropyOptions(), device=torch.device("cpu"))["compiled"]
    graphs = counters["stats"]["unique_graphs"]
    token_entropy(torch.randn(5, vocab), compiled=True)  # the first sampled batch compiles nothing
    assert counters["stats"]["unique_graphs"] == graphs


def test_reward_model_and_teacher_replicas_keep_verls_server():
    """verl resolves a generative reward model's and a teacher's replica from the same registry: those keep verl's
    own server (verl's real replica __init__; 0.7.1 has no teacher)."""
    from replica_servers import check_side_models_keep_verls_server
    from verl.workers.rollout.sglang_rollout.async_sglang_server import SGLangHttpServer

    check_side_models_keep_verls_server(EntropySGLangReplica, "sglang", EntropySGLangHttpServer, SGLangHttpServer)
