"""filter: which rows go on, by their own text (before any chat template).

dedup.py   length rules (min_chars, max_chars) and exact prefix-hash deduplication (Deduplicator, filter_rows)
fuzzy.py   near-duplicates (preprocessing.fuzzy_dedup): MinHash and LSH bands over xp, NearIndex
splits.py  which train/validation split a row goes to (output.splits), from its text and the seed alone
"""

__all__ = ["dedup", "fuzzy", "splits"]
