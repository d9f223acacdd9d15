"""storage_format parquet: data.parquet per shard, a row per sequence, as Hugging Face trainers take
pre-tokenized data (input_ids, attention_mask, labels; position_ids and seq_lengths when packed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from gpu_prep.output.pack import Layout
from gpu_prep.output.shards import COPY_ITEMS, LOSS_MASK_MEANING, OneFileShard, shard_cuts
from gpu_prep.mask.pairs import cut_samples, prompt_lengths
from gpu_prep.ragged import reorder

IGNORE_INDEX = -100  # labels of tokens outside the loss


class ParquetShard(OneFileShard):
    """One Parquet file per shard, a row per sequence: input_ids, attention_mask (all 1: no padding is
    stored; not in packed rows) and labels (the token where the loss mask is 1, else -100), as Hugging Face
    trainers take pre-tokenized data. Packed shards add the boundaries of the samples in each row twice, as each trainer
    reads them: position_ids, from 0 at every sample (what flash-attention kernels and transformers'
    packed-sequence detection look at), and seq_lengths, the samples' lengths (what TRL's padding-free
    collator rebuilds position_ids from; it ignores a position_ids column). A row group per block."""

    extension = "parquet"

    def _build(self, tmp: Path, layout: Layout) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.storage.pairs is not None:
            self._build_pairs(tmp, layout)
            return
        if self.storage.labels:
            self._build_unpaired(tmp, layout)
            return
        # Packed rows carry no attention_mask: all ones, it would say nothing, and a trainer handed one
        # (its default collator passes every column) would let the samples of a row attend to each other,
        # where without one transformers finds their boundaries in position_ids.
        fields = [("input_ids", pa.list_(pa.from_numpy_dtype(self.storage.token_dtype))),
                  *([] if layout.packed else [("attention_mask", pa.list_(pa.int8()))]),
                  ("labels", pa.list_(pa.int64()))]
        if layout.packed:
            fields += [("position_ids", pa.list_(pa.int64())), ("seq_lengths", pa.list_(pa.int32()))]
        schema = pa.schema(fields, metadata={"gpu-prep": json.dumps({"loss_mask_meaning": LOSS_MASK_MEANING,
                                                                     "ignore_index": IGNORE_INDEX})})
        with pq.ParquetWriter(tmp, schema, compression="zstd") as out:
            for ids, mask, sequences, segments in self._blocks(layout):
                offsets = pa.array(sequences.astype(np.int32))
                columns = [ids, *([] if layout.packed else [np.ones(len(ids), np.int8)]),
                           np.where(mask.astype(bool), ids.astype(np.int64), IGNORE_INDEX)]
                lists = [pa.ListArray.from_arrays(offsets, pa.array(c)) for c in columns]
                if layout.packed:
                    lengths = np.diff(segments)
                    lists.append(pa.ListArray.from_arrays(offsets, pa.array(np.arange(len(ids), dtype=np.int64)
                                                                   - np.repeat(segments[:-1], lengths))))
                    # each row's samples: the segments between its first and its end
                    rows = pa.array(np.searchsorted(segments, sequences).astype(np.int32))
                    lists.append(pa.ListArray.from_arrays(rows, pa.array(lengths.astype(np.int32))))
                out.write_table(pa.Table.from_arrays(lists, schema=schema))

    def _build_pairs(self, tmp: Path, layout: Layout) -> None:
        """Preference pairs (two samples each: prompt + chosen, prompt + rejected) as TRL's columns, a row per
        pair (PAIR_COLUMNS by output.preference_columns), and prompt_length, the prompt's tokens."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        names = PAIR_COLUMNS[self.storage.pairs]
        token = pa.list_(pa.from_numpy_dtype(self.storage.token_dtype))
        schema = pa.schema([*((name, token) for name in names), ("prompt_length", pa.int32())],
                           metadata={"gpu-prep": json.dumps({"preference_columns": self.storage.pairs})})
        ids, mask = self._raw("sequence"), self._raw("loss_mask")
        offsets = layout.segment_offsets[layout.groups]
        first = 0
        with pq.ParquetWriter(tmp, schema, compression="zstd") as out:
            for count in shard_cuts(np, np.diff(offsets).reshape(-1, 2).sum(axis=1), 0, COPY_ITEMS):
                lo, hi = int(offsets[2 * first]), int(offsets[2 * (first + count)])
                block = offsets[2 * first:2 * (first + count) + 1] - lo
                block_ids = np.asarray(ids[lo:hi])
                prompt = prompt_lengths(np.asarray(mask[lo:hi]), block)[0::2]  # the chosen sample's
                heads, head_offsets, tails, tail_offsets = cut_samples(block_ids, block, np.repeat(prompt, 2))
                chosen, rejected = np.arange(0, 2 * count, 2), np.arange(1, 2 * count, 2)
                if self.storage.pairs == "reward":  # whole sequences
                    columns = [_lists(block_ids, block, chosen, token), _lists(block_ids, block, rejected, token)]
                else:
                    columns = [_lists(heads, head_offsets, chosen, token), _lists(tails, tail_offsets, chosen, token),
                               _lists(tails, tail_offsets, rejected, token)]
                columns.append(pa.array(prompt.astype(np.int32)))
                out.write_table(pa.Table.from_arrays(columns, schema=schema))
                first += count

    def _build_unpaired(self, tmp: Path, layout: Layout) -> None:
        """Unpaired preference rows (input.type kto) as TRL's columns, a row each: prompt_ids, completion_ids,
        label (true: desirable), and prompt_length."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        token = pa.list_(pa.from_numpy_dtype(self.storage.token_dtype))
        schema = pa.schema([("prompt_ids", token), ("completion_ids", token), ("label", pa.bool_()),
                            ("prompt_length", pa.int32())])
        ids, mask, labels = self._raw("sequence"), self._raw("loss_mask"), self._raw("sample_labels")
        offsets = layout.segment_offsets[layout.groups]
        first = 0
        with pq.ParquetWriter(tmp, schema, compression="zstd") as out:
            for count in shard_cuts(np, np.diff(offsets), 0, COPY_ITEMS):
                lo, hi = int(offsets[first]), int(offsets[first + count])
                block = offsets[first:first + count + 1] - lo
                prompt = prompt_lengths(np.asarray(mask[lo:hi]), block)
                heads, head_offsets, tails, tail_offsets = cut_samples(np.asarray(ids[lo:hi]), block, prompt)
                every = np.arange(count)
                out.write_table(pa.Table.from_arrays(
                    [_lists(heads, head_offsets, every, token), _lists(tails, tail_offsets, every, token),
                     pa.array(np.asarray(labels[first:first + count]).astype(bool)),
                     pa.array(prompt.astype(np.int32))], schema=schema))
                first += count


def _lists(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray, token: Any) -> Any:
    """Rows of a ragged array (flat values, offsets) as an Arrow list column of type token."""
    import pyarrow as pa

    gather, row_offsets = reorder(np, offsets, rows)
    return pa.ListArray.from_arrays(pa.array(row_offsets.astype(np.int32)),
                                    pa.array(values[gather], type=token.value_type)).cast(token)


# The Parquet columns of preference pairs, by output.preference_columns (TRL's names; dpo_legacy: before 1.0).
PAIR_COLUMNS = {"dpo": ("prompt_ids", "chosen_ids", "rejected_ids"), "reward": ("chosen_ids", "rejected_ids"),
                "dpo_legacy": ("prompt_input_ids", "chosen_input_ids", "rejected_input_ids")}
