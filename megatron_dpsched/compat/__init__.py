"""Drop-ins that put this planner behind the batching entry points of RL frameworks and Megatron-LM's packing scheduler.

* :mod:`megatron_dpsched.compat.slime`: ``build_dp_schedule(args, train_parallel_config, total_lengths,
  global_batch_size, rollout_indices)`` with the argument and return contract of slime's
  ``slime/utils/dp_schedule.py``.
* :mod:`megatron_dpsched.compat.verl`: verl's ``verl/utils/seqlen_balancing.py`` API
  (``rearrange_micro_batches``, ``prepare_dynamic_batch``, ``restore_dynamic_batch``, ...) per rank with the
  token cap always kept, and ``plan_mini_batch(seqlen_list, dp_size=..., max_token_len=...)``, the whole
  mini-batch planned once on the driver instead of per rank.
* :mod:`megatron_dpsched.compat.megatron_packing`: the answer of Megatron-LM's packing-scheduler
  ``get_groups_and_subsamples`` (per micro-batch, per DP x CP rank, the global ids) and its check; the
  Megatron class that uses it is :mod:`megatron_dpsched.megatron.packing_scheduler`
  (``docs/megatron_packing_scheduler.md``).

See ``docs/dropins.md`` for the framework lines to change.

Importing any of them needs neither torch, Megatron, slime nor verl; verl's tensor functions import torch when called.
"""
