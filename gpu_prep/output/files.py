"""The durable files every output file goes through live in gpu_prep/durable.py, below the stages (filter/,
tokenization/, run/ and output/ all write through them); this name is kept for the modules that still import
them from here."""

from gpu_prep.durable import (JOURNAL, SIGNED, Journal, claim, copy_atomic, create, finish_file, journal,
                              journal_names, linked_part, manifest_checksum, manifest_edited, refuse_link,
                              remove_written, settle_journal, sha256_file, start_writeback, temporary_name,
                              temporary_path, write_atomic, write_json_atomic, writing, written_files)

__all__ = ["JOURNAL", "SIGNED", "Journal", "claim", "copy_atomic", "create", "finish_file", "journal", "journal_names",
           "linked_part", "manifest_checksum", "manifest_edited", "refuse_link", "remove_written", "settle_journal",
           "sha256_file", "start_writeback", "temporary_name", "temporary_path", "write_atomic", "write_json_atomic",
           "writing", "written_files"]
