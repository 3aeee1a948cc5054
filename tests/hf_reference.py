"""The float64 reference of the engine tests: a Hugging Face forward over prompt + output, plain log-softmax math
(shared by tests/sglang_engine.py and tests/test_sglang_observer_engine.py; imports nothing of egpo's or verl's)."""

from __future__ import annotations


def load_reference_model(model_dir):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    dtype_key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    return AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager",
                                                **{dtype_key: torch.float64}).eval()


def reference(model, prompt_ids, output_ids, *, temperature=1.0, top_k=0, temperature_scaled=False):
    """float64 (entropy, log prob of each output token) from one teacher-forced forward.

    Entropy: of the raw logits (or ``logits / temperature``), over the full vocabulary (or its ``top_k`` largest
    entries, renormalized). Log probs: sglang's definition, ``log_softmax(logits / temperature)`` (raw when greedy).
    """
    import torch

    ids = torch.tensor([list(prompt_ids) + list(output_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].double()
    scaled = logits / temperature if temperature > 0 else logits
    source = scaled if temperature_scaled else logits
    if top_k:
        source = source.topk(top_k, dim=-1).values
    logp = torch.log_softmax(source, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    token_logp = torch.log_softmax(scaled, dim=-1).gather(-1, torch.tensor(output_ids)[:, None])[:, 0]
    return entropy, token_logp
