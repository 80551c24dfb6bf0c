"""A model card from a Hugging Face ``config.json``: ``device.model_card: {hf_config: path/to/config.json}``.

The shapes are read under the names the common architectures use (Llama, Mistral, Qwen2/3, Mixtral,
Qwen3-MoE, gpt-oss, DeepSeek-V2/V3); the parameter count is then computed from them by
:class:`~simbatch.config.cards.ModelCard`, never typed. Like the YAML loader, it reads a file into a
schema's fields and imports nothing of the hardware model. What the file says about its checkpoint that a preset must
say itself (fp8 weights, an fp8 KV cache) is returned as advice by :func:`checkpoint_notes`.
"""

from __future__ import annotations

import json
from pathlib import Path

MAX_BYTES = 1 << 20
"""A config.json is a few kilobytes; anything over a mebibyte is not one (and is not read)."""
MXFP4_BITS = 4.25  # 4-bit values in blocks of 32 sharing one 8-bit scale


def read(path: Path) -> dict:
    """The JSON object of ``path``, or ValueError naming the file and what is wrong."""
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise ValueError(f"hf_config {path}: not a regular file; give a config.json")
        if size > MAX_BYTES:
            raise ValueError(f"hf_config {path}: {size:,} bytes, more than a config.json has (1 MiB at most)")
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"hf_config {path}: file not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"hf_config {path}: not a readable JSON file ({exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"hf_config {path}: a JSON object (a Hugging Face config.json) is needed")
    # Multimodal configs keep the language model's shapes in a sub-config.
    return config.get("text_config") if isinstance(config.get("text_config"), dict) else config


def _name(path: Path, config: dict) -> str:
    """The card's name: the folder or repository name (``Qwen/Qwen3-8B`` -> ``Qwen3-8B``), or the file's stem."""
    given = config.get("_name_or_path")
    if isinstance(given, str) and given.strip("/"):
        return given.strip("/").split("/")[-1]
    stem = path.name.removesuffix(".json").removesuffix(".config").removesuffix("config").rstrip("._-")
    return stem or path.resolve().parent.name


def _int(config: dict, *keys: str, path: Path, default=None) -> int | None:
    for key in keys:
        value = config.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"hf_config {path}: {key} is {value!r}, not a whole number")
            return value
    if default is None:
        raise ValueError(f"hf_config {path}: none of {', '.join(keys)} is given; is it a decoder-only "
                         "transformer's config.json?")
    return default


def shapes(config: dict, path: Path) -> dict:
    """The :class:`~.cards.ModelCard` fields ``config`` describes."""
    get = lambda *keys, default=None: _int(config, *keys, path=path, default=default)  # noqa: E731
    layers = get("num_hidden_layers", "n_layer", "num_layers")
    hidden = get("hidden_size", "n_embd", "d_model")
    q_heads = get("num_attention_heads", "n_head")
    quant = config.get("quantization_config") or {}
    fields = {"layers": layers, "hidden_size": hidden, "q_heads": q_heads,
              "kv_heads": get("num_key_value_heads", default=q_heads),
              "vocab_size": get("vocab_size"), "tie_word_embeddings": bool(config.get("tie_word_embeddings", False))}
    if config.get("kv_lora_rank"):  # MLA (DeepSeek-V2/V3)
        rope = get("qk_rope_head_dim")
        fields |= {"kv_lora_rank": get("kv_lora_rank"), "qk_rope_head_dim": rope,
                   "head_dim": get("qk_nope_head_dim") + rope, "v_head_dim": get("v_head_dim")}
        if config.get("q_lora_rank"):
            fields["q_lora_rank"] = get("q_lora_rank")
    else:
        fields["head_dim"] = get("head_dim", default=hidden // q_heads)
    experts = get("num_local_experts", "num_experts", "n_routed_experts", default=0)
    if experts > 1:
        fields |= {"num_experts": experts, "experts_per_token": get("num_experts_per_tok", "experts_per_token"),
                   "shared_experts": get("n_shared_experts", default=0),
                   "dense_layers": get("first_k_dense_replace", default=0)}
        if config.get("moe_intermediate_size"):
            fields["moe_intermediate_size"] = get("moe_intermediate_size")
        sparse_step = get("decoder_sparse_step", "moe_layer_freq", default=1)
        if sparse_step != 1 or config.get("mlp_only_layers"):
            raise ValueError(f"hf_config {path}: experts on only some layers (decoder_sparse_step / "
                             "mlp_only_layers) are not modelled; write the card by hand")
        if isinstance(quant, dict) and quant.get("quant_method") == "mxfp4":
            fields["expert_bits"] = MXFP4_BITS
    fields["intermediate_size"] = get("intermediate_size", "n_inner", "ffn_dim",
                                      default=fields.get("moe_intermediate_size", 4 * hidden))
    if config.get("model_type") in ("gptj", "gpt2", "gpt_neox", "opt", "falcon"):
        fields["gated_mlp"] = False
    context = get("max_position_embeddings", "n_positions", "max_sequence_length", default=0)
    if context:
        fields["max_position_embeddings"] = context
    if isinstance(quant, dict) and str(quant.get("kv_cache_quant_algo", "")).lower().startswith("fp8"):
        fields["kv_cache_dtype"] = "fp8"
    window = config.get("sliding_window")
    kinds = config.get("layer_types")
    if isinstance(window, int) and window > 0:
        if isinstance(kinds, list):
            sliding = sum(kind == "sliding_attention" for kind in kinds)
        else:
            sliding = layers if config.get("use_sliding_window", True) else 0
        if sliding:
            fields |= {"sliding_window": window, "sliding_layers": sliding}
    return fields


def card_fields(data: dict, base_dir: Path | None = None) -> dict:
    """``{hf_config: path, name?: ..., source?: ...}`` -> the card's fields (the file read, the path
    resolved against ``base_dir``, the scenario's folder). Fields given beside ``hf_config`` win."""
    given = dict(data)
    raw = given.pop("hf_config")
    if not isinstance(raw, str | Path) or not str(raw).strip():
        raise ValueError("hf_config must be the path of a Hugging Face config.json")
    path = Path(raw).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    config = read(path)
    fields = shapes(config, path) | {"name": _name(path, config),
                                     "source": f"{raw} (Hugging Face config.json; parameters counted from the shapes)"}
    return fields | given


def checkpoint_notes(path: Path) -> list[str]:
    """What the config says about its checkpoint that the preset and the cache must say themselves."""
    config = read(path)
    quant = config.get("quantization_config") or {}
    notes = []
    if not isinstance(quant, dict):
        return notes
    method = str(quant.get("quant_method", "")).lower()
    if method in ("fp8", "modelopt", "compressed-tensors") and "fp8" in json.dumps(quant).lower():
        notes.append("the checkpoint's weights are fp8: add /fp8 to the preset")
    if str(quant.get("kv_cache_quant_algo", "")).lower().startswith("fp8"):
        notes.append("the checkpoint quantises its KV cache to fp8: kv_cache.dtype auto means fp8 for it, as in vLLM")
    return notes
