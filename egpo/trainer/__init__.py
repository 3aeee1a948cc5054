"""Where entropy is kept, dropped and spent: the trainer subclass, its config checks and metrics."""
