"""The published rates of the fastest Graph Challenge entries, per configuration.

TE/s = 60,000 inputs x N x 32 x L edges / seconds, for 60,000 inputs as the challenge
gives them. None of these entries is exact as mpisdnn is (they compile ``+=`` to FMA, and
SNICIT drops small residues); all are GPU timings of the layer loop without reading files.

Sources:

- **SNICIT** (Jiang, Huang, Yu, ICPP 2023, doi:10.1145/3605573.3605625), Table 3: one RTX
  A6000, kernel time.
- **XY-2021** (the 2021 champion), as measured in the SNICIT paper, same GPU and timing.
- **2020 champion** (Hidayetoglu et al., HPEC 2020, arXiv:2007.14152): one A100, compute
  only (for 65536 x 1920, 31.3 s compute and 45.5 s more reading the files); the
  configurations it did not report are the PNNL re-runs cited by issue 38.

Only the six configurations issue 38's table transcribes are here; the other six are in the
same sources and are shown as "–" until someone copies them from the papers (never guessed).
"""

from __future__ import annotations

__all__ = ["ENTRIES", "PUBLISHED", "SOURCES", "published_rates"]

#: The entries, in the order tables show them.
ENTRIES = ("2020 champion", "XY-2021", "SNICIT")

#: Where each entry's figures come from (one line each, for table notes).
SOURCES = {
    "2020 champion": "Hidayetoglu et al., HPEC 2020 (arXiv:2007.14152), 1 A100, compute only",
    "XY-2021": "2021 champion, measured in SNICIT's Table 3, 1 RTX A6000, kernel time",
    "SNICIT": "Jiang, Huang, Yu, ICPP 2023 (doi:10.1145/3605573.3605625) Table 3, 1 RTX A6000",
}

#: (N, L) -> {entry: TE/s} (10^12 edges per second), as published.
PUBLISHED = {
    (1024, 120): {"2020 champion": 13.1, "XY-2021": 15.8, "SNICIT": 17.6},
    (1024, 1920): {"2020 champion": 16.8, "XY-2021": 26.4, "SNICIT": 52.1},
    (4096, 1920): {"XY-2021": 48.3, "SNICIT": 169.0},
    (16384, 1920): {"2020 champion": 13.0, "XY-2021": 55.2, "SNICIT": 337.0},
    (65536, 120): {"2020 champion": 6.6, "XY-2021": 27.0, "SNICIT": 32.6},
    (65536, 1920): {"2020 champion": 7.7, "XY-2021": 55.6, "SNICIT": 351.0},
}


def published_rates(neurons: int, layers: int) -> dict:
    """``{entry: TE/s or None}`` for one configuration, every entry of :data:`ENTRIES`."""
    got = PUBLISHED.get((int(neurons), int(layers)), {})
    return {who: got.get(who) for who in ENTRIES}
