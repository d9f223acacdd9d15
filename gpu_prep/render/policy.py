"""The mask policy: every rule of the config that says which text of a row is trained (and how its
reasoning is cut or shown), read once from the config into one frozen object the render helpers consult.
A new mask rule is a field here, filled in `MaskPolicy.of`, and read where it applies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from gpu_prep.errors import ConfigError, Drop
from gpu_prep.format import Message, RowError

if TYPE_CHECKING:
    from gpu_prep.config import PipelineConfig
    from gpu_prep.config.base import Action
    from gpu_prep.render.sandbox import ChatTemplate


@dataclass(frozen=True)
class MaskPolicy:
    """Which text of a row is trained, as one config says (MaskPolicy.of): the render helpers read this,
    never the config's keys, so each rule is read in one place."""

    # A label's rule where the config names one (`mask`, then input.roles_to_train), as config.action reads
    # them; every other label follows `default` (mask_default).
    actions: dict[str, Action]
    default: Action
    mask_scope: Literal["content", "turn"]  # a trained message's content, or its whole rendered turn
    # Which end-of-turn tokens are trained: input.train_on_eos, "none" where input.train_end_of_turn is false.
    train_on_eos: Literal["turn", "all", "last", "none"]
    think_loss: bool  # a trained turn's rendered reasoning is trained with it
    message_training_key: str | None  # a message's own true / false flag
    message_training_detail_key: str | None  # a message's own trained and masked character ranges
    train_last_turn_only: bool
    extract_think_tags: bool  # a leading <think> block was moved out of the content (read for a hint only)
    think_mode: Literal["keep", "drop"]
    think_max_tokens: int | None  # each reasoning cut to its first this many tokens (None: as it is)

    @classmethod
    def of(cls, config: PipelineConfig) -> MaskPolicy:
        """The policy of a config (the run's, or one dataset's own)."""
        inp = config.input
        named = {*config.mask, *inp.roles_to_train}
        return cls(
            actions={label: config.action(label) for label in named},
            default=config.mask_default,
            mask_scope=inp.mask_scope,
            train_on_eos=inp.train_on_eos if inp.train_end_of_turn else "none",
            think_loss=inp.think_loss,
            message_training_key=inp.message_training_key,
            message_training_detail_key=inp.message_training_detail_key,
            train_last_turn_only=inp.train_last_turn_only,
            extract_think_tags=inp.extract_think_tags,
            think_mode=inp.think_mode,
            think_max_tokens=inp.think_max_tokens,
        )

    def trains(self, label: str | bool | None) -> bool:
        """Whether a message or piece with this label (a role or field, or its own bool flag) is trained."""
        if not isinstance(label, str):
            return label is True
        return self.actions.get(label, self.default) == "train"

    def labels(self, messages: list[Message]) -> list[str | bool]:
        """Each message's label: its role, or its own training flag (message_training_key: true / false, or
        1 / 0 as OpenAI's `weight` is written; any other value drops the row); with train_last_turn_only,
        only the last trained message stays trained."""
        key = self.message_training_key
        if key:
            labels: list[str | bool] = [m["role"] if m.get(key) is None else _flag(m, key, i)
                                        for i, m in enumerate(messages)]
        else:
            labels = [m["role"] for m in messages]
        if self.train_last_turn_only:
            trained = [i for i, label in enumerate(labels) if self.trains(label)]
            for i in trained[:-1]:
                labels[i] = False
        return labels


def _flag(message: Message, key: str, index: int) -> bool:
    """A message's training flag (one it has)."""
    flag = message[key]
    if type(flag) is bool or (type(flag) is int and flag in (0, 1)):
        return bool(flag)
    raise RowError(Drop.WRONG_TYPE, f"message {index}'s {key!r} must be true or false (or 1 / 0), got {flag!r}; "
                   "a value the rule cannot read would leave the message to its role's rule unnoticed")


# Role-span options the {% generation %} markers overrule.
ROLE_SPAN_OPTIONS = ("mask_scope", "train_end_of_turn", "train_on_eos", "end_of_turn_tokens", "think_loss")


def mask_method(config: PipelineConfig, template: ChatTemplate | None) -> bool:
    """Whether {% generation %} markers (where a template has them) say what is trained (input.mask_method)."""
    method = config.input.mask_method
    if method == "generation" and (template is None or not template.marked):
        raise ConfigError("input.mask_method is generation, but the chat template has no {% generation %} markers; "
                          "use mask_method auto or roles, or a template that marks what the assistant generates")
    if method != "roles" and template is not None and template.marked:
        default = type(config.input)()
        changed = [k for k in ROLE_SPAN_OPTIONS if getattr(config.input, k) != getattr(default, k)]
        if changed:
            raise ConfigError(f"the chat template's {{% generation %}} markers say which text is trained, so "
                              f"input.{changed[0]} would be ignored: set input.mask_method to roles to mask by role "
                              "spans with it, or drop the option to follow the markers")
    return method != "roles"
