"""What every stage of a run is handed: the run context, built once per process by build_context (the
process that runs gpu-prep, or a cluster's worker), and the two decisions a run makes on its first rows."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import orjson

from gpu_prep.render.affix import detect_affix
from gpu_prep.run.handlers import HANDLERS  # the registry, with the built-in handlers in it
from gpu_prep.backend import Backend
from gpu_prep.format.contract import BuilderTokenizer
from gpu_prep.render.sandbox import ChatTemplate
from gpu_prep.config import PipelineConfig
from gpu_prep.errors import ConfigError
from gpu_prep.format import columnar_schema
from gpu_prep.read.hub import hub_dataset, hub_version
from gpu_prep.read.mix import Dataset, with_tokenizer
from gpu_prep.read.inputs import InputFile, LeftOut, ReadAs, check_columns, expand_inputs
from gpu_prep.read.jsonl import Columnar
from gpu_prep.render.context import RenderContext, no_template
from gpu_prep.render.policy import mask_method
from gpu_prep.render.templates import resolve_template
from gpu_prep.tokenization.tokenizer import KNOWN_END_OF_TURN, Tokenizer

DEFAULT_TOKENIZER = "qwen2.5"


@dataclass(frozen=True)
class Options:
    """How a run goes, as opposed to what it makes: none of these changes a byte of the output."""

    tokenizer: str | None = None  # a directory or a bundled name, over the config's tokenizer.name
    device: str | None = None  # auto, cpu or gpu, over the config's device
    chunk_rows: int = 2048
    workers: int | None = None  # tokenizer threads (default: every core)
    overlap: bool = True  # stages in threads of their own; False: one after another in one thread
    overwrite: bool = False  # replace a previous run in the output directory
    resume: bool = False  # finish the interrupted run in the output directory from its last checkpoint
    rejects: Path | str | None = None  # every dropped row written here as JSON Lines
    strict: bool = False  # stop at the first row that is bad data
    checkpoint_seconds: float = 30.0
    # Called after each chunk with the rows and tokens done so far, the input's bytes read so far (None when
    # the inputs' sizes are not known) and its total bytes.
    progress: Callable[[int, int, int | None, int], None] | None = None
    cluster: str | None = None  # a Dask cluster to run on: "local:N" or a scheduler's address
    announce: Callable[[str], None] | None = None  # told the cluster's dashboard address
    warn: Callable[[str], None] | None = None  # told what the input folders hold that is not read, and the like
    plugins: tuple[str, ...] = ()  # --plugin modules, which a cluster's workers load too
    part_bytes: int | None = None  # a cluster's parts of JSON Lines files (default cluster.plan.PART_BYTES)
    config_file: str | Path | None = None  # the config read (a --rejects there would destroy it)
    # validate's sample run only (it reads less than the run): the first rows of each input, so many of each
    # (read.sample_shares), not the first rows of all.
    per_file: list[int] | None = None

    def tokenizer_for(self, config: PipelineConfig) -> str:
        return self.tokenizer or config.tokenizer.name or DEFAULT_TOKENIZER

    def device_for(self, config: PipelineConfig) -> str:
        return self.device or config.device


class Decisions:
    """What a run decides on its first rows, once each: whether Jinja-free rendering is trusted (affix; the
    host stages decide it) and which tokenizer engine runs (engine: name and why; the tokenizing stage
    decides it). None: not decided yet. A resumed run and a cluster's workers are handed them, so the
    decisions are never taken again on other rows."""

    def __init__(self, affix: bool | None = None, engine: list[str] | tuple[str, str] | None = None,
                 engine_check: dict[str, Any] | None = None) -> None:
        self.affix = affix
        self.engine = tuple(engine) if engine is not None else None
        self.engine_check = engine_check  # the fast engine's check (tokenization/checks.py's Audit) as of the last chunk committed
        self._lock = threading.Lock()

    @classmethod
    def from_state(cls, state: dict[str, Any] | None) -> Decisions:
        state = state or {}
        return cls(state.get("affix"), state.get("engine"), state.get("engine_check"))

    def state(self) -> dict[str, Any]:
        """As a checkpoint keeps them."""
        with self._lock:
            return {"affix": self.affix, "engine": list(self.engine) if self.engine is not None else None,
                    "engine_check": self.engine_check}

    def settle_affix(self, trusted: bool) -> None:
        with self._lock:
            if self.affix is not None:
                raise RuntimeError("the Jinja-free rendering was decided twice")
            self.affix = trusted

    def settle_engine(self, name: str, choice: str) -> None:
        with self._lock:
            if self.engine is not None:
                raise RuntimeError("the tokenizer engine was decided twice")
            self.engine = (name, choice)

    def replace_engine(self, name: str, choice: str) -> None:
        """The engine chosen stopped being trusted during the run (tokenization/checks.py's Audit)."""
        with self._lock:
            self.engine = (name, choice)

    def pending(self, render: RenderContext) -> bool:
        """Whether a decision is still to be taken (the affix only where the template has one)."""
        return self.engine is None or (render.affix is not None and self.affix is None)


Sources = dict[int, tuple[PipelineConfig, "str | None"]]  # file index -> its dataset's config and domain


@dataclass(frozen=True)
class RunContext:
    """Everything a stage needs that stays the same for the whole run."""

    config: PipelineConfig
    tok: Tokenizer
    backend: Backend
    render: RenderContext  # the template, end-of-turn tokens and mask rules rows are rendered with
    files: list[InputFile]
    datasets: list[Dataset] | None  # the config's datasets (their files and handlers); None: the inputs given
    sources: Sources = field(default_factory=dict)  # a dataset's own config and domain, by file index
    columnar: Columnar | None = None  # reads JSON Lines as columns (columnar_reader); None: line by line
    threads: int | None = None  # tokenizer threads
    strict: bool = False  # --strict: a fast engine seen to differ from HF stops the run

    @cached_property
    def builder_tokenizer(self) -> BuilderTokenizer:
        """The tokenizer a plugin's builder that takes one is handed: one per process, made on first use."""
        return BuilderTokenizer(self.tok)

    def tokenizer_summary(self) -> dict[str, Any]:
        """What meta.json and the manifest say of the tokenizer, with this run's end-of-document id: null where
        the run's text rows get none (input.append_eod false) and the tokenizer closes no text itself, so
        that a trainer that finds documents by that id (Megatron's --reset-attention-mask) is not misled."""
        summary = self.tok.summary()
        texts = [c.input for c in self.config.all_configs() if c.input.type == "text"]
        if texts and not any(i.append_eod for i in texts):
            closing = self.tok.suffix_text  # BERT's [SEP] still closes every text
            return {**summary, "eod_id": self.tok.token_id(closing) if closing else None}
        eod = self.render.eod_text
        return summary if eod is None else {**summary, "eod_id": self.tok.token_id(eod)}

    @property
    def dataset_of(self) -> dict[int, Dataset]:
        """Each file's dataset, by file index."""
        return {f.index: d for d in self.datasets or [] for f in d.files}


def build_context(config: PipelineConfig, tok: Tokenizer, backend: Backend, files: list[InputFile],
                  datasets: list[Dataset] | None, threads: int | None, strict: bool = False) -> RunContext:
    """The run context of a process: the one that runs gpu-prep, or a cluster's worker."""
    sources: Sources = {}
    render = render_context(config, tok)
    if datasets is not None:  # handlers render with the run's template too
        with_tokenizer(datasets, BuilderTokenizer(tok, render.template.source if render.template else None))
        sources = dataset_sources(config, datasets)
    return RunContext(config, tok, backend, render, files, datasets, sources, columnar_reader(config, backend),
                      threads, strict)


# The input types whose every row is a conversation, which only a chat template renders (auto's and a
# preference row's shape is the data's: those are refused at the first conversation without one).
CONVERSATION_TYPES = frozenset({"chat", "sharegpt", "prompt_response"})


def _template_needed(config: PipelineConfig) -> str | None:
    """Which of the run's rows all need a chat template (None: no input type's every row does)."""
    for c in config.all_configs():
        if c.input.type in CONVERSATION_TYPES:
            return "chat rows"
        if c.input.type == "alpaca" and c.input.alpaca_render == "chat_template":
            return "alpaca rows (input.alpaca_render: chat_template)"
    return None


def render_context(config: PipelineConfig, tok: Tokenizer) -> RenderContext:
    chosen = resolve_template(config.chat_template, config.chat_template_name, tok.templates())
    kwargs = config.chat_template_kwargs
    origin = f"the chat template ({chosen.source})"
    template = ChatTemplate(chosen.text, tok.special_tokens, kwargs, origin=origin) if chosen.text is not None else None
    tool_template = (ChatTemplate(chosen.tool_text, tok.special_tokens, kwargs, origin=f"{origin}, tool_use")
                     if chosen.tool_text else None)
    if template is None and (rows := _template_needed(config)):  # not left to the first row, mid-run
        raise no_template(rows, chosen)
    if template is not None and template.unusable and _template_needed(config):
        raise ConfigError(template.unusable)
    generation = mask_method(config, template)
    chat = template is not None and config.input.type == "chat"
    marked = generation and template is not None and template.marked
    affix = detect_affix(template.render_marked if marked else template.render, marked=marked) if chat else None
    return RenderContext(
        config=config,
        template=template,
        tool_template=tool_template,
        template_source=chosen,
        affix=affix,
        end_of_turn=tuple(config.input.end_of_turn_tokens or dict.fromkeys([*tok.end_of_turn_tokens(), *chosen.end_of_turn])),
        normalization=tok.normalization,
        offsets=not tok.byte_spans,
        generation=generation,
        prefix_text=tok.prefix_text,
        suffix_text=tok.suffix_text,
        eos_text=tok.eos_text,
        eod_text=end_of_document(config, tok),
        vocab_size=tok.vocab_size,
        first_tokens=tok.first_tokens,
        count_tokens=tok.count_tokens,
    )


# What ends a document in the vocabularies whose chat tokenizers name their end of turn as eos (Qwen, Llama-3).
DOCUMENT_ENDS = ("<|endoftext|>", "<|end_of_text|>")


def chat_turn_ends_documents(config: PipelineConfig, tok: Tokenizer, eod: str | None) -> str | None:
    """A warning where pretraining documents would end with a chat model's end-of-turn token (the eos of
    Qwen's and Llama-3's instruct tokenizers, the bundled qwen2.5 included) while the vocabulary has an end
    of document of its own: a base model trained so learns to close text with the chat token."""
    if eod not in KNOWN_END_OF_TURN or not any(c.input.type == "text" and c.input.append_eod and c.input.eod_token is None
                                               for c in config.all_configs()):
        return None
    own = next((t for t in DOCUMENT_ENDS if tok.token_id(t) is not None), None)
    if own is None:
        return None
    return (f"text rows end with {eod!r}, the tokenizer's eos, which is its chat template's end of turn; the "
            f"vocabulary's end of document is {own!r}: set input.eod_token to {own!r} for pretraining (or to {eod!r} "
            "to keep it)")


def turn_marks_not_tokens(render: RenderContext, tok: Tokenizer) -> str | None:
    """A warning where a named chat template closes its turns with a text the tokenizer has no token for
    (Phi-3's <|end|> on Qwen, ChatML's <|im_end|> on BERT): the marks are written as several text tokens,
    merge with the replies' own text, and are trained as such (ids as transformers gives them)."""
    source = render.template_source
    missing = [t for t in source.end_of_turn if tok.token_id(t) is None] if source is not None else []
    if render.template is None or not missing:
        return None
    return (f"the chat template ({source.source}) closes turns with {', '.join(map(repr, missing))}, which the "
            f"tokenizer ({tok.source or tok.name}) has no token for: it is written as several text tokens, trained with "
            "the replies as text; name a template made for this tokenizer")


def responses_without_eos(config: PipelineConfig, tok: Tokenizer) -> str | None:
    """A warning where instruction rows, whose response the eos token closes (trained: the model learns to
    stop there), meet a tokenizer that has none (BERT's; one whose folder names none)."""
    def closed_by_eos(c: PipelineConfig) -> bool:
        return c.input.type in ("instruction", "prompt_response") or \
            (c.input.type == "alpaca" and c.input.alpaca_render != "chat_template")

    if tok.eos_text is not None or not any(closed_by_eos(c) for c in config.all_configs()):
        return None
    after = f" (the {tok.suffix_text!r} the tokenizer closes each text with is not trained)" if tok.suffix_text else ""
    return (f"the tokenizer ({tok.source or tok.name}) has no eos token, which closes an instruction row's trained "
            f"response: responses are written with no end to learn{after}; name a tokenizer with an eos token")


def end_of_document(config: PipelineConfig, tok: Tokenizer) -> str | None:
    """The text that closes every pretraining document (input.append_eod): input.eod_token, which must be
    one token of the vocabulary, or the tokenizer's eos token. A tokenizer without one that closes every
    text itself (BERT's [SEP]) needs nothing added (None); one that does neither cannot mark the ends, and
    a run that would append them is refused rather than write documents that run into each other."""
    wanted = config.input.eod_token
    if wanted is not None:
        token_id = tok.engine.token_to_id(wanted)
        if token_id is None or tok.engine.encode(wanted, add_special_tokens=False).ids != [token_id]:
            raise ConfigError(f"input.eod_token {wanted!r} is not one token of the tokenizer ({tok.source or tok.name}): "
                              f"name one of its tokens, or leave it null for its eos token ({tok.eos_text!r})")
        return wanted
    if tok.eos_text is not None or tok.suffix_text:
        return tok.eos_text
    appends = any(c.input.type == "text" and c.input.append_eod for c in config.all_configs())
    if appends:
        raise ConfigError(f"input.append_eod: the tokenizer ({tok.source or tok.name}) has no eos token to end each "
                          "document with (eos_token in its tokenizer_config.json): name one with input.eod_token, "
                          "or set input.append_eod to false")
    return None


def run_inputs(config: PipelineConfig, inputs: list[str], left_out: LeftOut | None = None
               ) -> tuple[list[InputFile], list[Dataset] | None]:
    """The run's input files, and its datasets when the config names them (their files, in order), each
    file checked to be what its name says before anything is written; what the input folders hold that is
    not read goes into left_out."""
    if not config.datasets:
        if not inputs:
            raise ConfigError("no input: give files, folders or globs, or a config with datasets")
        files = expand_inputs(inputs, read_as(config), left_out=left_out)
        check_columns(files, needed_columns(config))
        return files, None
    if inputs:
        raise ConfigError("the config's datasets name the inputs: give none on the command line")
    files: list[InputFile] = []
    datasets = []
    for k, spec in enumerate(config.datasets):
        if spec.hub is not None:
            own = [hub_input(spec.hub.model_dump(), len(files))]
        else:
            try:
                own = expand_inputs(spec.data_paths, read_as(config.dataset_config(k), spec.builder), len(files),
                                    left_out)
                if spec.builder is None:
                    check_columns(own, needed_columns(config.dataset_config(k)))
            except ConfigError as exc:  # which dataset's data_paths, in a config of several
                raise ConfigError(f"datasets.{k} ({spec.name}): {exc}") from None
        files.extend(own)
        datasets.append(Dataset(spec.name, own, dataset_handlers(spec)))
    return files, datasets


def needed_columns(config: PipelineConfig) -> tuple[str | tuple[str, ...], ...]:
    """The columns a Parquet or Arrow input must have for every row not to be dropped as missing_field:
    those of the text, instruction and prompt_response types (chat rows may come in more than one shape; a
    prompt_response row's answer may be under response_key or TRL's completion_key)."""
    inp = config.input
    pair = (inp.prompt_key, inp.response_key)
    answer = (inp.prompt_key, (inp.response_key, inp.completion_key))
    return {"text": (inp.text_key,), "instruction": pair, "prompt_response": answer}.get(inp.type, ())


def hub_input(arguments: dict[str, Any], index: int) -> InputFile:
    """A hub dataset as one input, loaded once here so that a wrong name fails before anything is written."""
    version = hub_version(hub_dataset(arguments))
    where = f"hub:{arguments['name']}" + (f"/{arguments['config']}" if arguments.get("config") else "")
    return InputFile(index, f"{where}:{arguments['split']}", 0, "hub", hub=orjson.dumps(arguments).decode(),
                     version=version)


def read_as(config: PipelineConfig, builder: str | None = None) -> ReadAs:
    inp = config.input
    return ReadAs(builder, inp.split, inp.text_key, inp.text_rows == "line")


def datasets_of(config: PipelineConfig, files: list[InputFile], dataset_files: list[list[int]] | None
                ) -> list[Dataset] | None:
    """The config's datasets over files already found (a cluster's worker is handed the file indices)."""
    if dataset_files is None:
        return None
    return [Dataset(spec.name, [files[i] for i in own], dataset_handlers(spec))
            for spec, own in zip(config.datasets or [], dataset_files)]


def columnar_reader(config: PipelineConfig, backend: Backend) -> Columnar | None:
    """What reads as columns on this backend (gpu.reader cudf, the default, on the GPU backend with cuDF):
    Parquet's text columns; JSON Lines (scanned with the backend's xp) where every dataset's rows are built
    from the same columns and no data handler reads rows whole. None: pyarrow, and line by line."""
    if config.gpu.reader != "cudf":
        return None
    read_range, read_groups = backend.json_range_reader(), backend.parquet_reader()
    specs = config.datasets or []
    schemas = {columnar_schema(config)} | {columnar_schema(config.dataset_config(k)) for k in range(len(specs))}
    if len(schemas) != 1 or None in schemas or any(spec.data_handlers for spec in specs):
        read_range = None
    if read_range is None:
        return Columnar(read_groups=read_groups) if read_groups is not None else None
    (fields, messages), = schemas
    return Columnar(fields, read_range, messages, backend.xp, read_groups)


def dataset_handlers(spec: Any) -> list[tuple[Any, dict[str, Any], str, Any]]:
    """A dataset's data handlers as Dataset takes them (by name, so plugins' handlers are found); a
    ConfigError, before any row is read, for arguments a handler does not take (or one it needs but lacks),
    which would otherwise fail on every row."""
    import inspect

    for j, h in enumerate(spec.data_handlers):
        signature = inspect.signature(HANDLERS[h.name])
        given = {**h.fn_kwargs(), **({"tokenizer": None} if "tokenizer" in signature.parameters else {})}
        try:
            signature.bind({}, **given)
        except TypeError as exc:
            raise ConfigError(f"dataset {spec.name!r}: data_handlers[{j}] ({h.name}), arguments.fn_kwargs: {exc}; "
                              f"it takes {', '.join(list(signature.parameters)[1:]) or 'no arguments'}") from None
    return [(HANDLERS[h.name], h.fn_kwargs(), h.name, h.arguments.get("remove_columns")) for h in spec.data_handlers]


def dataset_sources(config: PipelineConfig, datasets: list[Dataset]) -> Sources:
    """By file index: the config of the file's dataset and the domain it names."""
    own = [config.dataset_config(k) for k in range(len(datasets))]
    return {f.index: (own[k], spec.domain or spec.name) for k, (spec, d) in enumerate(zip(config.datasets or [], datasets))
            for f in d.files}
