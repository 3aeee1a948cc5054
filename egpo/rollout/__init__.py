"""Where rollout entropy is born (``entropy.py``) and carried into the batch."""
