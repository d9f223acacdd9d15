"""What a run's output holds, measured from its shards: sample lengths (percentiles and a histogram),
trained-token share, rows truncated, per domain and over all. `gpu-prep stats OUT [--html FILE]`."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import numpy as np

from gpu_prep.output.dataset import open_dataset

PERCENTILES = (50, 90, 95, 99, 100)  # exact: each is a sample's length (p100 is the longest)
BINS = 30


def _lengths(domain: Any) -> tuple[np.ndarray, int]:
    """Sample lengths of one domain, from its shards' offsets, and its trained tokens, from meta.json
    (which `gpu-prep verify` checks against the masks)."""
    lengths = [np.diff(domain.shard(k).offsets) for k in range(domain.num_shards)]
    every = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
    return every, int(domain.meta["num_trained_tokens"])


def summarize(out_dir: str | Path) -> dict[str, Any]:
    """Per domain and in total: samples, tokens, trained share, length percentiles, min, max, histogram."""
    out_dir = Path(out_dir)
    manifest = json.loads((out_dir / "manifest.json").read_text(encoding="utf-8"))
    max_seq_len = manifest["config"]["preprocessing"]["max_seq_len"]
    dataset = open_dataset(out_dir)
    parts = {name: _lengths(dataset[name]) for name in dataset}
    every = np.concatenate([lengths for lengths, _ in parts.values()]) if parts else np.zeros(0, dtype=np.int64)
    rows = {name: _describe(lengths, trained, max_seq_len) for name, (lengths, trained) in parts.items()}
    rows["all"] = _describe(every, sum(t for _, t in parts.values()), max_seq_len)
    if any(dataset[name].packed for name in dataset):  # the share of padding when padded to max_seq_len
        for row in rows.values():
            room = row["samples"] * max_seq_len
            row["padding"] = (room - row["tokens"]) / room if room else 0.0
    totals = manifest["totals"]
    written = totals["rows_written"]
    by_role = totals.get("trained_tokens_by_role", {})
    trained = sum(by_role.values())
    return {"max_seq_len": max_seq_len, "domains": rows,
            "rows_written": written, "rows_truncated": totals["rows_truncated"],
            "truncation_rate": totals["rows_truncated"] / written if written else 0.0,
            "trained_share_by_role": {role: n / trained for role, n in by_role.items()} if trained else {},
            "histogram": _histogram(every)}


def role_line(summary: dict[str, Any]) -> str:
    """Which roles the trained tokens come from, largest share first."""
    shares = sorted(summary["trained_share_by_role"].items(), key=lambda item: -item[1])
    return "trained tokens by role: " + (", ".join(f"{role} {share:.1%}" for role, share in shares) or "none")


def _describe(lengths: np.ndarray, trained: int, max_seq_len: int) -> dict[str, Any]:
    tokens = int(lengths.sum())
    described = {"samples": len(lengths), "tokens": tokens, "trained_share": trained / tokens if tokens else 0.0,
                 "min": int(lengths.min()) if len(lengths) else 0, "max": int(lengths.max()) if len(lengths) else 0,
                 "at_max_seq_len": int((lengths >= max_seq_len).sum())}
    for p in PERCENTILES:
        described[f"p{p}"] = int(np.percentile(lengths, p, method="lower")) if len(lengths) else 0
    return described


def _histogram(lengths: np.ndarray) -> dict[str, list[int]]:
    top = max(int(lengths.max()) if len(lengths) else 1, 1)
    edges = np.linspace(0, max(top, 1), BINS + 1).round().astype(np.int64)
    counts, _ = np.histogram(lengths, bins=np.unique(edges))
    return {"edges": np.unique(edges).tolist(), "counts": counts.tolist()}


def write_html(summary: dict[str, Any], path: str | Path, title: str) -> None:
    """A self-contained page: the table and an SVG histogram of sample lengths."""
    edges, counts = summary["histogram"]["edges"], summary["histogram"]["counts"]
    peak = max(counts, default=1) or 1
    width, height, left, bottom = 640, 240, 60, 40  # the plot, and the margins that hold the axes' labels
    bar = width / max(len(counts), 1)
    bars = "".join(
        f'<rect x="{left + k * bar:.1f}" y="{height - c / peak * height:.1f}" width="{max(bar - 1, 0.5):.1f}" '
        f'height="{c / peak * height:.1f}" fill="#4c8"><title>{edges[k]}-{edges[k + 1]} tokens: {c} samples'
        f'</title></rect>' for k, c in enumerate(counts))
    ticks = [(0, edges[0]), (len(counts) / 2, edges[len(counts) // 2]), (len(counts), edges[-1])] if counts else []
    axes = (f'<line x1="{left}" y1="{height}" x2="{left + width}" y2="{height}" stroke="#333"/>'
            f'<line x1="{left}" y1="0" x2="{left}" y2="{height}" stroke="#333"/>'
            + "".join(f'<text x="{left + k * bar:.1f}" y="{height + 14}" font-size="11" text-anchor="middle">{v:,}</text>'
                      for k, v in ticks)
            + f'<text x="{left - 4}" y="{height}" font-size="11" text-anchor="end">0</text>'
            f'<text x="{left - 4}" y="11" font-size="11" text-anchor="end">{peak:,}</text>'
            f'<text x="{left + width / 2}" y="{height + bottom - 4}" font-size="12" text-anchor="middle">'
            'sample length (tokens)</text>'
            f'<text x="14" y="{height / 2}" font-size="12" text-anchor="middle" '
            f'transform="rotate(-90 14 {height / 2})">samples</text>')
    width, height = width + left + 10, height + bottom
    header = "".join(f"<th>{html.escape(k)}</th>" for k in ["domain", *next(iter(summary["domains"].values()))])
    table = "".join(
        "<tr><td>" + html.escape(name) + "</td>" + "".join(f"<td>{cell(v)}</td>" for v in row.values()) + "</tr>"
        for name, row in summary["domains"].items())
    Path(path).write_text(
        f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<h1>{html.escape(title)}</h1><p>max_seq_len {summary['max_seq_len']}; rows truncated "
        f"{summary['rows_truncated']} of {summary['rows_written']} ({summary['truncation_rate']:.1%}); "
        f"{html.escape(role_line(summary))}</p>"
        f"<table border=1 cellpadding=4><tr>{header}</tr>{table}</table>"
        f"<h2>Sample lengths (tokens), {edges[0]} to {edges[-1]}</h2>"
        f"<svg width='{width}' height='{height}'>{bars}{axes}</svg>\n",
        encoding="utf-8")


def cell(value: Any) -> str:
    return f"{value:.1%}" if isinstance(value, float) else f"{value:,}"
