"""The folders games/, verifiers/, eval/ install as lmselfplay.games / .verifiers / .eval —
in a wheel and in an editable install — and nothing installs as a top-level `verifiers`."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_and_fresh_venv_install(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path)], check=True)
    (whl,) = tmp_path.glob("lmselfplay-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    for must in ("lmselfplay/games/nim.py", "lmselfplay/games/data/taboo_words_train.txt",
                 "lmselfplay/verifiers/executor.py", "lmselfplay/eval/game_metrics.py", "lmselfplay/eval/suites/default.yaml",
                 "lmselfplay/lm/engines/hf.py", "lmselfplay/alphazero/mcts.py"):
        assert must in names, must
    tops = {n.split("/")[0] for n in names if not n.startswith("lmselfplay-")}
    assert tops == {"lmselfplay"}, tops
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(whl)], check=True)
    out = subprocess.run([str(py), "-c", "import lmselfplay.games as g, lmselfplay.verifiers, lmselfplay.eval;"
                          "print(g.__file__)"], check=True, capture_output=True, text=True, cwd=tmp_path)
    assert str(venv) in out.stdout


def test_editable_install_maps_the_folders():
    import lmselfplay.eval
    import lmselfplay.games
    import lmselfplay.verifiers

    assert Path(lmselfplay.games.__file__).parent == ROOT / "games"
    assert Path(lmselfplay.verifiers.__file__).parent == ROOT / "verifiers"
    assert Path(lmselfplay.eval.__file__).parent == ROOT / "eval"


def test_torch_requirement_admits_current_gpu_builds_and_setup_pins_the_cpu_wheel():
    """Installing the project into a GPU environment keeps its torch (no upper pin); .ci/setup
    installs this workplace's CPU wheel first and names it again in the project's own pip call,
    so that pip never resolves the open range to a newer CUDA build."""
    import tomllib
    from packaging.requirements import Requirement

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (torch_req,) = [Requirement(d) for d in deps if Requirement(d).name == "torch"]
    for version in ("2.4.0", "2.11.0", "2.13.0+cpu", "2.14.1", "2.15.0+cu130"):
        assert torch_req.specifier.contains(version), (str(torch_req), version)
    pip_lines = [ln.strip() for ln in (ROOT / ".ci" / "setup").read_text().splitlines()
                 if '"${PIP[@]}"' in ln and not ln.strip().startswith("#")]
    assert 'TORCH="torch==2.13.0"' in (ROOT / ".ci" / "setup").read_text()
    project = next(i for i, ln in enumerate(pip_lines) if '-e ".$EXTRAS"' in ln)
    assert any(ln.endswith('"$TORCH"') for ln in pip_lines[:project]), pip_lines
    assert all('"$TORCH"' in ln for ln in pip_lines[project:]), pip_lines


def test_setup_offers_the_recipes_only_and_refuses_an_unknown_part():
    """``bash .ci/setup run`` (README command 1) installs the project without its [dev] extra and
    stops before DeepSpeed; an unknown argument is one line, status 2, before anything is installed."""
    import subprocess

    text = (ROOT / ".ci" / "setup").read_text()
    assert 'run) EXTRAS="" ;;' in text and 'all) EXTRAS="[dev]" ;;' in text
    assert text.index('if [ -z "$EXTRAS" ]') < text.index("deepspeed")
    p = subprocess.run(["bash", str(ROOT / ".ci" / "setup"), "everything"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and p.stderr.startswith("error: unknown set-up 'everything'"), p.stderr
