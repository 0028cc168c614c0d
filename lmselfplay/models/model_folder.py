"""Is a local model folder loadable? Checked in milliseconds, before anything loads it.

:func:`check_model_folder` reads what ``from_pretrained`` would trip on later, often with a
traceback or a misleading hint (install sentencepiece), and names the file instead:

* the path is a folder (not a file);
* ``config.json`` (or a PEFT adapter's ``adapter_config.json``) is there and is a JSON mapping;
* the weights are there, and each ``*.safetensors`` file is as long as its own header says
  (a cut download or copy is caught here, not half-way through loading); a sharded model's
  index names shards that exist; a ``pytorch_model.bin`` in torch's zip format is a complete archive;
* a tokenizer is there (``tokenizer.json``, ``tokenizer.model``, ``vocab.json`` or
  ``vocab.txt``), and its JSON files parse.

Every problem is a :class:`~lmselfplay.utils.errors.UserError` naming the file and what is
wrong with it. Only the headers are read, never the weights themselves.
"""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path
from typing import Any

from lmselfplay.utils.errors import UserError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
JSON_FILES = ("config.json", "adapter_config.json", "tokenizer.json", "tokenizer_config.json",
              "generation_config.json", "special_tokens_map.json", "model.safetensors.index.json")
MAX_SAFETENSORS_HEADER = 100 << 20  # safetensors' own limit on its JSON header


class ModelFolderError(UserError):
    """A local model folder that cannot be loaded; the message names the file."""


def check_model_folder(path: str | Path, field: str = "model_name_or_path") -> None:
    """ModelFolderError for the first problem of the folder ``path`` (see the module doc);
    ``field`` is the flag the path came from, named in the message."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise ModelFolderError(f"{field} {str(path)!r} is a file, not a model folder "
                               "(give the folder save_pretrained wrote)")
    names = {p.name for p in path.iterdir()}
    for name in JSON_FILES:
        if name in names:
            _read_json(path / name)
    if "config.json" not in names and "adapter_config.json" not in names:
        raise ModelFolderError(f"{field} {str(path)!r} has no config.json: not a model folder saved with "
                               "save_pretrained")
    if "config.json" in names:
        _check_weights(path, names)
    if not any(n in names for n in TOKENIZER_FILES):
        raise ModelFolderError(f"{field} {str(path)!r} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}): "
                               "save the tokenizer into the folder (tokenizer.save_pretrained)")


def _read_json(file: Path) -> Any:
    try:
        data = json.loads(file.read_bytes())
    except OSError as e:
        raise ModelFolderError(f"cannot read {file}: {e.strerror or e}") from None
    except (ValueError, RecursionError) as e:
        raise ModelFolderError(f"{file} is damaged: not valid JSON ({' '.join(str(e).split())[:120]})") from None
    if not isinstance(data, dict):
        raise ModelFolderError(f"{file} is damaged: it holds a {type(data).__name__}, not a JSON object")
    return data


def _check_weights(path: Path, names: set[str]) -> None:
    shards = sorted(n for n in names if n.endswith(".safetensors"))
    if "model.safetensors.index.json" in names:
        index = _read_json(path / "model.safetensors.index.json")
        wanted = index.get("weight_map")
        if not isinstance(wanted, dict):
            raise ModelFolderError(f"{path / 'model.safetensors.index.json'} is damaged: no weight_map")
        missing = sorted({str(v) for v in wanted.values()} - names)
        if missing:
            raise ModelFolderError(f"{path} is missing weight shard(s) its index names: {', '.join(missing[:3])}")
    for name in shards:
        check_safetensors(path / name)
    bins = sorted(n for n in names if n.startswith("pytorch_model") and n.endswith(".bin"))
    for name in bins:  # torch's zip format (a legacy pickle, not a zip, is left to torch.load)
        with (path / name).open("rb") as f:
            is_zip = f.read(4) == b"PK\x03\x04"
        if is_zip and not zipfile.is_zipfile(path / name):
            raise ModelFolderError(f"{path / name} is damaged: not a complete torch archive (truncated?)")
    if not shards and not bins:
        raise ModelFolderError(f"{path} has no weights (no *.safetensors or pytorch_model.bin)")


def check_safetensors(file: Path) -> None:
    """ModelFolderError when ``file``'s length is not what its header declares (cut) or its
    header is not safetensors' (8-byte length, then a JSON object of tensors' offsets)."""
    size = file.stat().st_size
    with file.open("rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < n <= min(MAX_SAFETENSORS_HEADER, size - 8):
            raise ModelFolderError(f"{file} is damaged: not a safetensors file ({size} bytes; truncated?)")
        try:
            header = json.loads(f.read(n))
        except (ValueError, RecursionError):
            header = None
    if not isinstance(header, dict):
        raise ModelFolderError(f"{file} is damaged: its safetensors header is not readable (truncated?)")
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)
            and isinstance(v.get("data_offsets"), list) and len(v["data_offsets"]) == 2]
    expected = 8 + n + max(ends, default=0)
    if len(ends) != len([k for k in header if k != "__metadata__"]) or expected != size:
        raise ModelFolderError(f"{file} is damaged: {size} bytes where its header declares {expected} (truncated "
                               "or changed; copy or download it again)")
