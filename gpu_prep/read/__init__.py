"""read: input files -> bounded chunks of raw rows, each keeping its (file, line).

inputs.py       InputFile and expand_inputs (files, globs, folders, URLs; each held to the identity it had when
                found, check_unchanged), Part, the columns an input type needs
rows.py         READERS, a reader per layout; file_rows / part_rows (guarded), parts, samples, read_chunks
jsonl.py        JSON Lines: the strict parser, lines over max_row_bytes, byte ranges read as columns (GPU)
files.py        an input's name and bytes: layout and compression by extension, URLs, sizes, opened decompressed
detect.py       what a file is, checked against its first bytes (inspect_file), and the columns it has
text_checks.py  BOMs, bytes that are not UTF-8 (named by byte, line, element), damaged compressed streams
folders.py      folders the datasets library wrote: one split's Arrow files
json_array.py   JSON arrays, element by element
delimited.py    CSV and TSV
text.py         plain text
columnar.py     Parquet and Arrow (cuDF for the row groups that hold text, on the GPU backend)
jsonscan.py     the byte scan that lets a JSON Lines range be parsed as columns (cudf.read_json)
hub.py          hub datasets (the datasets library, streamed) and hub model ids
mix.py          several datasets: each one's data handlers applied (their registry), concatenation, interleaving
                by weight
row.py          ReadRow (what every reader yields for a row), FileRow, DroppedRow (a chunk's row dropped)
"""

__all__ = ["columnar", "delimited", "detect", "files", "folders", "hub", "inputs", "json_array", "jsonl", "jsonscan",
           "mix", "row", "rows", "text", "text_checks"]
