"""read: input files -> bounded chunks of raw rows, each keeping its (file, line).

inputs.py     InputFile and expand_inputs (files, globs, folders, URLs; each held to the identity it had when
              found), the JSON Lines reader, file_rows / part_rows over every layout, read_chunks
sources.py    what a file is (extension, magic bytes, BOM, compression), URLs, datasets folders, and the
              readers of JSON arrays, plain text, Parquet and Arrow
delimited.py  CSV and TSV
jsonscan.py   the byte scan that lets a JSON Lines range be parsed as columns (cudf.read_json)
hub.py        hub datasets (the datasets library, streamed) and hub model ids
mix.py        several datasets: data handlers, concatenation, interleaving by weight
"""

__all__ = ["delimited", "hub", "inputs", "jsonscan", "mix", "sources"]
