"""storage_format parquet: data.parquet per shard, a row per sequence, as Hugging Face trainers take
pre-tokenized data (input_ids, attention_mask, labels; position_ids when packed)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gpu_prep.output.pack import Layout
from gpu_prep.output.shards import LOSS_MASK_MEANING, OneFileShard

IGNORE_INDEX = -100  # labels of tokens outside the loss


class ParquetShard(OneFileShard):
    """One Parquet file per shard, a row per sequence: input_ids, attention_mask (all 1: no padding is
    stored) and labels (the token where the loss mask is 1, else -100), as Hugging Face trainers take
    pre-tokenized data; packed shards add position_ids, starting from 0 at every segment, from which
    flash-attention kernels and padding-free collators find the boundaries. A row group per block."""

    extension = "parquet"

    def _build(self, tmp: Path, layout: Layout) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        fields = [("input_ids", pa.list_(pa.from_numpy_dtype(self.storage.token_dtype))),
                  ("attention_mask", pa.list_(pa.int8())), ("labels", pa.list_(pa.int64()))]
        if layout.packed:
            fields.append(("position_ids", pa.list_(pa.int64())))
        schema = pa.schema(fields, metadata={"gpu-prep": json.dumps({"loss_mask_meaning": LOSS_MASK_MEANING,
                                                                     "ignore_index": IGNORE_INDEX})})
        with pq.ParquetWriter(tmp, schema, compression="zstd") as out:
            for ids, mask, sequences, segments in self._blocks(layout):
                offsets = pa.array(sequences.astype(np.int32))
                columns = [ids, np.ones(len(ids), np.int8), np.where(mask.astype(bool), ids.astype(np.int64), IGNORE_INDEX)]
                if layout.packed:
                    columns.append(np.arange(len(ids), dtype=np.int64) - np.repeat(segments[:-1], np.diff(segments)))
                out.write_table(pa.Table.from_arrays([pa.ListArray.from_arrays(offsets, pa.array(c)) for c in columns],
                                                     schema=schema))
