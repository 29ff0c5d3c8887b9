"""Builds the tiny model the real-vLLM tier serves: run by `scripts/real-vllm setup`
with the vLLM venv's Python (it needs torch, transformers and tokenizers).

- A byte-level BPE tokenizer trained on the standard library's own sources
  (offline, the same text the synthetic_agentic corpus reads), with ChatML
  special tokens and a ChatML chat template that renders tools and tool calls.
- A Llama with 4 layers, hidden 128, 4 heads, 2 KV heads, an 8,000-token
  vocabulary and random bf16 weights (about 5 MB): it generates noise, fast,
  through vLLM's real engine, scheduler, prefix cache and pipeline-parallel
  workers, which is all a soak harness needs from it.

Deterministic for one seed; writes into a temporary folder and renames it into
place, so an interrupted build never leaves a half model behind.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import sysconfig
from pathlib import Path

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ChatML, as Qwen-style templates write it: tools (when given) as JSON lines in a
# system preamble, assistant tool calls as <tool_call> blocks, tool results as
# role "tool". Every piece ends with a newline, so token counts of consecutive
# messages add up (the workload's calibration relies on that, and checks it).
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "<|im_start|>system\n"
    "{%- if messages and messages[0]['role'] == 'system' %}\n{{ messages[0]['content'] }}{%- endif %}\n"
    "# Tools\n<tools>\n"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n"
    "</tools><|im_end|>\n"
    "{%- set rest = messages[1:] if (messages and messages[0]['role'] == 'system') else messages %}"
    "{%- else %}"
    "{%- set rest = messages %}"
    "{%- endif %}"
    "{%- for message in rest %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{%- if message['content'] is string %}{{ message['content'] }}"
    "{%- elif message['content'] %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{ part['text'] }}{%- endif %}{%- endfor %}"
    "{%- endif %}"
    "{%- if message['tool_calls'] is defined and message['tool_calls'] %}"
    "{%- for call in message['tool_calls'] %}\n<tool_call>\n"
    "{\"name\": \"{{ call['function']['name'] }}\", \"arguments\": "
    "{%- if call['function']['arguments'] is string %}{{ call['function']['arguments'] }}"
    "{%- else %}{{ call['function']['arguments'] | tojson }}{%- endif %}}\n</tool_call>"
    "{%- endfor %}"
    "{%- endif %}"
    "<|im_end|>\n"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def stdlib_texts(max_bytes: int) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    total = 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        try:
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    return texts


def build_tokenizer(out: Path, *, vocab_size: int, max_bytes: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(stdlib_texts(max_bytes), trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 8192,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps({
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
    }, indent=2))


def build_model(out: Path, *, vocab_size: int, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    tok = json.loads((out / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    eos = vocab.get("<|im_end|>") if "<|im_end|>" in vocab else next(
        t["id"] for t in tok["added_tokens"] if t["content"] == "<|im_end|>")
    pad = next(t["id"] for t in tok["added_tokens"] if t["content"] == "<|endoftext|>")
    hidden, layers, heads, kv_heads, inter = 128, 4, 4, 2, 384
    head_dim = hidden // heads
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": pad,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": pad, "eos_token_id": eos, "pad_token_id": pad}, indent=2))

    gen = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    weights = {
        "model.embed_tokens.weight": normal(vocab_size, hidden),
        "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16),
        "lm_head.weight": normal(vocab_size, hidden),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        weights.update({
            p + "input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
            p + "self_attn.q_proj.weight": normal(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": normal(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": normal(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": normal(hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": normal(inter, hidden),
            p + "mlp.up_proj.weight": normal(inter, hidden),
            p + "mlp.down_proj.weight": normal(hidden, inter),
        })
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--corpus-bytes", type=int, default=6_000_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if (args.out / "model.safetensors").exists() and (args.out / "tokenizer_config.json").exists():
        print(f"model already at {args.out}")
        return 0
    tmp = args.out.with_name(args.out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    build_tokenizer(tmp, vocab_size=args.vocab_size, max_bytes=args.corpus_bytes)
    build_model(tmp, vocab_size=args.vocab_size, seed=args.seed)
    shutil.rmtree(args.out, ignore_errors=True)
    os.replace(tmp, args.out)
    print(f"model written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
