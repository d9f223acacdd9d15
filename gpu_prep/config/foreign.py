"""Other tools' config keys (Axolotl, TRL, LLaMA-Factory), for messages that say where gpu-prep has
the same setting."""

# Keys of other tools' configs (Axolotl, TRL, LLaMA-Factory) and where gpu-prep says the same.
FOREIGN_KEYS = {
    "base_model": "tokenizer", "model_name_or_path": "tokenizer", "tokenizer_name": "tokenizer",
    "tokenizer_config": "tokenizer", "sequence_len": "preprocessing.max_seq_len",
    "max_seq_length": "preprocessing.max_seq_len", "max_length": "preprocessing.max_seq_len",
    "cutoff_len": "preprocessing.max_seq_len", "sample_packing": "preprocessing.packing (bfd)",
    "packing": "preprocessing.packing (bfd)", "dataset_text_field": "input.text_key (with input.type text)",
    "template": "chat_template", "train_on_inputs": "mask (train_on_inputs: false is mask: {assistant: train}; true is "
                       "mask_default: train)",
    "mask_history": "input.train_last_turn_only", "roles_to_train": "input.roles_to_train",
    "train_on_eos": "input.train_on_eos", "field_messages": "input.messages_key (a dataset's own: input: {...})",
    "message_field_role": "input.role_key", "message_field_content": "input.content_key",
    "path": "data_paths (a list)", "data_files": "data_paths (a list)", "dataset": "datasets (a list)",
    "type": "input.type (a dataset's own: input: {type: ...})", "formatting": "input.type",
    "dataset_prepared_path": "the output folder (gpu-prep run -o OUT)", "output_dir": "gpu-prep run -o OUT",
    "assistant_only_loss": "mask (mask: {assistant: train})",
    "special_tokens": "input.end_of_turn_tokens (what ends a turn) and input.eod_token (what ends a document); "
                      "the tokenizer's own special tokens are read from it",
    "completion_only_loss": "mask (mask.prompt: mask, mask.response: train)",
    # LLaMA-Factory's (dataset_info.json's columns and tags, and its training config's).
    "columns": "input.messages_key (columns.messages; alpaca's prompt, query, response, system are "
               "input.field_instruction, field_input, field_output, field_system; chosen, rejected, kto_tag are "
               "input.chosen_key, rejected_key, label_key)",
    "tags": "input.role_key and input.content_key (role_tag, content_tag), and input.roles (user_tag, "
            "assistant_tag, ...: {user: [human], assistant: [gpt]})",
    "train_on_prompt": "mask_default (train_on_prompt: true is mask_default: train, with input.mask_scope: turn "
                       "to train the turns' headers too)",
    "neat_packing": "preprocessing.packing (bfd: packed rows record where each sample starts, so samples stay apart)",
    "tokenized_path": "the output folder (gpu-prep run -o OUT)",
    "dataset_dir": "data_paths (each dataset's files, folders or globs; no dataset_info.json is read)",
    # The QLoRA seed's keys, read at the top level of a config (gpu_prep/config/qlora_keys.py), found in a section.
    "dataset_schema": "input.type (the QLoRA seed's dataset_schema is read at the top level)",
    "messages_field": "input.messages_key (the QLoRA seed's messages_field is read at the top level)",
    "assistant_roles": "input.roles_to_train (the QLoRA seed's assistant_roles is read at the top level)",
    "truncate_side": "preprocessing.truncation (the QLoRA seed's truncate_side is read at the top level)",
}
