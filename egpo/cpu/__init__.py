"""What verl 0.7.1 needs to train on a CPU: a gloo process group, CPU memory stats, the HF rollout."""
