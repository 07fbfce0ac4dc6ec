"""benchmarks/gpu/parts.py: what a device call carries (tracked files present + untracked not ignored) and how many
GGUF parts fit beside it; and slim.sh moving the committed drafters aside and back (on a scratch repository)."""

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def parts_module():
    spec = importlib.util.spec_from_file_location("gpu_parts", ROOT / "benchmarks" / "gpu" / "parts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "t@t")
    git(tmp_path, "config", "user.name", "t")
    return tmp_path


def test_parts_arithmetic():
    parts = parts_module()
    mib = 1024 * 1024
    # the Gemma-3 GGUF (253,113,024 bytes) beside a 13.8 MB slim tree: 64 MiB - tree - 8 MB = 45.3 MB per part
    free = 64 * mib - 13_827_775 - 8_000_000
    assert parts.parts_needed(253_113_024, 13_827_775) == 6 == -(-253_113_024 // free)
    assert 253_113_024 / 6 <= free < 253_113_024 / 5  # 6 parts fit, 5 would not
    # a part is exactly the free room: one call each
    assert parts.parts_needed(3 * 10_000_000, 64 * mib - 8_000_000 - 10_000_000) == 3
    assert parts.parts_needed(3 * 10_000_000 + 1, 64 * mib - 8_000_000 - 10_000_000) == 4
    with pytest.raises(ValueError, match="slim.sh out"):
        parts.parts_needed(253_113_024, 64 * mib - 1_000_000)


def test_carried_bytes_counts_present_tracked_and_unignored_files(repo):
    parts = parts_module()
    (repo / ".gitignore").write_text("/ignored/\n")
    (repo / "a.txt").write_bytes(b"x" * 1000)
    (repo / "gone.txt").write_bytes(b"x" * 5000)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "init")
    (repo / "gone.txt").unlink()  # tracked but moved away: not carried
    (repo / "new.txt").write_bytes(b"y" * 300)  # untracked, not ignored: carried
    (repo / "ignored").mkdir()
    (repo / "ignored" / "big").write_bytes(b"z" * 10_000)  # ignored: carried only when named in carry
    assert parts.carried_bytes(repo) == 1000 + 300 + len("/ignored/\n")


def test_slim_moves_the_drafters_aside_and_back(repo):
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    (repo / "benchmarks" / "gpu").mkdir(parents=True)
    for name in ("slim.sh", "parts.py"):
        shutil.copy(ROOT / "benchmarks" / "gpu" / name, repo / "benchmarks" / "gpu" / name)
    (repo / ".gitignore").write_text("/.gpu/\n")
    for d in ("smollm2-135m-dflash", "gemma3-270m-dflash"):
        (repo / "fold_hf" / "assets" / d).mkdir(parents=True)
        (repo / "fold_hf" / "assets" / d / "model.safetensors").write_bytes(b"w" * 2000)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "init")

    def slim(*args):
        return subprocess.run(["bash", "benchmarks/gpu/slim.sh", *args], cwd=repo, capture_output=True, text=True)

    full = parts_module().carried_bytes(repo)
    out = slim("out")
    assert out.returncode == 0, out.stderr
    assert not (repo / "fold_hf" / "assets" / "gemma3-270m-dflash").exists()
    assert (repo / ".gpu" / "aside" / "gemma3-270m-dflash" / "model.safetensors").is_file()
    assert f"carries {full - 4000} bytes" in out.stdout
    assert slim("out").returncode == 0  # idempotent
    git(repo, "add", "-A")  # a habitual `git add -A` while the drafters are aside stages no deletion
    staged = subprocess.run(["git", "-C", str(repo), "diff", "--cached", "--name-only"], capture_output=True, text=True)
    assert staged.stdout == ""
    keep = slim("out", "gemma3-270m-dflash")
    assert keep.returncode == 0 and "gemma3-270m-dflash: tree" in keep.stdout and "smollm2-135m-dflash: aside" in keep.stdout
    (repo / "fold_hf" / "assets" / "gemma3-270m-dflash" / "model.safetensors").write_bytes(b"changed")
    refused = slim("out")
    assert refused.returncode == 1 and "uncommitted changes" in refused.stderr
    assert (repo / "fold_hf" / "assets" / "gemma3-270m-dflash").is_dir()  # nothing moved
    git(repo, "checkout", "--", "fold_hf/assets/gemma3-270m-dflash")
    assert slim("restore").returncode == 0 and slim("restore").returncode == 0
    status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], capture_output=True, text=True).stdout
    assert status == "" and not any((repo / ".gpu" / "aside").iterdir())
