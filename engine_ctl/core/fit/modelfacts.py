"""What a model's files say: GGUF metadata (as the facts probe reads it on a host) and safetensors checkpoints'
config.json plus index. Values in `ModelFacts`; readers for a local path (shell)."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict

# GGUF general.file_type (LLAMA_FTYPE in ggml's llama.h) -> name
GGUF_FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
}  # fmt: skip

# Bits per weight of common GGUF quantizations, for an estimate from a parameter count when no file is at
# hand. Q4_K_M is calibrated on the seed's figure: Llama 3.1 70B (70.55e9 parameters) at Q4_K_M is 42.5 GB.
BITS_PER_WEIGHT = {
    "F32": 32.0, "F16": 16.0, "BF16": 16.0, "Q8_0": 8.5, "Q6_K": 6.56, "Q5_K_M": 5.69, "Q5_K_S": 5.54,
    "Q5_0": 5.5, "Q4_K_M": 4.82, "Q4_K_S": 4.58, "Q4_0": 4.55, "IQ4_XS": 4.25, "Q3_K_M": 3.91, "Q2_K": 3.35,
}  # fmt: skip
SAFETENSORS_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "fp8": 1, "int8": 1}


class ModelFacts(BaseModel):
    """The shape of a model, from its files."""

    model_config = ConfigDict(frozen=True)

    architecture: str | None = None
    context_length: int | None = None
    block_count: int | None = None
    head_count: int | None = None
    head_count_kv: int | None = None
    embedding_length: int | None = None
    key_length: int | None = None
    value_length: int | None = None
    file_type: str | None = None
    dtype: str | None = None
    parameters: int | None = None
    weights_bytes: int | None = None
    pooling: str | None = None
    sliding_window: int | None = None

    @property
    def head_dims(self) -> tuple[int, int] | None:
        if self.key_length and self.value_length:
            return self.key_length, self.value_length
        if self.embedding_length and self.head_count:
            dim = self.embedding_length // self.head_count
            return dim, dim
        return None

    @property
    def has_shape(self) -> bool:
        return bool(self.block_count and self.head_count_kv and self.head_dims)


def facts_from_gguf_fields(fields: dict[str, object], weights_bytes: int | None = None) -> ModelFacts:
    """Pure: GGUF key/values -> ModelFacts."""
    arch = str(fields.get("general.architecture") or "") or None

    def key(name: str) -> int | None:
        value = fields.get(f"{arch}.{name}")
        if isinstance(value, list):  # per-layer arrays (some architectures): take the largest
            value = max(value) if value else None
        return int(value) if isinstance(value, int | float) else None

    ftype = fields.get("general.file_type")
    pooling_names = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
    pooling = key("pooling_type")
    params = fields.get("general.parameter_count")
    return ModelFacts(
        architecture=arch,
        context_length=key("context_length"),
        block_count=key("block_count"),
        head_count=key("attention.head_count"),
        head_count_kv=key("attention.head_count_kv") or key("attention.head_count"),
        embedding_length=key("embedding_length"),
        key_length=key("attention.key_length"),
        value_length=key("attention.value_length"),
        file_type=GGUF_FILE_TYPES.get(int(ftype)) if isinstance(ftype, int) else None,
        parameters=int(params) if isinstance(params, int) else None,
        weights_bytes=weights_bytes,
        pooling=pooling_names.get(pooling) if pooling is not None else None,
        sliding_window=key("attention.sliding_window"),
    )


def facts_from_hf_config(config: dict[str, object], weights_bytes: int | None, parameters: int | None) -> ModelFacts:
    """Pure: a Hugging Face config.json -> ModelFacts."""
    text = config.get("text_config")
    if isinstance(text, dict):
        config = {**config, **text}

    def num(*names: str) -> int | None:
        for n in names:
            v = config.get(n)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
        return None

    heads = num("num_attention_heads", "n_head")
    hidden = num("hidden_size", "d_model", "n_embd")
    head_dim = num("head_dim") or (hidden // heads if hidden and heads else None)
    archs = config.get("architectures")
    return ModelFacts(
        architecture=str(archs[0])
        if isinstance(archs, list) and archs
        else str(config.get("model_type") or "") or None,
        context_length=num("max_position_embeddings", "n_positions", "seq_length"),
        block_count=num("num_hidden_layers", "n_layer"),
        head_count=heads,
        head_count_kv=num("num_key_value_heads") or heads,
        embedding_length=hidden,
        key_length=head_dim,
        value_length=head_dim,
        dtype=str(config.get("torch_dtype") or config.get("dtype") or "") or None,
        parameters=parameters,
        weights_bytes=weights_bytes,
        sliding_window=num("sliding_window"),
    )


def read_safetensors_dir(path: Path) -> ModelFacts:
    """Read a local checkpoint directory: config.json, the index's total_size, else the files' sizes."""
    config = json.loads((path / "config.json").read_text())
    weights: int | None = None
    index = path / "model.safetensors.index.json"
    if index.exists():
        meta = json.loads(index.read_text()).get("metadata", {})
        weights = int(meta["total_size"]) if "total_size" in meta else None
    if weights is None:
        weights = sum(p.stat().st_size for p in path.glob("*.safetensors")) or None
    return facts_from_hf_config(config, weights, None)


def estimate_weights_bytes(parameters: int, fmt: str, quant: str | None = None, dtype: str | None = None) -> int:
    """Weights from a parameter count: GGUF by quantization (Q4_K_M when unknown), safetensors by dtype."""
    if fmt == "gguf":
        return int(parameters * BITS_PER_WEIGHT.get((quant or "Q4_K_M").upper(), 4.82) / 8)
    return parameters * SAFETENSORS_DTYPE_BYTES.get((dtype or "bfloat16").lower(), 2)
