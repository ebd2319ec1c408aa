"""Framework integrations of the training API (optional extras; see README).

- ``slurm_robust.integrations.lightning``: a PyTorch Lightning ``Callback``
  (``pip install slurm-robust[lightning]``).
- ``slurm_robust.integrations.hf``: a transformers ``TrainerCallback``
  (``pip install slurm-robust[hf]``).
"""
