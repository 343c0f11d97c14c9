"""The options that shape a plan (validated on construction)."""

from __future__ import annotations

from dataclasses import dataclass

from megatron_dpsched.core.alignment import PipelineLayout
from megatron_dpsched.core.ordering import resolve_order
from megatron_dpsched.core.steptime import StepTimeModel
from megatron_dpsched.core.validation import MAX_TOKENS, ArgumentError, is_real, require_bool, require_int

BALANCE_MODES = ("cost", "tokens", "none")

RankPlan = list[list[int]]
"""One rank's micro-batches in one step, as sample ids."""


@dataclass(frozen=True, kw_only=True)
class ScheduleConfig:
    """Everything besides the samples that shapes a plan."""

    dp_size: int
    """Data-parallel ranks (context parallelism excluded)."""
    global_batch_size: int
    """Samples per optimizer step (groups per step when the plan has groups)."""
    max_tokens_per_gpu: int | None = None
    """Dynamic batching: token cap per micro-batch per GPU (times ``cp_size`` per DP rank)."""
    micro_batch_size: int | None = None
    """Static batching: at most this many samples per micro-batch."""
    cp_size: int = 1
    """Context-parallel ranks sharing each micro-batch."""
    pp_size: int = 1
    """Pipeline-parallel stages."""
    vpp_size: int = 1
    """Virtual pipeline stages per pipeline rank (interleaved schedule when > 1)."""
    microbatch_group_size_per_vp_stage: int | None = None
    """Interleaved schedule group size; ``None`` means ``pp_size`` as in Megatron."""
    balance: str = "cost"
    """``"cost"`` (cost model), ``"tokens"`` (token counts) or ``"none"`` (round-robin)."""
    drop_last: bool = False
    """Drop a trailing partial step (its samples go to ``dropped``) instead of running it smaller."""
    balance_growth: float = 0.0
    """With a token cap: the share by which the micro-batch count may exceed that of one global
    packing when more micro-batches balance the ranks better (heavy tails at high fill). 0 keeps
    the count at or below a global first fit."""
    microbatch_order: str | None = None
    """``"pipeline"`` (cheap micro-batches at both ends), ``"none"``, or ``None``/``"auto"``:
    ``"pipeline"`` when ``pp_size > 1``. Stored resolved."""
    step_time_model: StepTimeModel | None = None
    """With a token cap: choose each step's micro-batch count, packing and order for the smallest
    simulated step time of the slowest rank under this model (spec step 7); ``None`` keeps the fewest
    micro-batches that balance. A dict (the plan's JSON form) is read back as a model."""
    pad_multiple: int = 1
    """Each sample's planned size is its length rounded up to a multiple of this: what collate pads it to
    (``2 * CP``, times TP with sequence parallelism, FP8 alignment). Packing, bounds and the cap count
    planned sizes; costs stay those of the real lengths. At most the token cap."""
    padded_rows: bool = False
    """With a token cap: micro-batches are padded rows (``bshd``), so a micro-batch's collated size is its
    sample count times its longest planned size, not the sum of the planned sizes (packed ``thd``)."""

    def __post_init__(self) -> None:
        for name in ("dp_size", "global_batch_size", "cp_size", "pp_size", "vpp_size"):
            object.__setattr__(self, name, require_int(name, getattr(self, name)))
        self.layout.validate()
        self._validate_batching()
        for name in ("max_tokens_per_gpu", "micro_batch_size", "microbatch_group_size_per_vp_stage"):
            if getattr(self, name) is not None:  # plain ints: NumPy integers would not serialise to JSON
                object.__setattr__(self, name, int(getattr(self, name)))
        growth = self.balance_growth
        if not is_real(growth) or not 0.0 <= growth <= 10.0:
            raise ArgumentError(f"balance_growth must be a number between 0 and 10, got {growth!r}",
                                argument="balance_growth")
        object.__setattr__(self, "balance_growth", float(growth) + 0.0)  # -0.0 -> 0.0
        if self.vpp_size == 1:  # Megatron ignores the group size without virtual stages; so does the plan
            object.__setattr__(self, "microbatch_group_size_per_vp_stage", None)
        object.__setattr__(self, "drop_last", require_bool("drop_last", self.drop_last))
        if not isinstance(self.balance, str) or self.balance not in BALANCE_MODES:
            raise ArgumentError(f"balance must be one of {', '.join(BALANCE_MODES)}; got {self.balance!r}",
                                argument="balance")
        object.__setattr__(self, "microbatch_order", resolve_order(self.microbatch_order, self.pp_size))
        self._validate_padding()
        self._validate_step_time_model()

    def _validate_padding(self) -> None:
        object.__setattr__(self, "pad_multiple", require_int("pad_multiple", self.pad_multiple, maximum=MAX_TOKENS))
        object.__setattr__(self, "padded_rows", require_bool("padded_rows", self.padded_rows))
        cap = self.token_cap
        if cap is not None and self.pad_multiple > cap:
            raise ArgumentError(
                f"pad_multiple={self.pad_multiple} is larger than the token cap max_tokens_per_gpu * cp_size = "
                f"{cap}: every sample, even a one-token micro-batch, would be padded past the cap",
                argument="pad_multiple",
            )

    def _validate_batching(self) -> None:
        cap, mbs = self.max_tokens_per_gpu, self.micro_batch_size
        if (cap is None) == (mbs is None):
            raise ArgumentError(
                "give exactly one of max_tokens_per_gpu (dynamic batching) and micro_batch_size "
                f"(static batching); got max_tokens_per_gpu={cap!r}, micro_batch_size={mbs!r}",
                argument="max_tokens_per_gpu",
            )
        if cap is not None:
            require_int("max_tokens_per_gpu", cap, maximum=MAX_TOKENS)
        if mbs is not None:
            require_int("micro_batch_size", mbs)

    def _validate_step_time_model(self) -> None:
        model = self.step_time_model
        if model is None:
            return
        if isinstance(model, dict):  # read back from to_dict()
            try:
                model = StepTimeModel(**model)
            except TypeError as error:
                raise ArgumentError(f"step_time_model: {error}", argument="step_time_model") from None
            object.__setattr__(self, "step_time_model", model)
        if not isinstance(model, StepTimeModel):
            raise ArgumentError(f"step_time_model must be a StepTimeModel or None, got {type(model).__name__}",
                                argument="step_time_model")
        if self.max_tokens_per_gpu is None:
            raise ArgumentError("step_time_model needs max_tokens_per_gpu: static batching (micro_batch_size) "
                                "has a fixed micro-batch count", argument="step_time_model")
        if self.balance == "none":
            raise ArgumentError("step_time_model needs balance='cost' or 'tokens': balance='none' deals one "
                                "global packing round-robin", argument="step_time_model")

    @property
    def layout(self) -> PipelineLayout:
        """The pipeline shape that decides which micro-batch counts are legal."""
        return PipelineLayout(
            pp_size=self.pp_size,
            vpp_size=self.vpp_size,
            microbatch_group_size_per_vp_stage=self.microbatch_group_size_per_vp_stage,
        )

    @property
    def token_cap(self) -> int | None:
        """Tokens per micro-batch per DP rank: ``max_tokens_per_gpu * cp_size``."""
        return None if self.max_tokens_per_gpu is None else self.max_tokens_per_gpu * self.cp_size
