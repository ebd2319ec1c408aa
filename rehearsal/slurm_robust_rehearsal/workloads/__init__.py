"""Training workloads for rehearsals: the example GPT (``gpt``, used by
examples/train_gpt.py, the checkpoint benchmarks and tests) and a gloo job that hangs on
demand for the stack-capture tests (``stacks_gloo``)."""
