"""storage_format h5: one HDF5 file per shard (data.h5, data.00001.h5, ...) holding the bin arrays as
datasets: sequence, loss_mask, sample_offsets, and segment_offsets when packed."""

from __future__ import annotations

from pathlib import Path

from gpu_prep.output.pack import Layout
from gpu_prep.output.shards import LOSS_MASK_MEANING, OFFSET_DTYPE, OneFileShard, chained_offsets


class H5Shard(OneFileShard):
    """The shard's final arrays as datasets of one HDF5 file."""

    extension = "h5"

    def _build(self, tmp: Path, layout: Layout) -> None:
        import h5py

        total = int(layout.lengths.sum())
        arrays = {"sequence": (total, self.storage.token_dtype), "loss_mask": (total, self.storage.mask_dtype),
                  "sample_offsets": (layout.num_sequences + 1, OFFSET_DTYPE)}
        if layout.packed:
            arrays["segment_offsets"] = (len(layout.lengths) + 1, OFFSET_DTYPE)
        with h5py.File(tmp, "w") as h5:
            h5.attrs["loss_mask_meaning"] = LOSS_MASK_MEANING
            sets = {k: h5.create_dataset(k, shape=(n,), maxshape=(None,), dtype=t, chunks=(min(1 << 16, max(n, 1)),))
                    for k, (n, t) in arrays.items()}
            filled = dict.fromkeys(sets, 0)
            for part in chained_offsets(self._blocks(layout)):
                for key, values in part.items():
                    if key in sets:
                        sets[key][filled[key]:filled[key] + len(values)] = values
                        filled[key] += len(values)
