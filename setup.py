"""Packaging for megatron-dpsched."""

from setuptools import find_packages, setup

setup(
    name="megatron-dpsched",
    version="0.1.0",
    description="Global data-parallel micro-batch scheduling for Megatron: token-capped packing, "
    "compute-balanced ranks, VPP-legal micro-batch counts, exact LR accounting.",
    long_description=(
        "megatron-dpsched plans every Megatron global batch at once: it packs samples under a token cap, "
        "picks the micro-batch count Megatron's (interleaved) pipeline schedule accepts, balances data-parallel "
        "ranks by a FLOPs model and advances the LR scheduler by the samples trained. Turn it on with "
        "--dp-schedule; documentation in the repository's README.md and docs/."
    ),
    long_description_content_type="text/plain",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["megatron_dpsched", "megatron_dpsched.*"]),
    package_data={"megatron_dpsched": ["data/*.txt", "data/*.md"]},
    install_requires=["numpy>=1.24"],
    extras_require={
        "megatron": ["torch>=2.6", "megatron-core>=0.17.1,<0.20"],
        "test": ["pytest>=8", "hypothesis>=6.100", "ruff>=0.6", "psutil>=5.9", "tensorboard>=2.15",
                 "transformers>=4.45", "tokenizers>=0.20", "scipy>=1.10"],
        "demo": ["matplotlib>=3.8", "scipy>=1.10"],
        "calibrate": ["scipy>=1.10"],
    },
    entry_points={"console_scripts": ["megatron-dpsched=megatron_dpsched.cli:main"]},
    classifiers=["Programming Language :: Python :: 3", "Topic :: Scientific/Engineering :: Artificial Intelligence"],
)
