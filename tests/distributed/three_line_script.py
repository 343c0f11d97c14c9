"""A ``pretrain_gpt.py``-style training script with the README's three lines (and ``one_line_errors``), as a
user writes it: a test fixture, run on CPU by ``python -m megatron_dpsched.testing.cpu_dry_run`` under torchrun.
``DATASET``: a JSONL corpus of token ids; ``NO_LENGTHS=1`` hands Megatron a dataset without ``lengths``."""

import os

from megatron.core.enums import ModelType
from megatron.training import pretrain
from megatron.training.argument_utils import pretrain_cfg_container_from_args
from megatron.training.arguments import parse_and_validate_args

from megatron_dpsched.data import open_corpus
from megatron_dpsched.megatron import (
    ScheduledForwardStep,
    add_dp_schedule_args,
    scheduled_datasets_provider,
    setup_dp_schedule,
)
from megatron_dpsched.megatron.failures import one_line_errors


class SamplesWithoutLengths:
    """A map-style dataset that forgot its ``lengths``."""

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        return self.samples[index]


def train_valid_test_datasets_provider(num_samples):
    corpus = open_corpus(os.environ["DATASET"])
    return (SamplesWithoutLengths(corpus) if os.environ.get("NO_LENGTHS") else corpus), None, None


def model_provider(pre_process=True, post_process=True, vp_stage=None, config=None, pg_collection=None):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.training import get_args
    from megatron.training.arguments import core_transformer_config_from_args

    args = get_args()
    return GPTModel(config=config or core_transformer_config_from_args(args),
                    transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=args.padded_vocab_size,
                    max_sequence_length=args.max_position_embeddings, pre_process=pre_process,
                    post_process=post_process, position_embedding_type="learned_absolute", vp_stage=vp_stage,
                    pg_collection=pg_collection)


with one_line_errors():
    args = parse_and_validate_args(extra_args_provider=add_dp_schedule_args)  # 1. the flags
    setup_dp_schedule(args)  # 2. validate them, per-token loss, install the hooks
    pretrain(cfg_container=pretrain_cfg_container_from_args(args),
             train_valid_test_dataset_provider=scheduled_datasets_provider(train_valid_test_datasets_provider),  # 3.
             model_type=ModelType.encoder_or_decoder, forward_step_func=ScheduledForwardStep(),
             model_provider=model_provider)
