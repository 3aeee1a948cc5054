"""Hugging Face generation on CPU: the reference token-in/token-out provider of ids, log probs and entropy."""
