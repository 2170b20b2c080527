"""run_train.sh's preflight: every bad value of a config gives one line naming it and the rule."""

import re

import pytest
import torch

from torchtitan_ext.runtime.preflight import problems

BASE = ["--job.config_file", "train_configs/debug_cpu.toml"]


def test_the_shipped_configs_pass():
    assert problems(BASE, 2) == []
    assert problems(["--job.config_file", "train_configs/cola_1b_h200.toml"], 1) == []


@pytest.mark.parametrize("overrides, world, expected", [
    (["--model.flavor", "nope"], 2, "unknown cola_llama flavor 'nope'; available: tiny"),
    (["--boost.tp_strategy", "fullrank"], 2, "tp_strategy='fullrank' is for the dense '_fullrank' flavors"),
    (["--parallelism.tensor_parallel_degree", "3"], 3, "dim=256 is not divisible by the tensor-parallel degree 3"),
    ([], 3, "NGPU=3 is not divisible by tp·pp·cp·dp_replicate = 2"),
    (["--parallelism.data_parallel_shard_degree", "2"], 2, "NGPU=2 != dp_shard·tp·pp·cp·dp_replicate = 4"),
    (["--training.seq_len", "250"], 2, "training.seq_len=250 must be divisible by 4 (tp · 2 · cp)"),
    (["--training.dataset", "nope"], 2, "training.dataset='nope' is unknown; choose one of ['synthetic'"),
    (["--training.dataset", "corpus", "--training.dataset_path", "/nonexistent/corpus"], 2,
     "Corpus file /nonexistent/corpus/train.jsonl.gz not found"),
    (["--boost.tokenizer", "cl100k_base"], 2, "tokenizer 'cl100k_base' has 100277 tokens but the model's vocab_size is 50304"),
    (["--boost.lowrank_checkpoint", "--activation_checkpoint.mode", "full"], 2,
     "lowrank_checkpoint=true replaces activation_checkpoint.mode='full'"),
    (["--boost.fused_cross_entropy"], 2, "fused_cross_entropy=true needs the whole lm_head on each rank (tp = 1, pp = 1)"),
    (["--activation_checkpoint.mode", "memory_budget"], 2,
     "activation_checkpoint.mode='memory_budget' chooses what to recompute inside compiled graphs: it needs --compile.enable"),
    (["--activation_checkpoint.mode", "memory_budget", "--compile.enable", "--activation_checkpoint.memory_budget", "1.5"],
     2, "activation_checkpoint.memory_budget=1.5 must be in [0, 1]"),
    (["--boost.fsdp_blocks_per_unit", "0"], 2, "[boost] fsdp_blocks_per_unit=0 must be at least 1"),
    (["--boost.one_rank_fsdp_groups", "9"], 2, "[boost] one_rank_fsdp_groups=9 must be between 1 and the 4 blocks"),
    (["--parallelism.context_parallel_degree", "2"], 4, "context_parallel_degree=2: context parallelism is not supported"),
    (["--boost.cudagraphs"], 2, "cudagraphs=true replays the compiled blocks as CUDA graphs: set compile.enable = true"),
    (["--boost.cudagraphs", "--compile.enable", "--compile.backend", "aot_eager"], 2,
     "cudagraphs=true needs compile.backend = 'inductor', got 'aot_eager'"),
    (["--boost.cudagraphs", "--compile.enable"], 2, "cudagraphs=true needs a CUDA device; this run computes on cpu"),
    (["--boost.step_cudagraph"], 2,
     "step_cudagraph=true captures the train step as a CUDA graph: it needs a CUDA device; this run computes on cpu"),
])
def test_each_problem_is_named(overrides, world, expected, monkeypatch):
    if expected.endswith("this run computes on cpu"):  # the errors of a machine without a GPU, on any machine
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    found = problems(BASE + overrides, world)
    assert any(expected in p for p in found), found


@pytest.mark.parametrize("overrides, expected", [
    (["--boost.cudagraphs", "--compile.enable"], "set [boost] cudagraphs = false (CUDA graphs cannot nest)"),
    (["--parallelism.pipeline_parallel_degree", "2"], "needs pipeline_parallel_degree = 1 (got 2)"),
    (["--optimizer.implementation", "foreach"], "implementation = 'fused' (got 'AdamW', 'foreach')"),
    (["--optimizer.name", "SGD"], "(got 'SGD', 'fused')"),
    (["--validation.enable"], "set validation.enable = false"),
    ([], None),
])
def test_step_cudagraph_problems_on_a_cuda_device(overrides, expected):
    """Each setting a captured step cannot run with is named, as on a GPU machine (the device is only
    compared here, so this runs on the CPU)."""
    from torchtitan.config import ConfigManager

    import torchtitan_ext  # noqa: F401  (the [boost] section)
    from torchtitan_ext.cola_llama.job_config import step_cudagraph_problem

    job = ConfigManager().parse_args(BASE + ["--boost.step_cudagraph", *overrides])
    problem = step_cudagraph_problem(job, torch.device("cuda"))
    assert problem == expected if expected is None else expected in problem, problem
    assert step_cudagraph_problem(ConfigManager().parse_args(BASE), torch.device("cpu")) is None  # off: fine


def test_each_rule_is_written_once():
    """Every message of the family's rules lives in ``cola_llama/job_config.py`` alone: the preflight,
    parallelize and the trainer call those functions instead of repeating a check."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    messages = ["lowrank_checkpoint=true replaces", "fsdp_blocks_per_unit={", "one_rank_fsdp_groups={",
                "cudagraphs=true needs", "step_cudagraph=true needs", "fused_cross_entropy=true needs",
                "must be divisible by {tp * 2 * cp}", "context parallelism is not supported",
                "memory_budget={", "is not divisible by tp·pp·cp", "needs RDZV_ENDPOINT", "(checkpoint.initial_load_path, else",
                "but the model's vocab_size is"]
    sources = {p: p.read_text() for folder in ("boost_titan", "torchtitan_ext") for p in (root / folder).rglob("*.py")}
    for message in messages:
        where = [p.relative_to(root).as_posix() for p, text in sources.items() if message in text]
        assert where == ["torchtitan_ext/cola_llama/job_config.py"], (message, where)


def test_eta_text_by_hand():
    from torchtitan_ext.runtime.logs import eta_text

    assert eta_text(1, 30, 1, 100.0, 100.0) == "  [1/30, eta n/a]"
    # 10 steps after the first logged one took 20 s: 2 s a step, 20 steps left → 40 s
    assert eta_text(11, 31, 1, 100.0, 120.0) == "  [11/31, 0:00:20 elapsed, eta 0:00:40]"


def _run_train(*args, **env):
    import os
    import subprocess
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    start = time.monotonic()
    proc = subprocess.run(["./scripts/run_train.sh", *args], cwd=root, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120)
    return proc, time.monotonic() - start


def test_help_lists_the_boost_keys_at_once():
    """``--help`` answers without torchtitan (whose option parser --help-all builds: ~20 s); counted by
    the imports Python reports, since a time bound would depend on the machine's load."""
    proc, _ = _run_train("--help", PYTHONPROFILEIMPORTTIME="1")
    imported = re.findall(r"^import time:.*\|\s*(\S+)$", proc.stderr, flags=re.M)
    assert proc.returncode == 0 and "boost_titan.parallel" in imported, proc.stderr[-500:]
    assert not [m for m in imported if m.split(".")[0] == "torchtitan"]
    assert "tp_strategy = 'btp'" in proc.stdout and "lowrank_checkpoint" in proc.stdout and "--help-all" in proc.stdout


def test_missing_config_file_is_one_line():
    proc, seconds = _run_train(CONFIG_FILE="train_configs/nope.toml")
    assert proc.returncode == 2 and seconds < 5
    assert proc.stderr.strip().count("\n") == 0 and "CONFIG_FILE=train_configs/nope.toml does not exist" in proc.stderr


@pytest.mark.parametrize("content, expected", [
    (b'{"text": "one"}\n{"text": "tw', "line 2: not a JSON record"),                    # truncated line
    (b'{"text": "one"}\n{"text": "\xff\xfe"}\n', "line 2: not UTF-8"),
    (b'{"text": "one"}\n{"title": "no text"}\n', 'line 2: the record has no "text" string'),
    (b"\n\n", "holds no documents"),
])
def test_bad_data_is_one_line_naming_file_and_line(tmp_path, content, expected):
    bad = tmp_path / "train.jsonl"
    bad.write_bytes(content)
    (found,) = problems(BASE + ["--training.dataset", "corpus", "--training.dataset_path", str(bad)], 2)
    assert found.startswith(str(bad)) and expected in found, found


def test_corrupt_gzip_corpus_is_named(tmp_path):
    import gzip

    good = gzip.compress(b'{"text": "hello"}\n' * 1000)
    bad = tmp_path / "train.jsonl.gz"
    bad.write_bytes(good[: len(good) // 2])  # cut mid-stream, as an interrupted copy leaves it
    (found,) = problems(BASE + ["--training.dataset", "corpus", "--training.dataset_path", str(bad)], 2)
    assert found.startswith(f"{bad} is corrupt or truncated"), found


def test_dataset_too_short_for_one_batch_on_a_rank(tmp_path):
    from torchtitan_ext.cola_llama.data.datasets import DataError, _packed_loader
    from torchtitan_ext.cola_llama.data.tokenizer import build_tokenizer

    short = tmp_path / "train.jsonl"
    short.write_text('{"text": "a few words only"}\n{"text": "and a few more"}\n')
    job = _job(["--training.dataset", "corpus", "--training.dataset_path", str(short)])
    with pytest.raises(DataError, match=r"corpus: DP rank 1 holds \d+ tokens, fewer than one batch \(4 x 257\)"):
        _packed_loader("corpus", str(short), build_tokenizer(job), 256, 4, job.training.dataloader, 1, 2, True)


def _job(overrides):
    from torchtitan.config import ConfigManager

    return ConfigManager().parse_args(BASE + overrides)


def test_flash_attention_needs_what_it_names():
    """attention='flash' on a machine without a GPU (CI), or without flash-attn, is one config error."""
    import torch

    found = problems(BASE + ["--boost.attention", "flash"], 2)
    if not torch.cuda.is_available():
        assert any("attention='flash' needs a CUDA GPU" in p for p in found), found
    else:
        assert found == [] or any("no flash-attn kernel can be loaded" in p for p in found), found


def test_tp_strategy_takes_its_choices_from_the_registry(tmp_path, capsys):
    """``[boost] tp_strategy`` is typed by the library's registry: the command line refuses another name
    with the registered ones; a TOML value (which the parser does not check) stops in the preflight."""
    import typing
    from pathlib import Path

    from torchtitan.config import ConfigManager

    from boost_titan.parallel import STRATEGIES
    from torchtitan_ext.cola_llama.job_config import Boost

    assert typing.get_args(typing.get_type_hints(Boost)["tp_strategy"]) == tuple(STRATEGIES)
    with pytest.raises(SystemExit):
        ConfigManager().parse_args(BASE + ["--boost.tp_strategy", "nope"])
    assert "Expected one of" in capsys.readouterr().err
    toml = Path("train_configs/debug_cpu.toml").read_text()
    assert 'tp_strategy = "btp"' in toml
    bad = tmp_path / "bad.toml"
    bad.write_text(toml.replace('tp_strategy = "btp"', 'tp_strategy = "nope"'))
    with pytest.warns(UserWarning):  # tyro's: the TOML default is not one of the Literal's values
        found = problems(["--job.config_file", str(bad)], 2)
    assert found == [f"tp_strategy='nope' is unknown; choose one of {tuple(STRATEGIES)}"]
