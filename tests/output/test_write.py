"""Domain names from the data become safe, distinct directory names; files appear only when complete."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpu_prep.output.writer import DatasetWriter, safe_dir_name

HOSTILE = ["../x", "..", ".", "/etc", "", "a/b", "a\\b", "x" * 300, "a b", "ünïcode", "__default__", ".hidden",
           "con:tent", "\x00nul"]


@pytest.mark.parametrize("name", HOSTILE)
def test_safe_dir_name_stays_inside(name: str, tmp_path: Path) -> None:
    safe = safe_dir_name(name)
    assert safe and "/" not in safe and "\\" not in safe and "\x00" not in safe
    assert not safe.startswith(".")
    assert len(safe) <= 64 + 9
    assert (tmp_path / safe).resolve().parent == tmp_path.resolve()


def test_plain_names_are_kept() -> None:
    for name in ("wiki", "code-v2", "web_2024.en", "__default__"):
        assert safe_dir_name(name) == name


def test_names_that_collide_after_sanitizing_stay_distinct() -> None:
    names = ["a/b", "a\\b", "a b", "a_b", "x" * 300, "x" * 301]
    assert len({safe_dir_name(n) for n in names}) == len(names)


def test_writer_separates_a_literal_name_equal_to_another_sanitized_one(tmp_path: Path) -> None:
    writer = DatasetWriter(tmp_path, "bin", 1000)
    ids = np.arange(3, dtype=np.int64)
    offsets = np.array([0, 3], dtype=np.int64)
    writer.append("a/b", ids, np.ones(3, dtype=np.int8), offsets)
    writer.append(safe_dir_name("a/b"), ids, np.ones(3, dtype=np.int8), offsets)  # same text, other domain
    metas = writer.finish()
    assert len(metas) == 2
    assert sorted(m["domain"] for m in metas.values()) == sorted(["a/b", safe_dir_name("a/b")])


def test_no_temporary_files_are_left_and_none_look_complete_before_finish(tmp_path: Path) -> None:
    writer = DatasetWriter(tmp_path, "bin", 4)
    mask = np.ones(6, dtype=np.int8)
    writer.append("d", np.arange(6, dtype=np.int64), mask, np.array([0, 3, 6], dtype=np.int64))
    # The first shard (3 tokens) is full once the second sample arrives; the second is still open.
    visible = sorted(p.name for p in (tmp_path / "d").iterdir() if not p.name.startswith("."))
    assert visible == ["loss_mask.bin", "sample_offsets.bin", "sequence.bin"]
    assert not (tmp_path / "d" / "meta.json").exists()
    writer.finish()
    names = sorted(p.name for p in (tmp_path / "d").iterdir())
    assert not [n for n in names if n.startswith(".")]
    assert "sequence.00001.bin" in names and "meta.json" in names


def test_a_domain_named_like_the_manifest_gets_its_own_directory() -> None:
    assert safe_dir_name("manifest.json") != "manifest.json"


def test_domains_that_differ_only_in_case_get_directories_that_differ_on_any_file_system(tmp_path: Path) -> None:
    writer = DatasetWriter(tmp_path, "bin", 1000)
    ids, offsets = np.arange(3, dtype=np.int64), np.array([0, 3], dtype=np.int64)
    for name in ("Math", "math", "MATH", "Math"):
        writer.append(name, ids, np.ones(3, dtype=np.int8), offsets)
    metas = writer.finish()
    assert sorted(metas) == ["MATH-3", "Math", "math-2"]
    assert len({name.lower() for name in metas}) == 3
    assert {m["domain"]: m["num_samples"] for m in metas.values()} == {"Math": 2, "math": 1, "MATH": 1}
