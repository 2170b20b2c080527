"""``llama3_peer``: torchtitan's llama3 at our dense twins' shapes, through the same loop."""


import pytest
import torch

from boost_titan.models import FLAVORS, Transformer
from torchtitan_ext.cola_llama.peers import PEER_FLAVORS

from conftest import ROOT, run_train


@pytest.mark.parametrize("flavor", list(PEER_FLAVORS))
def test_peer_blocks_have_the_dense_twins_shapes(flavor):
    """Every block holds the same weight shapes as our dense twin's (q, k, v, o, gate, up, down, two
    norms; ours stacks q|k|v and gate|up, counted here as their slices); the whole model differs only by
    the untied lm_head (vocab × dim)."""
    from torchtitan.models.llama3.model.model import Transformer as Llama3

    with torch.device("meta"):
        ours, peer = Transformer(FLAVORS[f"{flavor}_fullrank"]), Llama3(PEER_FLAVORS[flavor])

    def block_shapes(model):
        shapes = []
        for p in model.layers["0"].parameters():
            shapes += [tuple(p.shape[1:])] * p.shape[0] if p.dim() == 3 else [tuple(p.shape)]
        return sorted(shapes)

    assert block_shapes(peer) == block_shapes(ours)
    assert len(peer.layers) == len(ours.layers)
    args = FLAVORS[f"{flavor}_fullrank"]
    untied = 0 if not args.tie_embeddings else args.vocab_size * args.dim
    assert sum(p.numel() for p in peer.parameters()) == sum(p.numel() for p in ours.parameters()) + untied


def test_peer_trains_through_the_loop():
    """run_train.sh with ``--model.name llama3_peer`` (tp 2, synthetic tokens, no download): steps run."""
    args = ["--model.name", "llama3_peer", "--model.flavor", "debugmodel", "--training.dataset", "synthetic",
            "--boost.tokenizer", "none", "--boost.synthetic_vocab_size", "512", "--training.seq_len", "64",
            "--training.local_batch_size", "2", "--training.steps", "3", "--metrics.log_freq", "1",
            "--job.dump_folder", str(ROOT / "outputs" / "test_peer")]
    code, log, losses = run_train(args, ngpu=2, timeout=300)
    assert code == 0 and sorted(losses) == [1, 2, 3], log[-3000:]
    assert all(0 < x < 20 for x in losses.values()), losses
