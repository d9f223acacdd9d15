"""format: raw rows -> one canonical shape per row, through a registry of builders keyed by input.type.

A builder takes one record and the config and returns a Conversation (rendered later with the chat
template) or Segments (text pieces tokenized independently, each with a label). It raises RowError (errors.py's,
named here too) to drop the row with a reason. New input types register a builder:

    @register("my_format")
    def build(record, config): return Segments([(record["body"], "text")])

A plugin's builder may also be a class (one instance is made, its build method called), take the run's
tokenizer as a third argument, and return {"ids", "loss_mask", "domain"} or None: contract.py holds that
contract and calls every builder (contract.build_row).

shapes.py       Conversation (its Message), Segments, Tokens, Pair, Unpaired
registry.py     register and the lookup of builders
chat.py         chat and sharegpt rows (tools, tool calls, system fields, inline reasoning)
instruction.py  instruction, prompt_response, alpaca, segments, text and pretokenized rows
preference.py   preference pairs and KTO rows
detect.py       which type a row is (input.type auto), and the columns a type reads
texts.py        the texts the filter stage reads (source, dedup, fuzzy, split) and a row's domain
contract.py     the builder contract every builder is called through
"""

# The builders register themselves as their modules load: all of them are loaded with the package.
from gpu_prep.format import chat, instruction, preference  # noqa: F401
from gpu_prep.format.chat import messages_row
from gpu_prep.format.detect import auto_schema, columnar_schema, detect_schema
from gpu_prep.format.instruction import build_pretokenized
from gpu_prep.format.registry import get_builder, register, registered, registered_types
from gpu_prep.errors import RowError
from gpu_prep.format.shapes import DEFAULT_DOMAIN, Conversation, Message, Pair, Segments, Shape, Tokens, Unpaired
from gpu_prep.format.texts import dedup_text, domain_of, fuzzy_text, hashed_whole, source_chars, split_text

__all__ = ["DEFAULT_DOMAIN", "Conversation", "Message", "Pair", "RowError", "Segments", "Shape", "Tokens", "Unpaired",
           "auto_schema", "build_pretokenized", "columnar_schema", "dedup_text", "detect_schema", "domain_of",
           "fuzzy_text", "get_builder", "hashed_whole", "messages_row", "register", "registered", "registered_types",
           "source_chars", "split_text"]
