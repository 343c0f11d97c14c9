"""Micro-batch counts that Megatron's pipeline schedules accept.

Megatron's interleaved (VPP) schedule raises unless, with ``G`` the
``microbatch_group_size_per_vp_stage`` and ``M`` the micro-batch count,
``pp_size <= G <= M`` and ``M % G == 0 or M % G >= pp_size``. The
non-interleaved schedules (1F1B and no pipelining) accept any ``M >= 1``.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_dpsched.core.validation import ArgumentError, require_int

MAX_PIPELINE = 2**16
"""Upper bound on pipeline stages, virtual stages and the interleaved group size (a guard on absurd sizes)."""


@dataclass(frozen=True, kw_only=True)
class PipelineLayout:
    """The pipeline shape that constrains the per-step micro-batch count."""

    pp_size: int = 1
    """Pipeline-parallel stages."""
    vpp_size: int = 1
    """Virtual pipeline stages (model chunks) per pipeline rank; > 1 means the interleaved schedule."""
    microbatch_group_size_per_vp_stage: int | None = None
    """Micro-batches run on one model chunk before moving to the next; Megatron defaults it to ``pp_size``."""

    @property
    def group_size(self) -> int:
        """The group size Megatron will use (``pp_size`` when unset)."""
        group = self.microbatch_group_size_per_vp_stage
        return self.pp_size if group is None else group

    @property
    def interleaved(self) -> bool:
        """Whether Megatron runs the interleaved schedule for this layout."""
        return self.vpp_size > 1

    def validate(self) -> None:
        """Raise ``ValueError`` naming the argument if Megatron could never run this layout.

        Without virtual stages the group size is ignored, as Megatron ignores it.
        """
        require_int("pp_size", self.pp_size, maximum=MAX_PIPELINE)
        require_int("vpp_size", self.vpp_size, maximum=MAX_PIPELINE)
        group = self.microbatch_group_size_per_vp_stage
        if group is not None:
            require_int("microbatch_group_size_per_vp_stage", group, maximum=MAX_PIPELINE)
        if self.vpp_size > 1 and self.pp_size < 2:
            raise ArgumentError(
                f"vpp_size={self.vpp_size} needs pp_size >= 2: Megatron's interleaved schedule "
                f"runs only with pipeline parallelism (got pp_size={self.pp_size})",
                argument="vpp_size",
            )
        if self.interleaved and group is not None and group < self.pp_size:
            raise ArgumentError(
                f"microbatch_group_size_per_vp_stage={group} is below pp_size={self.pp_size}; "
                "Megatron's interleaved schedule needs pp_size <= microbatch_group_size_per_vp_stage",
                argument="microbatch_group_size_per_vp_stage",
            )

    def is_legal(self, num_microbatches: int) -> bool:
        """Whether Megatron's schedule for this layout accepts ``num_microbatches``."""
        if num_microbatches < 1:
            return False
        if not self.interleaved:
            return True
        group = self.group_size
        remainder = num_microbatches % group
        return num_microbatches >= group and (remainder == 0 or remainder >= self.pp_size)

    def align(self, num_microbatches: int) -> int:
        """The smallest legal micro-batch count that is at least ``num_microbatches``."""
        count = max(1, num_microbatches)
        if not self.interleaved:
            return count
        group = self.group_size
        if count <= group:
            return group
        remainder = count % group
        if remainder == 0 or remainder >= self.pp_size:
            return count
        return count + self.pp_size - remainder

    def next_legal(self, num_microbatches: int) -> int:
        """The smallest legal micro-batch count strictly above ``num_microbatches``."""
        return self.align(num_microbatches + 1)

