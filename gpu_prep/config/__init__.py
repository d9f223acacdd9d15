"""config: the pipeline config (format v1), typed and frozen, loaded from JSON or YAML.

Every key and default of the seed's v1 schema is here; keys the seed lacks are marked as gpu-prep's own.
Unknown keys are errors (a typo must not silently fall back to a default).

load.py       load_config (JSON or YAML, --set overrides, paths relative to the config) and parse_config
pipeline.py   PipelineConfig: the sections together, the checks across them, output_sha256, error lines
input.py      InputConfig: what the rows look like, which roles and fields count in the loss
sections.py   preprocessing (fuzzy_dedup), output, tokenizer, gpu, datasets (handlers, hub), dataprocessor
base.py       the frozen base with number ranges, and the constants stages read (row types, template roles)
templates.py  the chat templates a config may name (chat_template), and the rule a value is held to
foreign.py, qlora_keys.py   other tools' key spellings: named in errors, or read as gpu-prep's
"""

from gpu_prep.config.base import (ALPACA_FORMAT, ALPACA_NO_INPUT_FORMAT, PAIR_TYPES, SHAREGPT_ROLES, TEMPLATE_ROLES,
                                   TEXT_TYPES, TOOL_CALL_ROLE)
from gpu_prep.config.input import InputConfig
from gpu_prep.config.load import load_config, parse_config
from gpu_prep.config.pipeline import PipelineConfig, output_sha256
from gpu_prep.config.sections import DatasetConfig, OutputConfig, PreprocessingConfig

__all__ = ["ALPACA_FORMAT", "ALPACA_NO_INPUT_FORMAT", "PAIR_TYPES", "SHAREGPT_ROLES", "TEMPLATE_ROLES", "TEXT_TYPES",
           "TOOL_CALL_ROLE", "DatasetConfig", "InputConfig", "OutputConfig", "PipelineConfig", "PreprocessingConfig",
           "load_config", "output_sha256", "parse_config"]
