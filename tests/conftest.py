import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `import boost_titan` without installing the package


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: runs torchtitan's training loop in subprocesses (slower)")
