"""gpu-prep verify passes a sound run and names each kind of damage."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpu_prep.output.verify import verify
from helpers import load_json, run_rows

ROWS = [{"messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]}
        for i in range(20)]


@pytest.fixture(params=["bin", "h5"])
def run_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    config = {"mask": {"assistant": "train"}, "output": {"storage_format": request.param, "max_tokens_per_shard": 200}}
    return run_rows(tmp_path, config, ROWS)


def test_a_sound_run_verifies(run_dir: Path) -> None:
    assert verify(run_dir) == []
    assert len(load_json(run_dir / "__default__" / "meta.json")["shards"]) > 1


def _first_file(run_dir: Path) -> Path:
    return sorted((run_dir / "__default__").glob("*.bin")) [0] if list((run_dir / "__default__").glob("*.bin")) \
        else sorted((run_dir / "__default__").glob("*.h5"))[0]


def test_an_emptied_file_is_found(run_dir: Path) -> None:
    _first_file(run_dir).write_bytes(b"")
    assert verify(run_dir)


def test_a_changed_byte_is_found(run_dir: Path) -> None:
    path = _first_file(run_dir)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert any("sha256" in f for f in verify(run_dir))


def test_a_truncated_or_missing_shard_is_found(run_dir: Path) -> None:
    path = _first_file(run_dir)
    path.write_bytes(path.read_bytes()[:-8])
    assert verify(run_dir)
    path.unlink()
    assert any("missing" in f for f in verify(run_dir))


def test_a_mask_value_other_than_0_or_1_is_found(tmp_path: Path) -> None:
    out = run_rows(tmp_path, {"mask": {"assistant": "train"}}, ROWS[:3])
    mask = out / "__default__" / "loss_mask.bin"
    values = np.fromfile(mask, dtype="<i8")
    values[0] = 7
    values.tofile(mask)
    faults = verify(out)
    assert any("other than 0 and 1" in f for f in faults) and any("sha256" in f for f in faults)


def test_not_a_run_is_reported(tmp_path: Path) -> None:
    assert verify(tmp_path) == [f"{tmp_path}: no manifest.json (not a finished gpu-prep run)"]


def test_cli_verify_exit_codes(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpu_prep.cli import app

    out = run_rows(tmp_path, {"mask": {"assistant": "train"}}, ROWS[:3])
    assert CliRunner().invoke(app, ["verify", str(out)]).exit_code == 0
    manifest = load_json(out / "manifest.json")
    manifest["totals"]["tokens"] += 1
    (out / "manifest.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(app, ["verify", str(out)])
    assert result.exit_code == 1 and "tokens" in result.output


def test_a_damaged_meta_or_manifest_is_a_fault_not_a_crash(tmp_path: Path) -> None:
    out = run_rows(tmp_path, {"mask": {"assistant": "train"}}, ROWS[:3])
    (out / "__default__" / "meta.json").write_text("{")
    assert any("meta.json cannot be read" in f for f in verify(out))
    (out / "manifest.json").write_text('{"domains": {}}')
    assert any("lacks what a run writes" in f for f in verify(out))
    (out / "manifest.json").write_text("not json")
    assert any("manifest.json cannot be read" in f for f in verify(out))
