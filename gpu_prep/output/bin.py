"""storage_format bin: the seed's raw little-endian arrays, one file per array per shard.

    <domain>/sequence.bin  loss_mask.bin  sample_offsets.bin   (shard 0)
    <domain>/sequence.00001.bin ...                            (further shards)
    <domain>/segment_offsets.bin                               (packed shards: every sample's boundaries)

Unpacked, the temporaries already are the final files: they are made durable and renamed, their sha256
taken as they were written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_prep.failpoint import failpoint
from gpu_prep.durable import finish_file
from gpu_prep.output.shards import ARRAYS, RawShard, build_files, chained_offsets, raw_file_name


class BinShard(RawShard):
    def close(self, directory: Path) -> dict[str, Any]:
        self._close_handles()
        if self.final_as_written():
            names = {k: raw_file_name(k, self.index, temporary=False) for k in self.tmp}
            for k in self.tmp:
                finish_file(self.tmp[k], directory / names[k])
                failpoint("shard_close", directory / names[k])  # some of the shard's files renamed, the others not yet
            return {"files": names, "sha256": {k: d.hexdigest() for k, d in self.digests.items()}}
        layout = self._layout()
        names = {k: raw_file_name(k, self.index, temporary=False) for k in (*ARRAYS, "segment_offsets")}
        return {**build_files(directory, names, chained_offsets(self._blocks(layout))), **self._packing_record(layout)}
