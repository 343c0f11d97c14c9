"""The torch-free helpers of the Megatron layer, unit-testable without torch (standard library, the pure
core and ``options.py``; a unit test imports each module and finds no ``torch``).

* :mod:`.job_identity`: what a job is (the fields every rank agrees on, a checkpoint's state file).
* :mod:`.over_cap`: samples over the token cap, found before training and counted per step.
* :mod:`.ranks`: which process this is, for messages printed once per job.
* :mod:`.megatron_state`: the one reader of Megatron's private state (its global arguments and timers, the
  arguments a checkpoint was saved with); it imports Megatron only to read a checkpoint.
"""
