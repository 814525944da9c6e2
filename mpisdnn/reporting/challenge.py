"""The Graph Challenge table: one row per configuration N x L with where its network, inputs
and truth came from, its timings and rate, and the published rates beside it
(:mod:`.published`); as Markdown, as a JSON document and as a figure."""

from __future__ import annotations

import os

from .published import ENTRIES, SOURCES, published_rates
from .schema import SCHEMA, write_json

__all__ = ["challenge_markdown", "challenge_document", "write_challenge"]


def _f(x, fmt) -> str:
    return "–" if x is None else format(x, fmt)


def challenge_markdown(rows: list, meta: dict | None = None) -> str:
    """The table (Markdown), with a note on what each column measures."""
    head = (
        "| N | L | network | inputs | check | inputs read s | part 1 s | part 2 s | wall s "
        "| TE/s | "
        + " | ".join(f"{who} TE/s" for who in ENTRIES)
        + " | categories | distinct | peak RSS GiB/rank | result |"
    )
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        pub = published_rates(r["n"], r["l"])
        anchors = " | ".join(_f(pub[who], ".3g") for who in ENTRIES)
        if r["status"] not in ("PASS", "FAIL"):
            msg = str(r.get("error", "")).replace("|", "/")[:120]
            out.append(f"| {r['n']} | {r['l']} | | | {msg} | | | | | | {anchors} | | | | "
                       f"**{r['status']}** |")  # fmt: skip
            continue
        check = r["check"] + ("" if r["check"] == "official truth" else f", {r['checked_rows']:,}")
        peak = max(r.get("peak_rss_bytes") or [0]) / 2**30
        out.append(
            f"| {r['n']} | {r['l']} | {r['network_origin']} | {r['inputs_origin']} | {check} "
            f"| {r['inputs_read_s']:.2f} | {r['part1_s']:.3f} | {r['part2_s']:.4f} "
            f"| {r['config_wall_s']:.1f} | {r['rate'] / 1e12:.3f} | {anchors} "
            f"| {r['categories']:,} "
            f"| {_f(r.get('distinct'), ',')} | {peak:.2f} | **{r['status']}** |"
        )
    meta = meta or {}
    notes = [
        "",
        f"{meta.get('ranks', '?')} ranks, backend {meta.get('backend', '?')}; "
        "TE/s = inputs x edges / (part 1 + part 2), 10^12 edges/s; inputs read once per N "
        "from the TSV (official, or generated in the official format); network: official "
        "(converted once) or generated (seeded RadiX-Net); check: the official truth where "
        "network and inputs are official, else the scipy reference on every row or on "
        "sampled rows (claimed categories and others); inputs read = the TSV read of the "
        "configuration's N (shared by its rows); wall = the configuration from its network load "
        "to its check (the inputs read not included); peak RSS = per rank, reset per "
        "configuration.",
        "Published (GPU, 60,000 inputs, not exact): "
        + "; ".join(f"{who}: {src}" for who, src in SOURCES.items())
        + ". – = not published or not transcribed.",
    ]
    if meta.get("wall_seconds") is not None:
        notes.append(f"The sitting: {meta['wall_seconds']:.1f} s of wall (start-up "
                     f"{meta.get('startup_seconds', 0.0):.2f} s), conversions and generation "
                     "of missing files included.")  # fmt: skip
    if meta.get("load_average"):
        notes.append(f"Load average during the sitting: {meta['load_average']}.")
    return "\n".join(out + notes) + "\n"


def challenge_document(rows: list, meta: dict) -> dict:
    """The JSON document of a sitting: ``schema``, ``kind: challenge``, ``run``, ``rows``
    (each with its published rates)."""
    out = []
    for r in rows:
        r = dict(r)
        r["published_te_per_s"] = published_rates(r["n"], r["l"])
        out.append(r)
    return {"schema": SCHEMA, "kind": "challenge", "run": meta, "rows": out,
            "published_sources": SOURCES}  # fmt: skip


def write_challenge(out_dir, rows: list, meta: dict) -> dict:
    """Write ``challenge.md``, ``challenge.json`` and (with matplotlib) ``challenge.png``
    into ``out_dir``; the paths written."""
    from ..formats._atomic import atomic_path

    md = challenge_markdown(rows, meta)
    paths = {"markdown": os.path.join(out_dir, "challenge.md"),
             "json": os.path.join(out_dir, "challenge.json")}  # fmt: skip
    with atomic_path(paths["markdown"]) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(md)
    write_json(paths["json"], challenge_document(rows, meta))
    from .plots import plot_challenge

    fig = plot_challenge(rows, os.path.join(out_dir, "challenge.png"))
    if fig:
        paths["figure"] = fig
    paths["table"] = md
    return paths
