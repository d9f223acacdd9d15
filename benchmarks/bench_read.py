"""Reading throughput per input format: gpu-prep's reader beside pyarrow's own reader of the same file.

    python benchmarks/bench_read.py --rows 20000 --repeat 3

The same text rows (ShareGPT messages) are written as JSON Lines (plain and gzip), a JSON array, Parquet,
Arrow IPC (stream, as datasets writes it), Feather, CSV and TSV. Timed in one process, best of --repeat:
gpu-prep's read stage (read.read_chunks: every row as a Python record, in chunks, with its file and line)
and pyarrow reading the file into a table and then into Python rows (to_pylist), which is what any
row-wise consumer of pyarrow's reader must do; the table alone is printed beside it.

    python benchmarks/bench_read.py --columnar-host --rows 10000

The host's share of reading chat rows as columns (gpu.reader cudf), beside the strict parser reading them
line by line: the checks that keep the columnar rows exact and turning the parsed columns into Python rows.
The byte scan (gpu_prep.read.jsonscan) and the parse run on the GPU there, so both are left out of the host's
time: pyarrow's JSON reader stands in for cuDF's parse, and the scan's answers are taken before the timing.
The scan's numpy twin is timed on its own beside it (what a CPU would pay; on the GPU it is CuPy's). Reported
for the chats as they are, written with non-ASCII characters as they are and with ASCII escapes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.clock import best, scratch  # noqa: E402
from benchmarks.corpora import sharegpt_chats  # noqa: E402
from gpu_prep.read.inputs import expand_inputs
from gpu_prep.read.rows import read_chunks


def rows(n: int) -> list[dict[str, str]]:
    out = []
    for chat in sharegpt_chats(n):
        out.extend({"text": m["content"]} for m in chat["messages"])
        if len(out) >= n:
            break
    return out[:n]


def write_all(data: list[dict[str, str]], folder: Path) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(data)
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in data).encode()
    paths = {"jsonl": folder / "d.jsonl", "jsonl.gz": folder / "d.jsonl.gz", "json array": folder / "d.json",
             "parquet": folder / "d.parquet", "arrow stream": folder / "d.arrow", "feather": folder / "d.feather",
             "csv": folder / "d.csv", "tsv": folder / "d.tsv"}
    paths["jsonl"].write_bytes(lines)
    paths["jsonl.gz"].write_bytes(gzip.compress(lines, 6))
    paths["json array"].write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    pq.write_table(table, paths["parquet"])
    with pa.OSFile(str(paths["arrow stream"]), "wb") as sink, ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=1000)
    with pa.OSFile(str(paths["feather"]), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=1000)
    pacsv.write_csv(table, paths["csv"])
    pacsv.write_csv(table, paths["tsv"], write_options=pacsv.WriteOptions(delimiter="\t"))
    return paths


def pyarrow_reader(kind: str) -> Callable[[Path], Any]:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.ipc as ipc
    import pyarrow.json as pajson
    import pyarrow.parquet as pq

    return {
        "jsonl": lambda p: pajson.read_json(p),
        "jsonl.gz": lambda p: pajson.read_json(p),  # pyarrow decompresses by the extension
        "json array": None,  # pyarrow reads JSON Lines only
        "parquet": lambda p: pq.read_table(p),
        "arrow stream": lambda p: ipc.open_stream(pa.memory_map(str(p))).read_all(),
        "feather": lambda p: ipc.open_file(pa.memory_map(str(p))).read_all(),
        # Quoted cells hold newlines: pyarrow must be told, as gpu-prep tells it.
        "csv": lambda p: pacsv.read_csv(p, parse_options=pacsv.ParseOptions(newlines_in_values=True)),
        "tsv": lambda p: pacsv.read_csv(p, parse_options=pacsv.ParseOptions(delimiter="\t", newlines_in_values=True)),
    }[kind]


PEAK = """
import resource, sys
from gpu_prep.read.inputs import expand_inputs, read_chunks
rows = sum(len(c) for c in read_chunks(expand_inputs([sys.argv[1]]), 4096))
print(rows, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10)
"""


def big_array(mb: int) -> None:
    """Peak memory reading a JSON array of about mb MB, in a process of its own, beside the import alone."""
    import subprocess

    path = scratch("bench-array-") / "big.json"
    row = json.dumps({"text": "x" * 900 + " \u00e9"})
    count = mb * (1 << 20) // (len(row) + 1)
    with open(path, "w", encoding="utf-8") as handle:  # written row by row: this process stays small, and a
        handle.write("[")  # child's peak counts from the size of the process it was forked from
        for k in range(count):
            handle.write(row if k == 0 else "," + row)
        handle.write("]")
    rows, peak = subprocess.run([sys.executable, "-c", PEAK, str(path)], capture_output=True, text=True,
                                check=True).stdout.split()
    base = subprocess.run([sys.executable, "-c", "import resource, gpu_prep.read.inputs; "
                           "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10)"],
                          capture_output=True, text=True, check=True).stdout.strip()
    print(f"JSON array of {path.stat().st_size >> 20} MB, {int(rows):,} rows: peak RSS {peak} MB "
          f"(the import alone: {base} MB)")


def columnar_host(n: int, repeat: int) -> None:
    """Host seconds of reading n chats as columns (checks + to_pylist; scan and parse on the device) and line
    by line (orjson); the scan's numpy twin beside them."""
    import pyarrow as pa
    import pyarrow.json as pajson

    from gpu_prep.read import jsonl as read
    from gpu_prep.read.jsonl import Columnar, ColumnarRecord

    folder = scratch("bench-columnar-")
    chats = [{"messages": [{"role": m["role"], "content": m["content"]} for m in c["messages"]]} for c in sharegpt_chats(n)]
    schema = pa.schema([("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])))])
    messages = ("messages", "role", "content")
    print(f"{'chats':16} {'MB':>6} {'rows':>7} {'as columns':>11} {'line by line s':>15} {'columns, host s':>16} "
          f"{'columns / lines':>16} {'scan, numpy s':>14}")
    for name, ascii in (("non-ASCII as is", False), ("ASCII escapes", True)):
        path = folder / f"{name.split()[0]}.jsonl"
        path.write_text("".join(json.dumps(c, ensure_ascii=ascii) + "\n" for c in chats), encoding="utf-8")
        parsed: dict[tuple[int, int], Any] = {}  # the stand-in parse, done before the timing
        scanned: dict[tuple[int, bytes], int | None] = {}  # the scan's answers, taken before the timing

        def parse(p: str, offset: int, size: int, asked: dict[str, Any]) -> Any:
            with open(p, "rb") as handle:
                handle.seek(offset)
                data = handle.read(size)
            table = pajson.read_json(pa.BufferReader(data), parse_options=pajson.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="ignore"))
            parsed[offset, size] = table
            return table

        class Scanned(Columnar):
            def scan(self, data: bytes, rows: int) -> int | None:
                key = (len(data), data[:64] + data[-64:])
                if key not in scanned:
                    scanned[key] = super().scan(data, rows)
                return scanned[key]

        files = expand_inputs([str(path)])
        counted = [r for c in read_chunks(files, 4096, columnar=Scanned((), parse, messages)) for r in c.records]
        taken = sum(isinstance(r, ColumnarRecord) for r in counted)
        lines_s = best(repeat, lambda: sum(len(c) for c in read_chunks(files, 4096)))
        columnar = Scanned((), lambda p, offset, size, asked: parsed[offset, size], messages)
        columns_s = best(repeat, lambda: sum(len(c) for c in read_chunks(files, 4096, columnar=columnar)))
        blocks: list[tuple[bytes, int]] = []  # the byte ranges read/jsonl.py scans: whole lines, RANGE_BYTES or more
        for line in path.read_bytes().splitlines(keepends=True):
            if not blocks or len(blocks[-1][0]) >= read.RANGE_BYTES:
                blocks.append((b"", 0))
            blocks[-1] = (blocks[-1][0] + line, blocks[-1][1] + 1)
        twin = Columnar((), parse, messages)
        scan_s = best(repeat, lambda: [twin.scan(block, rows) for block, rows in blocks])
        print(f"{name:16} {path.stat().st_size / 1e6:6.1f} {len(counted):7,} {taken / max(1, len(counted)):10.0%} "
              f"{lines_s:15.3f} {columns_s:16.3f} {columns_s / lines_s:15.2f}x {scan_s:14.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--big-array-mb", type=int, default=0, help="also: peak memory reading a JSON array this big")
    parser.add_argument("--columnar-host", action="store_true",
                        help="only: the host's share of reading chat rows as columns, beside line by line")
    args = parser.parse_args()
    if args.columnar_host:
        columnar_host(args.rows, args.repeat)
        return
    if args.big_array_mb:
        big_array(args.big_array_mb)
    data = rows(args.rows)
    folder = scratch("bench-read-")
    paths = write_all(data, folder)
    mb = len("".join(r["text"] for r in data).encode()) / 1e6
    print(f"{len(data):,} text rows, {mb:.1f} MB of text")
    print(f"{'format':14} {'file MB':>8} {'gpu-prep s':>11} {'MB/s':>7} {'pyarrow table s':>16} "
          f"{'+ to_pylist s':>14} {'gpu-prep / pyarrow rows':>24}")
    for kind, path in paths.items():
        files = expand_inputs([str(path)])

        def ours() -> None:
            assert sum(len(c) for c in read_chunks(files, 4096)) == len(data)

        ours_s = best(args.repeat, ours)
        reader = pyarrow_reader(kind)
        if reader is None:
            table_s = rows_s = float("nan")
        else:
            table_s = best(args.repeat, lambda: reader(path))
            rows_s = best(args.repeat, lambda: reader(path).to_pylist())
        ratio = f"{ours_s / rows_s:.2f}x" if reader is not None else "(no pyarrow reader)"
        print(f"{kind:14} {path.stat().st_size / 1e6:8.1f} {ours_s:11.3f} {mb / ours_s:7.1f} {table_s:16.3f} "
              f"{rows_s:14.3f} {ratio:>24}")


if __name__ == "__main__":
    main()
