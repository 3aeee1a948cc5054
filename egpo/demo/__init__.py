"""A tiny model, tokenizer and task built locally, for running the real trainer on a CPU."""
