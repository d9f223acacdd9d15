"""gpu-prep stats: the figures equal what the samples read back say, and the HTML page holds them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from gpu_prep.cli import app
from gpu_prep.commands.stats import summarize
from helpers import run_rows, samples

pytestmark = pytest.mark.usefixtures("fast_tokenizer")


def test_stats_match_the_samples(tmp_path: Path) -> None:
    rows = [{"text": " ".join(f"w{k}" for k in range(n)), "source": "ab"[n % 2]} for n in range(1, 80, 3)]
    config = {"input": {"type": "text"}, "preprocessing": {"max_seq_len": 40, "min_chars": 0},
              "output": {"domain_key": "source"}}
    out = run_rows(tmp_path, config, rows)
    summary = summarize(out)
    lengths = {d: np.array([len(ids) for ids, _ in samples(out, d)]) for d in ("a", "b")}
    every = np.concatenate(list(lengths.values()))
    for name, got in [("a", lengths["a"]), ("b", lengths["b"]), ("all", every)]:
        row = summary["domains"][name]
        assert row["samples"] == len(got) and row["tokens"] == int(got.sum()) and row["max"] == int(got.max())
        assert row["p50"] == int(np.percentile(got, 50, method="lower"))
        assert row["at_max_seq_len"] == int((got >= 40).sum()) > 0
        assert row["trained_share"] == 1.0  # pretraining text
    whole = run_rows(tmp_path, {**config, "preprocessing": {"max_seq_len": 1 << 20, "min_chars": 0}}, rows,
                     name="whole")
    full = [len(ids) for d in ("a", "b") for ids, _ in samples(whole, d)]
    assert summary["rows_truncated"] == sum(n > 40 for n in full) > 0
    assert sum(summary["histogram"]["counts"]) == len(every)
    page = tmp_path / "stats.html"
    shown = CliRunner().invoke(app, ["stats", str(out), "--html", str(page)])
    assert shown.exit_code == 0 and "p99" in shown.stdout
    assert "<svg" in page.read_text() and f"{len(every):,}" in page.read_text()


def test_stats_show_which_roles_the_trained_tokens_come_from(tmp_path: Path) -> None:
    rows = [{"messages": [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
                          {"role": "user", "content": "Another one, please?"},
                          {"role": "assistant", "content": "Green, as grass is."}]}]
    config = {"chat_template": "chatml", "input": {"type": "chat"}, "mask": {"user": "train", "assistant": "train"},
              "preprocessing": {"min_chars": 0}}
    out = run_rows(tmp_path, config, rows)
    summary = summarize(out)
    [(ids, mask)] = samples(out)
    shares = summary["trained_share_by_role"]
    assert set(shares) == {"user", "assistant"} and abs(sum(shares.values()) - 1) < 1e-9
    # user: "Name a colour.<|im_end|>" and "Another one, please?<|im_end|>"; assistant: its two answers.
    assert 0.4 < shares["user"] < 0.7
    shown = CliRunner().invoke(app, ["stats", str(out)])
    assert shown.exit_code == 0 and "trained tokens by role: user" in shown.stdout


def test_percentiles_are_exact_and_the_histogram_has_axes(tmp_path: Path) -> None:
    from gpu_prep.commands.stats import write_html

    rows = [{"text": "word " * n} for n in (1, 3, 9, 27, 81)]
    out = run_rows(tmp_path, {"input": {"type": "text"}, "preprocessing": {"min_chars": 1}}, rows)
    summary = summarize(out)
    row = summary["domains"]["all"]
    lengths = sorted(len(ids) for ids, _ in samples(out))
    assert row["p100"] == row["max"] == lengths[-1] and row["p50"] == lengths[2]
    write_html(summary, tmp_path / "s.html", "t")
    page = (tmp_path / "s.html").read_text()
    assert "sample length (tokens)" in page and ">samples</text>" in page and f">{lengths[-1]:,}</text>" in page
