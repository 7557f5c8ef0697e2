"""The per-step curve of fine-tuning all-MiniLM-L6-v2 on MRPC, from the outputs of the commands in
docs/tracking.md ("Tracking any series"): `analysis.track`'s track.csv and
`analysis.finetune_effect`'s attention_similarity.csv.

    python docs/tracking_minilm_mrpc.py TRACK_OUT EFFECT_OUT OUT_DIR

writes OUT_DIR/minilm_mrpc_curve.csv (per step: mean [CLS] and syntactic β over the heads of each
layer group, and the mean per-layer attention cosine to the pre-trained model) and the figure
OUT_DIR/minilm_mrpc_curve.png.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from analysis.heads.summary import layer_groups

ROLES = ("cls", "syntactic")


def curve(track: pd.DataFrame, similarity: pd.DataFrame) -> pd.DataFrame:
    n_layers = int(track["layer"].max()) + 1
    columns = {}
    for role in ROLES:
        rows = track[track["role"] == role]
        for name, layers in layer_groups(n_layers):
            part = rows[rows["layer"].isin(layers)]
            columns[f"{role}_beta_{name}"] = part.groupby("step")["mean"].mean()
    # finetune_effect labels a step folder `<run>@<step>`.
    steps = similarity["post_ckpt"].str.rpartition("@")[2].astype(int)
    cosine = similarity.assign(step=steps).groupby(["step", "layer"])["cosine"].mean().unstack("layer")
    for layer in cosine.columns:
        columns[f"cosine_layer{layer}"] = cosine[layer]
    return pd.DataFrame(columns).rename_axis("step").reset_index()


def plot(table: pd.DataFrame, path: Path) -> None:
    fig = Figure(figsize=(11, 3.8), layout="constrained")
    beta, cosine = fig.subplots(1, 2)
    for role, style in zip(ROLES, ("-", "--"), strict=True):
        columns = [c for c in table.columns if c.startswith(f"{role}_beta_")]
        for colour, column in enumerate(columns):
            beta.plot(table["step"], table[column], style, color=f"C{colour}", marker="o", markersize=3,
                      label=f"{role} β, {column.rsplit('_', 1)[1]} layers")  # fmt: skip
    beta.set_yscale("log")
    beta.set_ylabel("mean β over the group's heads")
    beta.set_title("[CLS] and syntactic β during fine-tuning (step 0: pre-trained)", fontsize=9)
    for column in [c for c in table.columns if c.startswith("cosine_")]:
        rows = table[["step", column]].dropna()
        cosine.plot(rows["step"], rows[column], marker="o", markersize=3, label=column.replace("cosine_", ""))
    cosine.set_ylabel("mean attention cosine to the pre-trained model")
    cosine.set_title("per-layer attention similarity to step 0", fontsize=9)
    for ax in (beta, cosine):
        # symlog keeps step 0 (the pre-trained model) on the otherwise logarithmic axis.
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlim(left=0)
        ax.set_xlabel("fine-tuning step")
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=150)


def main(argv: list[str]) -> None:
    track_out, effect_out, out = (Path(a) for a in argv)
    table = curve(pd.read_csv(track_out / "track.csv"), pd.read_csv(effect_out / "attention_similarity.csv"))
    out.mkdir(parents=True, exist_ok=True)
    table.round(4).to_csv(out / "minilm_mrpc_curve.csv", index=False)
    plot(table, out / "minilm_mrpc_curve.png")
    print(table.round(3).to_string(index=False))


if __name__ == "__main__":
    main(sys.argv[1:])
