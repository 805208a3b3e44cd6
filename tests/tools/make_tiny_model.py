"""Write a tiny real llama-architecture GGUF: the vocabulary of llama.cpp's ggml-vocab-llama-spm.gguf
(shipped in llama.cpp's source) with small random weights: 2 layers, 64-dim embeddings, 4 heads
(2 KV heads, so grouped-query attention is exercised), 128-dim FFN, context 2048. About 17 MB.

Usage: python -m tests.tools.make_tiny_model VOCAB.gguf OUT.gguf
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np

LAYERS = 2
EMBED = 64
HEADS = 4
KV_HEADS = 2
FFN = 128
CONTEXT = 2048


def copy_tokenizer(reader: gguf.GGUFReader, writer: gguf.GGUFWriter) -> int:
    vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        types = field.types
        value = field.contents()
        if types[0] == gguf.GGUFValueType.ARRAY:
            if key == "tokenizer.ggml.tokens":
                vocab = len(value)
            writer.add_array(key, value)
        elif types[0] == gguf.GGUFValueType.STRING:
            writer.add_string(key, value)
        elif types[0] == gguf.GGUFValueType.BOOL:
            writer.add_bool(key, value)
        elif types[0] == gguf.GGUFValueType.UINT32:
            writer.add_uint32(key, value)
        elif types[0] == gguf.GGUFValueType.INT32:
            writer.add_int32(key, value)
        elif types[0] == gguf.GGUFValueType.FLOAT32:
            writer.add_float32(key, value)
    return vocab


def make(vocab_path: Path, out: Path, seed: int = 0) -> Path:
    reader = gguf.GGUFReader(str(vocab_path))
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name("engine-ctl tiny llama")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(EMBED)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(EMBED // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocab = copy_tokenizer(reader, writer)
    writer.add_vocab_size(vocab)
    rng = np.random.default_rng(seed)
    head_dim = EMBED // HEADS

    def t(name: str, *shape: int) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    t("token_embd.weight", vocab, EMBED)
    writer.add_tensor("output_norm.weight", np.ones(EMBED, dtype=np.float32))
    t("output.weight", vocab, EMBED)
    for i in range(LAYERS):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(EMBED, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(EMBED, dtype=np.float32))
        t(f"blk.{i}.attn_q.weight", EMBED, EMBED)
        t(f"blk.{i}.attn_k.weight", KV_HEADS * head_dim, EMBED)
        t(f"blk.{i}.attn_v.weight", KV_HEADS * head_dim, EMBED)
        t(f"blk.{i}.attn_output.weight", EMBED, EMBED)
        t(f"blk.{i}.ffn_gate.weight", FFN, EMBED)
        t(f"blk.{i}.ffn_up.weight", FFN, EMBED)
        t(f"blk.{i}.ffn_down.weight", EMBED, FFN)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


if __name__ == "__main__":
    make(Path(sys.argv[1]), Path(sys.argv[2]))
