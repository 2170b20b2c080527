"""Hugging Face export / import and generation, against ``transformers`` as the independent reference.

Export → ``transformers`` loads the directory (``LlamaForCausalLM`` for dense twins, the shipped
CoLA modeling file with ``trust_remote_code``) → its logits equal ours (fp32, ≤ 1e-5); import back →
the identical parameters; greedy generation of 16 tokens → the same tokens as ``transformers``'
own ``generate``. Through torchtitan's loop (export under btp tp 2, import under tp 1 and tp 2):
tests/test_torchtitan_e2e.py.
"""

import json
import subprocess
import sys

import pytest
import torch

from boost_titan.checkpoints import load_model
from boost_titan.generation import generate, sample_next
from boost_titan.hf import args_from_hf_config, hf_config, load_hf, save_hf
from boost_titan.models import Transformer

from conftest import TINY

transformers = pytest.importorskip("transformers")

DENSE = TINY.replace(attn_rank=0, mlp_rank=0, swiglu=True)
CASES = {
    "dense_mha_untied": DENSE,
    "dense_gqa_tied": DENSE.replace(n_kv_heads=2, tie_embeddings=True),
    "cola_mha_untied": TINY,
    "cola_gqa_tied": TINY.replace(n_kv_heads=4, tie_embeddings=True),
    "cola_swiglu_dense_attention": TINY.replace(attn_rank=0, swiglu=True),
}


def _model(args, seed=0):
    model = Transformer(args.replace(init_seed=seed))
    model.init_weights(torch.device("cpu"))
    return model.eval()


def _export(tmp_path, args):
    model = _model(args)
    save_hf(tmp_path, model.state_dict(), args)
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True,
                                                                  dtype=torch.float32).eval()
    return model, reference


@pytest.mark.parametrize("case", list(CASES))
def test_export_loads_in_transformers_with_our_logits(tmp_path, case):
    args = CASES[case]
    model, reference = _export(tmp_path, args)
    expected = "LlamaForCausalLM" if not (args.attn_rank or args.mlp_rank) else "ColaForCausalLM"
    assert type(reference).__name__ == expected
    ours_n = sum(p.numel() for p in model.parameters())
    assert sum(p.numel() for p in reference.parameters()) == ours_n  # no parameter left out or duplicated
    tokens = torch.randint(0, args.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(tokens), reference(tokens).logits
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5 * ours.abs().max().item())


@pytest.mark.parametrize("case", list(CASES))
def test_import_gives_back_identical_parameters(tmp_path, case):
    args = CASES[case]
    model = _model(args)
    save_hf(tmp_path, model.state_dict(), args)
    loaded_args, state = load_hf(tmp_path)
    assert loaded_args == args
    expected = model.state_dict()
    assert set(state) == set(expected)
    for key, value in expected.items():
        assert torch.equal(state[key], value), key
    # and through the inference loader
    again = load_model(tmp_path)
    for key, value in again.state_dict().items():
        assert torch.equal(value, expected[key]), key


@pytest.mark.parametrize("case", ["dense_gqa_tied", "cola_mha_untied"])
def test_greedy_generation_matches_transformers(tmp_path, case):
    args = CASES[case]
    model, reference = _export(tmp_path, args)
    prompt = torch.randint(0, args.vocab_size, (2, 5), generator=torch.Generator().manual_seed(2))
    ours = generate(model, prompt, 16)
    theirs = reference.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16,
                                do_sample=False, pad_token_id=0)
    assert ours.shape == (2, 21)
    assert torch.equal(ours, theirs)


def test_sampling_respects_temperature_and_top_p():
    logits = torch.tensor([[0.0, 3.0, 2.9, -5.0]])
    assert sample_next(logits).tolist() == [1]
    g = torch.Generator().manual_seed(0)
    # top_p below the first token's probability: only the most likely token remains
    assert {sample_next(logits, 1.0, 0.3, g).item() for _ in range(50)} == {1}
    # top_p covering the two leaders: both appear, the two unlikely tokens never do
    assert {sample_next(logits, 1.0, 0.9, g).item() for _ in range(200)} == {1, 2}
    with pytest.raises(ValueError, match="top_p=0"):
        sample_next(logits, 1.0, 0.0)


def test_config_round_trip_and_clear_errors():
    for args in CASES.values():
        config = json.loads(json.dumps(hf_config(args)))
        assert args_from_hf_config(config) == args
    bad = hf_config(TINY) | {"attention_bias": True}
    with pytest.raises(ValueError, match="attention_bias"):
        args_from_hf_config(bad)


def test_exporter_needs_no_transformers(tmp_path):
    """Writing and reading an export works with transformers unimportable."""
    code = ("import sys; sys.modules['transformers'] = None; sys.path.insert(0, 'tests')\n"
            "import torch\nfrom conftest import TINY\nfrom boost_titan.models import Transformer\n"
            "from boost_titan.hf import save_hf, load_hf\n"
            "m = Transformer(TINY); m.init_weights(torch.device('cpu'))\n"
            f"save_hf({str(tmp_path)!r}, m.state_dict(), TINY)\n"
            f"args, state = load_hf({str(tmp_path)!r})\nassert args == TINY\nprint('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_generate_script_on_an_export(tmp_path):
    args = CASES["cola_mha_untied"]
    model = _model(args)
    save_hf(tmp_path, model.state_dict(), args)
    cmd = [sys.executable, "scripts/generate.py", str(tmp_path), "--tokenizer", "none", "--prompt", "1 2 3",
           "--max-new-tokens", "6"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    printed = out.stdout.strip().splitlines()[-1].split()
    expected = generate(model, torch.tensor([[1, 2, 3]]), 6)[0].tolist()
    assert [int(t) for t in printed] == expected
    bad = subprocess.run([*cmd[:2], str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("generate: ") and len(bad.stderr.splitlines()) == 1


def test_a_pipeline_stage_converts_only_its_own_keys():
    """A last pipeline stage holds layers and the (tied) lm_head but no embedding: its lm_head stands for
    ``model.embed_tokens.weight`` both ways; ``keys`` limits the import to the stage's parameters."""
    from boost_titan.hf import from_hf, to_hf

    args = CASES["cola_gqa_tied"]
    full = _model(args).state_dict()
    stage = {k: v for k, v in full.items() if k.startswith(("layers.1.", "norm.", "output."))}
    hf = to_hf(stage, args)
    assert "model.embed_tokens.weight" in hf and "lm_head.weight" not in hf
    assert all(k.startswith(("model.layers.1.", "model.norm.", "model.embed_tokens.")) for k in hf)
    back = from_hf(hf, args, keys=list(stage))
    assert set(back) == set(stage) and all(torch.equal(back[k], stage[k]) for k in stage)
