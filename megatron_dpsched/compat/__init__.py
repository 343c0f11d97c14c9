"""Drop-ins that put this planner behind the batching entry points of RL frameworks.

* :mod:`megatron_dpsched.compat.slime`: ``build_dp_schedule(args, train_parallel_config, total_lengths,
  global_batch_size, rollout_indices)`` with the argument and return contract of slime's
  ``slime/utils/dp_schedule.py``.
* :mod:`megatron_dpsched.compat.verl`: ``plan_mini_batch(seqlen_list, dp_size=..., max_token_len=...)``,
  verl's dynamic batching (``use_dynamic_bsz``, ``ppo_max_token_len_per_gpu``) planned once for the
  whole mini-batch on the driver instead of per rank.

Both are pure Python (no torch, no Megatron, no slime or verl import), like :mod:`megatron_dpsched.core`.
"""
