"""The embedded model's default build ships in the package: used only for its own key.

Fast: the shipped copy is intact and is the default key's build (else re-run
``scripts/ship_embedded_model.py``); ``ensure_tiny_model`` installs it into an empty cache
without building, file for file; a config with another key builds and never reads it.
Slow: a fresh build reproduces the shipped files bit for bit (with the build's own thread count).
"""

from __future__ import annotations

import json

import pytest
import torch

from lmselfplay.models import cache as tiny_cache
from lmselfplay.models import pretrain, tiny
from lmselfplay.models.cache import SHIPPED_BUILDS, shipped_build, shipped_dir
from lmselfplay.utils.checkpoint import MARKER, sha256_file, verify_checkpoint

FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def test_shipped_build_is_the_default_keys_and_intact():
    shipped = tiny_cache.EMBEDDED_DIR
    assert verify_checkpoint(shipped) is None and '"files"' in (shipped / MARKER).read_text()
    key = json.loads((shipped / tiny.INFO_FILE).read_text())["key"]
    assert key == tiny.build_config().key(), "stale shipped build: run python scripts/ship_embedded_model.py"
    assert sum(p.stat().st_size for p in shipped.iterdir()) < 10e6


def test_matching_key_installs_the_shipped_build_without_building(tmp_path, monkeypatch):
    def no_build(*a, **kw):
        raise AssertionError("built although the shipped build matches")

    monkeypatch.setattr(tiny_cache, "build_tiny_model", no_build)
    path = tiny_cache.ensure_tiny_model(cache_dir=tmp_path, progress=False)
    assert path == tmp_path / f"tiny-{tiny.build_config().key()}" and verify_checkpoint(path) is None
    for name in (*FILES, tiny.INFO_FILE):
        assert sha256_file(path / name) == sha256_file(tiny_cache.EMBEDDED_DIR / name), name
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_other_key_builds_and_ignores_the_shipped_build(tmp_path, monkeypatch):
    cfg = tiny.build_config(train_steps=7)  # another corpus/config -> another key
    assert cfg.key() != tiny.build_config().key() and tiny_cache.shipped_build(cfg) is None
    built = []

    def fake_build(c, out, progress=True, **kw):
        built.append(c.key())
        (out / "config.json").write_text("{}")
        (out / tiny.INFO_FILE).write_text(json.dumps({"key": c.key()}))

    monkeypatch.setattr(tiny_cache, "build_tiny_model", fake_build)
    path = tiny_cache.ensure_tiny_model(cfg=cfg, cache_dir=tmp_path, progress=False)
    assert built == [cfg.key()] and not (path / "model.safetensors").exists()


def test_a_damaged_shipped_copy_is_not_used(tmp_path):
    fake = tmp_path / "embedded"
    fake.mkdir()
    for name in (*FILES, tiny.INFO_FILE, MARKER):
        (fake / name).write_bytes((tiny_cache.EMBEDDED_DIR / name).read_bytes())
    assert tiny_cache.shipped_build(tiny.build_config(), fake) == fake
    (fake / "tokenizer.json").write_text("{}")
    assert tiny_cache.shipped_build(tiny.build_config(), fake) is None


@pytest.mark.slow
@pytest.mark.timeout(3600)  # v7 builds in ~18 min with its 1 thread
def test_a_rebuild_reproduces_the_shipped_files_bit_for_bit(tmp_path):
    from safetensors.torch import load_file

    pretrain.build_tiny_model(tiny.build_config(), tmp_path, progress=False)
    a, b = load_file(tmp_path / "model.safetensors"), load_file(tiny_cache.EMBEDDED_DIR / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (tiny_cache.EMBEDDED_DIR / name).read_bytes(), name
    info = json.loads((tmp_path / tiny.INFO_FILE).read_text())
    assert info["key"] == tiny.build_config().key()


@pytest.mark.parametrize("build", SHIPPED_BUILDS)
def test_every_other_shipped_build_is_its_keys_and_intact(build):
    folder = shipped_dir(build)
    assert verify_checkpoint(folder) is None, f"run python scripts/ship_embedded_model.py --build {build}"
    assert json.loads((folder / tiny.INFO_FILE).read_text())["key"] == tiny.build_config(build).key()
    assert shipped_build(tiny.build_config(build)) == folder
