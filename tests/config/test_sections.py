"""The config's sections other than input (config/sections.py): their limits and the rules across keys."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpu_prep.config.sections import FuzzyDedupConfig, OutputConfig, PreprocessingConfig


def test_fuzzy_dedup_is_switched_by_true_and_false_and_its_bands_fit_its_permutations() -> None:
    assert PreprocessingConfig(fuzzy_dedup=True).fuzzy_dedup == FuzzyDedupConfig()
    assert PreprocessingConfig(fuzzy_dedup=False).fuzzy_dedup is None
    with pytest.raises(ValidationError, match=r"fuzzy_dedup.bands \(200\) cannot exceed num_perm \(128\)"):
        FuzzyDedupConfig(bands=200)


@pytest.mark.parametrize(("splits", "said"), [
    ({}, "name at least one split"),
    ({"tokenizer": 1.0}, "cannot name a split folder"),
    ({"1st": 1.0}, "cannot name a split folder"),
    ({"train": 0.0, "dev": 1.0}, "train's share must be above 0"),
    ({"train": 0.5, "dev": 0.4}, "the shares must sum to 1, got 0.9"),
])
def test_splits_are_folder_names_with_positive_shares_summing_to_one(splits: dict[str, float], said: str) -> None:
    with pytest.raises(ValidationError, match=said):
        OutputConfig(splits=splits)
    assert OutputConfig(splits={"train": 0.98, "validation": 0.02}).splits == {"train": 0.98, "validation": 0.02}


def test_the_token_type_follows_the_vocabulary_and_the_storage_format() -> None:
    assert OutputConfig().token_type(151_000) == "int64"  # the seed's
    assert OutputConfig(storage_format="megatron").token_type(32_000) == "uint16"  # Megatron's rule
    assert OutputConfig(storage_format="megatron").token_type(65_500) == "int32"
    assert OutputConfig(token_dtype="auto").token_type(65_499) == "uint16"
    with pytest.raises(ValidationError, match="Megatron's index has no uint32 token type"):
        OutputConfig(storage_format="megatron", token_dtype="uint32")
    with pytest.raises(ValidationError, match="loss_mask_dtype applies to bin and h5"):
        OutputConfig(storage_format="parquet", loss_mask_dtype="uint8")
