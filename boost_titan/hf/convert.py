"""Our state dict ↔ a Hugging Face directory (config.json + safetensors), without ``transformers``.

Two layouts (docs/hf_export.md):

- dense twins (``<flavor>_fullrank``: every rank 0) are ``LlamaForCausalLM`` checkpoints, read by
  ``transformers`` as they are. Our RoPE rotates the two halves of each head (GPT-NeoX layout) as
  Hugging Face's Llama does, so q/k need no permutation.
- CoLA flavors are Llama with each projection ``W`` replaced by ``B σ(A x)``:
  ``<proj>.A.weight [r, d_in]`` and ``<proj>.B.weight [d_out, r]``, ``model_type = "boost_cola"``,
  loaded with ``trust_remote_code=True`` from the small modeling file the exporter copies beside
  the weights (``modeling_boost_cola.py``).

Our weights are stacked per projection group (``attention.qkv.a.weight [3, r, d]``, one
``b.<run>.weight`` per run of equal output widths, see ``boost_titan.models.model.Projection``);
Hugging Face keeps one tensor per projection. The conversion splits and re-stacks dim 0: exact.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from boost_titan.models.args import TransformerArgs
from boost_titan.models.model import _runs_of_equal

COLA_MODEL_TYPE = "boost_cola"
MODELING_FILE = "modeling_boost_cola.py"

# our projection group → (Hugging Face module of each output, in order)
_GROUPS = {
    "attention.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "attention.o": ("self_attn.o_proj",),
    "feed_forward.gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "feed_forward.down": ("mlp.down_proj",),
}
_NORMS = {"attention.qkv.norm.weight": "input_layernorm.weight",
          "feed_forward.gate_up.norm.weight": "post_attention_layernorm.weight"}
_TOP = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight"}


def _d_outs(args: TransformerArgs, group: str) -> list[int]:
    hd = args.head_dim
    return {"attention.qkv": [args.n_heads * hd, args.kv_heads * hd, args.kv_heads * hd],
            "attention.o": [args.dim], "feed_forward.gate_up": [args.ffn_dim, args.ffn_dim],
            "feed_forward.down": [args.dim]}[group]


def layer_table(args: TransformerArgs) -> dict[str, list[tuple[str, int | None]]]:
    """Per-layer key suffix → the Hugging Face suffixes it holds, each with its index along our dim 0
    (None: the tensor itself)."""
    table: dict[str, list[tuple[str, int | None]]] = {ours: [(hf, None)] for ours, hf in _NORMS.items()}
    for group, hf_names in _GROUPS.items():
        rank = args.attn_rank if group.startswith("attention") else args.mlp_rank
        factor = ".B.weight" if rank else ".weight"
        if rank:
            table[f"{group}.a.weight"] = [(f"{name}.A.weight", j) for j, name in enumerate(hf_names)]
        names = iter(hf_names)
        for run_index, run in enumerate(_runs_of_equal(_d_outs(args, group))):
            table[f"{group}.b.{run_index}.weight"] = [(next(names) + factor, j) for j in range(len(run))]
    return table


_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def to_hf(state_dict: dict[str, torch.Tensor], args: TransformerArgs) -> dict[str, torch.Tensor]:
    """Our (full, plain) tensors → Hugging Face names and shapes. A tied lm_head is not written
    (Hugging Face ties it to ``model.embed_tokens``) unless it is all there is of the pair (a last
    pipeline stage), where it stands for the embedding."""
    table, out = layer_table(args), {}
    for key, value in state_dict.items():
        if m := _LAYER.match(key):
            for hf, index in table[m.group(2)]:
                out[f"model.layers.{m.group(1)}.{hf}"] = value if index is None else value[index]
        elif key == "output.weight" and args.tie_embeddings:
            if "tok_embeddings.weight" not in state_dict:
                out[_TOP["tok_embeddings.weight"]] = value
        elif key in _TOP:
            out[_TOP[key]] = value
        else:
            raise KeyError(f"no Hugging Face name for {key!r}")
    return out


def from_hf(hf_state_dict: dict[str, torch.Tensor], args: TransformerArgs,
            keys: list[str] | None = None) -> dict[str, torch.Tensor]:
    """Hugging Face tensors → ours, re-stacked. ``keys``: the state-dict keys wanted (a pipeline stage's,
    a tied lm_head among them); default: every key of the model that the tensors cover."""
    table = layer_table(args)
    layers = sorted({int(m.group(1)) for k in hf_state_dict if (m := _HF_LAYER.match(k))})
    if keys is None:
        keys = [f"layers.{i}.{suffix}" for i in layers for suffix in table]
        keys += [k for k, hf in _TOP.items() if hf in hf_state_dict]
        if args.tie_embeddings and "tok_embeddings.weight" in keys:
            keys.append("output.weight")
    out = {}
    for key in keys:
        if m := _LAYER.match(key):
            parts = [(f"model.layers.{m.group(1)}.{hf}", index) for hf, index in table[m.group(2)]]
            missing = [hf for hf, _ in parts if hf not in hf_state_dict]
            if missing:
                raise KeyError(f"{key!r} needs {missing} from the Hugging Face checkpoint")
            tensors = [hf_state_dict[hf] for hf, _ in parts]
            out[key] = tensors[0] if parts[0][1] is None else torch.stack(tensors)
        elif key == "output.weight" and args.tie_embeddings:
            out[key] = hf_state_dict[_TOP["tok_embeddings.weight"]]
        else:
            out[key] = hf_state_dict[_TOP[key]]
    return out


def is_cola(args: TransformerArgs) -> bool:
    return bool(args.attn_rank or args.mlp_rank)


def hf_config(args: TransformerArgs, dtype: torch.dtype = torch.float32) -> dict:
    """config.json: Llama's keys (``transformers`` 4.x reads ``rope_theta``, 5.x ``rope_parameters``),
    plus the two ranks and the auto classes for CoLA."""
    config = {
        "architectures": ["ColaForCausalLM" if is_cola(args) else "LlamaForCausalLM"],
        "model_type": COLA_MODEL_TYPE if is_cola(args) else "llama",
        "vocab_size": args.vocab_size, "hidden_size": args.dim, "intermediate_size": args.ffn_dim,
        "num_hidden_layers": args.n_layers, "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.kv_heads, "head_dim": args.head_dim,
        # CoLA's MLP is B σ(A x) ⊙ B σ(A x) with no activation outside the bottlenecks
        "hidden_act": "silu" if args.swiglu else "linear",
        "max_position_embeddings": args.max_seq_len, "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": args.rope_theta},
        "tie_word_embeddings": args.tie_embeddings, "attention_bias": False, "mlp_bias": False,
        "bos_token_id": None, "eos_token_id": None, "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if is_cola(args):
        config.update(attn_rank=args.attn_rank, mlp_rank=args.mlp_rank, auto_map={
            "AutoConfig": f"{MODELING_FILE[:-3]}.ColaConfig",
            "AutoModelForCausalLM": f"{MODELING_FILE[:-3]}.ColaForCausalLM"})
    return config


def args_from_hf_config(config: dict) -> TransformerArgs:
    """The model args a config.json describes (ours or any Llama without biases or RoPE scaling)."""
    rope = config.get("rope_parameters") or {"rope_type": "default", "rope_theta": config.get("rope_theta", 10000.0)}
    unsupported = [k for k, bad in [("attention_bias", config.get("attention_bias")), ("mlp_bias", config.get("mlp_bias")),
                                    ("rope_type", rope.get("rope_type", "default") != "default"),
                                    ("hidden_act", config.get("hidden_act", "silu") not in ("silu", "linear"))] if bad]
    if unsupported:
        raise ValueError(f"config.json sets {unsupported}: this family has no biases, plain RoPE and a "
                         "silu-gated or linear MLP")
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if head_dim * config["num_attention_heads"] != config["hidden_size"]:
        raise ValueError(f"head_dim={head_dim} × num_attention_heads={config['num_attention_heads']} != "
                         f"hidden_size={config['hidden_size']}: not supported by this family")
    kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    return TransformerArgs(
        dim=config["hidden_size"], n_layers=config["num_hidden_layers"], n_heads=config["num_attention_heads"],
        n_kv_heads=None if kv_heads == config["num_attention_heads"] else kv_heads, ffn_dim=config["intermediate_size"],
        vocab_size=config["vocab_size"], attn_rank=config.get("attn_rank", 0), mlp_rank=config.get("mlp_rank", 0),
        swiglu=config.get("hidden_act", "silu") == "silu", norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=float(rope["rope_theta"]), max_seq_len=config.get("max_position_embeddings", 2048),
        tie_embeddings=config.get("tie_word_embeddings", False))


def write_hf_metadata(path: str | Path, args: TransformerArgs, dtype: torch.dtype = torch.float32) -> None:
    """config.json (and, for CoLA, the modeling file) into a directory that holds the weights."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf_config(args, dtype), indent=2) + "\n")
    if is_cola(args):
        (path / MODELING_FILE).write_text((Path(__file__).parent / MODELING_FILE).read_text())


def save_hf(path: str | Path, state_dict: dict[str, torch.Tensor], args: TransformerArgs) -> None:
    """A whole Hugging Face directory from one process: config.json, (modeling file), model.safetensors."""
    from safetensors.torch import save_file

    hf = {k: v.detach().contiguous().cpu() for k, v in to_hf(state_dict, args).items()}
    dtypes = {v.dtype for v in hf.values()}
    write_hf_metadata(path, args, dtypes.pop() if len(dtypes) == 1 else torch.float32)
    save_file(hf, str(Path(path) / "model.safetensors"), metadata={"format": "pt"})


def load_hf(path: str | Path) -> tuple[TransformerArgs, dict[str, torch.Tensor]]:
    """(args, our state dict) from a Hugging Face directory of this family (or a plain Llama)."""
    from safetensors.torch import load_file

    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{path} has no config.json: not a Hugging Face model directory")
    args = args_from_hf_config(json.loads(config_file.read_text()))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} has no *.safetensors weights")
    hf: dict[str, torch.Tensor] = {}
    for f in files:
        hf.update(load_file(str(f)))
    if args.tie_embeddings:  # some writers store the tied lm_head too
        hf.pop("lm_head.weight", None)
    return args, from_hf(hf, args)
