"""Near-duplicate text measured by BLEU: R-Zero's repetition penalty and the pool's diversity.

Two texts cluster when their symmetric sentence BLEU (whitespace tokens) reaches a threshold;
clusters are single-linkage. A text's penalty is ``weight * |its cluster| / N`` over the batch
(Huang et al. 2025's r_rep); diversity is 1 - the mean pairwise similarity (self-BLEU).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np


def bleu(hyp: list[str], ref: list[str], max_n: int = 4) -> float:
    """Sentence BLEU of ``hyp`` against one reference: clipped n-gram precisions (n <= 4,
    add-one smoothing for n > 1) geometric mean, times the brevity penalty."""
    if not hyp or not ref:
        return 0.0
    logs = []
    for n in range(1, max_n + 1):
        h = Counter(tuple(hyp[i : i + n]) for i in range(len(hyp) - n + 1))
        r = Counter(tuple(ref[i : i + n]) for i in range(len(ref) - n + 1))
        match, total = sum(min(c, r[g]) for g, c in h.items()), max(sum(h.values()), 0)
        if n > 1:
            match, total = match + 1, total + 1
        if match == 0 or total == 0:
            return 0.0
        logs.append(math.log(match / total))
    bp = 1.0 if len(hyp) >= len(ref) else math.exp(1 - len(ref) / len(hyp))
    return bp * math.exp(sum(logs) / max_n)


def similarity(a: str, b: str) -> float:
    """Symmetric BLEU of two texts (mean of both directions, whitespace tokens)."""
    ta, tb = a.split(), b.split()
    return 0.5 * (bleu(ta, tb) + bleu(tb, ta))


def repetition_clusters(texts: list[str], threshold: float) -> list[int]:
    """Cluster id per text: single-linkage over pairs with similarity >= threshold."""
    parent = list(range(len(texts)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(texts)):
        for j in range(i + 1, len(texts)):
            if root(i) != root(j) and similarity(texts[i], texts[j]) >= threshold:
                parent[root(j)] = root(i)
    return [root(i) for i in range(len(texts))]


def repetition_penalty(texts: list[str], threshold: float, weight: float) -> np.ndarray:
    """R-Zero's r_rep: weight * |cluster of i| / N over the batch's texts."""
    if not texts:
        return np.zeros(0)
    ids = repetition_clusters(texts, threshold)
    size = Counter(ids)
    return np.array([weight * size[c] / len(texts) for c in ids])


def diversity(texts: list[str]) -> float:
    """1 - mean pairwise similarity (self-BLEU) of the questions; 1 for fewer than two."""
    pairs = [(i, j) for i in range(len(texts)) for j in range(i + 1, len(texts))]
    if not pairs:
        return 1.0
    return 1.0 - float(np.mean([similarity(texts[i], texts[j]) for i, j in pairs]))
