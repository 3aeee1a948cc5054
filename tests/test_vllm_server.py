"""egpo's vLLM server on verl's real ``vLLMHttpServer.generate`` (0.7.1 with vLLM 0.12.0, 0.9.1 with 0.24.0), its
requests answered through vLLM's real ``OutputProcessor`` from what the patched workers send; and the gated
``vllm.general_plugins`` entry point."""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace

import pytest
from vllm_classes import OutputProcessorEngine, require_vllm

pytestmark = pytest.mark.vllm
require_vllm()
pytest.importorskip("verl", reason="egpo's vLLM server is verl's: the verl stacks' vLLM layers run these tests")

from omegaconf import OmegaConf  # noqa: E402

from egpo.keys import ROLLOUT_ENTROPY  # noqa: E402
from egpo.rollout.engine_options import ENV_VAR, read_options  # noqa: E402
from egpo.patching import remove_all  # noqa: E402
from egpo.rollout.entropy import EntropyOptions  # noqa: E402
from egpo.rollout.vllm import frontend_patch, plugin, sampler_patch  # noqa: E402
from egpo.rollout.vllm.server import EntropyvLLMHttpServer, prepare_entropy_engine  # noqa: E402

STEPS = [([5, 6], [0.5, 0.25]), ([7], [1.5]), ([8, 9], [0.0, 2.0])]


def bare_server(engine):
    """An instance of egpo's server without launching anything: the attributes verl's ``generate`` reads on either
    verl (0.9.1 adds the PD-disaggregation role, the submission gate, determinism and MTP settings)."""
    server = object.__new__(EntropyvLLMHttpServer)
    server.config = OmegaConf.create({"max_model_len": 64, "response_length": 16, "prompt_length": 16,
                                      "enable_rollout_routing_replay": False, "full_determinism": False, "seed": 0,
                                      "mtp": None})
    server.model_config = SimpleNamespace(lora_rank=0, lora={}, processor=None)
    server.engine, server.global_steps, server.replica_rank = engine, 3, 0
    server._disaggregation_role, server._pd_decode_peers = "null", []
    server._submission_paused, server._rejecting, server._admitting = False, False, 0
    return server


@pytest.fixture
def frontend():
    frontend_patch.apply_frontend_patch()
    yield
    remove_all(frontend_patch.PATCHES)


@pytest.mark.parametrize("wants_log_probs", [False, True])
def test_generate_returns_the_entropy_with_the_tokens(frontend, wants_log_probs):
    engine = OutputProcessorEngine(STEPS)
    server = bare_server(engine)
    params = {"temperature": 1.0, **({"logprobs": True} if wants_log_probs else {})}
    output = asyncio.run(server.generate([1, 2, 3], params, "req-1"))
    assert output.token_ids == [5, 6, 7, 8, 9]
    assert output.extra_fields[ROLLOUT_ENTROPY] == pytest.approx([0.5, 0.25, 1.5, 0.0, 2.0])
    assert engine.requests[0].logprobs == 0  # log probs always requested: the entropy rides beside them
    assert (output.log_probs is not None) == wants_log_probs
    if wants_log_probs:
        assert len(output.log_probs) == 5 and all(lp <= 0 for lp in output.log_probs)
    assert server.engine.captured == {}  # nothing per request left


def test_a_front_end_without_the_patch_stops_the_request_with_the_fix(frontend):
    remove_all(frontend_patch.PATCHES)  # nothing attaches egpo_entropy
    server = bare_server(OutputProcessorEngine([([5], [0.5])]))
    with pytest.raises(RuntimeError, match="vllm.general_plugins entry point"):
        asyncio.run(server.generate([1, 2, 3], {"temperature": 1.0}, "req-2"))
    frontend_patch.apply_frontend_patch()


@pytest.mark.parametrize("wants_log_probs", [False, True])
def test_a_worker_without_the_patch_stops_the_request_with_the_fix(frontend, wants_log_probs):
    """The plugin failed to import in the workers' environment (vLLM only logs that): their rows carry no marked
    column; vLLM's front end goes on (no IndexError that would kill the engine for every request) and egpo's server
    stops the request with its message."""
    engine = OutputProcessorEngine(STEPS, patched_worker=False)
    server = bare_server(engine)
    params = {"temperature": 1.0, **({"logprobs": True} if wants_log_probs else {})}
    with pytest.raises(RuntimeError, match="ran without egpo's sampler patch.*vllm.general_plugins entry point"):
        asyncio.run(server.generate([1, 2, 3], params, "req-3"))
    # the engine still answers: the same front end serves the next request
    engine.patched_worker = True
    assert asyncio.run(server.generate([1, 2, 3], params, "req-4")).extra_fields[ROLLOUT_ENTROPY] == \
        pytest.approx([0.5, 0.25, 1.5, 0.0, 2.0])


def test_prepare_exports_the_options_and_patches_the_front_end(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "{}")  # restored afterwards, whatever the server sets
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    rollout = OmegaConf.create({"custom": {"entropy": {"top_k": 7, "temperature_scaled": True}},
                                "pipeline_model_parallel_size": 1, "engine_kwargs": {"vllm": {}}})
    try:
        assert prepare_entropy_engine(rollout) == EntropyOptions(top_k=7, temperature_scaled=True)
        assert read_options() == EntropyOptions(top_k=7, temperature_scaled=True)
        assert "VLLM_USE_V2_MODEL_RUNNER" not in os.environ  # the model runner stays vLLM's choice
        from vllm.v1.engine.logprobs import LogprobsProcessor

        assert frontend_patch.UPDATE.applied()
        assert LogprobsProcessor._update_sample_logprobs is frontend_patch.UPDATE.current()
    finally:
        remove_all(frontend_patch.PATCHES)


def test_plugin_acts_only_for_an_engine_egpo_launched(monkeypatch):
    from importlib.metadata import entry_points

    from vllm.v1.sample.sampler import Sampler

    from egpo.rollout.vllm import runner_v2_patch, worker_entropy
    from egpo.rollout.vllm.versions import vllm_targets

    v2_sampler = __import__("vllm.v1.worker.gpu.sample.sampler", fromlist=["Sampler"]).Sampler
    assert "egpo.rollout.vllm.plugin:load" in {e.value for e in entry_points(group="vllm.general_plugins")}
    monkeypatch.delenv(ENV_VAR, raising=False)
    plugin.load()
    assert not sampler_patch.FORWARD.applied()  # any other vLLM user: untouched
    assert not hasattr(Sampler.forward, "__egpo_patch__") and not hasattr(v2_sampler.__call__, "__egpo_patch__")
    monkeypatch.setenv(ENV_VAR, '{"top_k": 3, "temperature_scaled": false}')
    try:
        plugin.load()
        assert getattr(Sampler.forward, "__egpo_patch__", None) is sampler_patch.FORWARD
        # Model Runner V2's sampler too, where egpo serves it (0.24.0+): whichever runner vLLM picks is patched
        assert (getattr(v2_sampler.__call__, "__egpo_patch__", None) is runner_v2_patch.CALL) is \
            vllm_targets().serves_runner_v2
        assert worker_entropy.current_options() == EntropyOptions(top_k=3)
    finally:
        remove_all(sampler_patch.PATCHES)
        remove_all(runner_v2_patch.PATCHES)
    assert os.environ[ENV_VAR]


def run_config(adv_estimator="egpo", source="rollout"):
    return OmegaConf.create({"algorithm": {"adv_estimator": adv_estimator, "entropy_source": source},
                             "actor_rollout_ref": {"rollout": {"name": "vllm"}}})


def test_a_run_that_reads_the_rollout_entropy_gets_egpos_vllm_replica(monkeypatch):
    """egpo's replica (serving egpo's server) where the run reads vLLM's entropy; verl's own everywhere else, in the
    place where this verl chooses replicas (0.7.1: egpo's manager presets it; 0.9.1: verl's registry by name)."""
    from verl.workers.rollout.replica import get_rollout_replica_class
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMReplica

    from egpo.compat.rollout import prepare_manager, register_replicas, replica_class
    from egpo.compat.versions import verl_stack, verl_version
    from egpo.rollout.agent_loop import EntropyAgentLoopManager
    from egpo.rollout.vllm.replica import EntropyvLLMReplica

    assert EntropyvLLMReplica.__mro__[1] is vLLMReplica
    monkeypatch.setattr(vLLMReplica, "__init__", lambda self, *args, **kwargs: None)
    assert EntropyvLLMReplica().server_class.__ray_metadata__.modified_class.__name__ == "EntropyvLLMHttpServer"

    for config, expected in ((run_config(), EntropyvLLMReplica), (run_config(source="actor"), vLLMReplica),
                             (run_config(adv_estimator="grpo"), vLLMReplica)):
        assert replica_class("vllm", config) is expected
        if verl_stack(verl_version()).manager_owns_replicas:
            manager = EntropyAgentLoopManager.__new__(EntropyAgentLoopManager)
            prepare_manager(manager, config)
            assert manager.rollout_replica_class is expected
        else:
            register_replicas(config)
            assert get_rollout_replica_class("vllm") is expected
    register_replicas(run_config(source="actor"))  # leave verl's own loader in place


def test_reward_model_and_teacher_replicas_keep_verls_server():
    """A generative reward model's or a teacher's vLLM replica (resolved from the same registry) keeps verl's own
    server (verl's real replica __init__; 0.7.1 has no teacher)."""
    from replica_servers import check_side_models_keep_verls_server
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    from egpo.rollout.vllm.replica import EntropyvLLMReplica

    check_side_models_keep_verls_server(EntropyvLLMReplica, "vllm", EntropyvLLMHttpServer, vLLMHttpServer)
